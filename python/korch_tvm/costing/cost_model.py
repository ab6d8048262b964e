"""Predict kernel latency without measuring it, and prune candidates that cannot pay off.

MetaSchedule's own XGBModel ranks schedules *within* one task (its labels are per-workload
`min_cost / cost`), so it cannot say whether kernel A is slower than kernel B. Korch needs exactly
that, so this is a separate XGBoost regressor on log-latency *across* kernels, trained on the best
times in the tuning log. Where no model can be trained, `analytic_estimate` is a roofline guess.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm

from ..backend.target import host_core_count, parse_target
from ..errors import KorchError
from ..kernels.fused import kernel_blocks, kernel_flops, written_params
from ..support.memo import KeyedMemo
from ..support.tir_blocks import is_reduction
from .metaschedule_setup import prepare_for_target
from .prediction_cache import PredictionCache, file_digest

FORMAT_VERSION = 1
MIN_TRAINING_KERNELS = 8  # fewer distinct kernels than this: the analytic estimate is better
STORE_FEATURES = 164  # PerStoreFeature's row width in TVM 0.27
FEATURE_BATCH = 256  # kernels per extraction call: batched for speed, bounded for memory
KERNEL_FEATURE_NAMES = (
    "log2_bytes_in", "log2_bytes_out", "log2_flops", "blocks", "reduction_blocks", "params",
    "log2_analytic_seconds",
)

# Roofline constants for `analytic_estimate`, deliberately round numbers: the estimate only has
# to rank kernels sensibly when nothing has been measured. CPU: DRAM bandwidth a couple of cores
# can draw on a server part, and per-core fp32 throughput of tuned AVX2/AVX-512 loops (well below
# the FMA peak). GPU: H100/H200-class HBM bandwidth and fp32 (non-tensor-core) peak. A launch
# overhead per kernel is added: it is what fusion saves, so leaving it out would make any split
# look free.
CPU_BANDWIDTH_BYTES_PER_SECOND = 20e9
CPU_FLOPS_PER_CORE = 25e9
CPU_LAUNCH_SECONDS = 2e-6
GPU_BANDWIDTH_BYTES_PER_SECOND = 3e12
GPU_FLOPS = 5e13
GPU_LAUNCH_SECONDS = 5e-6


@dataclass(frozen=True)
class CostSample:
    """A kernel and its measured latency; `record` (optional) is the schedule that achieved it."""

    kernel: tvm.IRModule
    seconds: float
    record: object | None = None  # ms.database.TuningRecord


@dataclass(frozen=True)
class KernelShape:
    """Schedule-independent facts about a kernel, read from its PrimFunc."""

    bytes_in: int
    bytes_out: int
    flops: float
    blocks: int
    reduction_blocks: int
    params: int
    # 2 x the iterations of the reduction blocks: the multiply-adds of a conv or matmul, what
    # a FLOP peak is stated in. `flops` also counts every min/max/floor of elementwise math
    # (a fast exp is ~40), which makes an activation look faster than the FMA peak.
    reduction_flops: float = 0.0


def kernel_shape(kernel_mod: tvm.IRModule) -> KernelShape:
    """Bytes in/out (params read / written by some block), FLOPs and block counts."""
    func = kernel_mod["main"]
    blocks = kernel_blocks(kernel_mod)
    bytes_in = bytes_out = 0
    for param, written in zip(func.params, written_params(kernel_mod, blocks)):
        size = math.prod(int(dim) for dim in param.shape) * tvm.DataType(str(param.dtype)).bits // 8
        if written:
            bytes_out += size
        else:
            bytes_in += size
    reducing = [block for block in blocks if is_reduction(block)]
    reduction_flops = sum(2.0 * math.prod(int(iv.dom.extent) for iv in block.iter_vars)
                          for block in reducing)
    return KernelShape(bytes_in, bytes_out, kernel_flops(kernel_mod), len(blocks), len(reducing),
                       len(func.params), reduction_flops)


def analytic_estimate(kernel_mod: tvm.IRModule, target="llvm") -> float:
    """launch + max(bytes / bandwidth, flops / peak) with the module's roofline constants."""
    return _roofline_seconds(kernel_shape(kernel_mod), parse_target(target))


def _roofline_seconds(shape: KernelShape, target) -> float:
    moved = shape.bytes_in + shape.bytes_out
    if target.kind.name == "cuda":
        return GPU_LAUNCH_SECONDS + max(moved / GPU_BANDWIDTH_BYTES_PER_SECOND,
                                        shape.flops / GPU_FLOPS)
    cores = int(target.attrs.get("num-cores", 1))
    return CPU_LAUNCH_SECONDS + max(moved / CPU_BANDWIDTH_BYTES_PER_SECOND,
                                    shape.flops / (CPU_FLOPS_PER_CORE * cores))


def kernel_features(kernel_mod: tvm.IRModule, target, record=None) -> np.ndarray:
    """PerStoreFeature of a schedule (default: untuned), aggregated, plus whole-kernel facts."""
    return kernel_features_many([kernel_mod], target, [record])[0]


def kernel_features_many(kernel_mods: Sequence[tvm.IRModule], target,
                         records: Sequence | None = None) -> np.ndarray:
    """`kernel_features` of many kernels, one row each.

    One extraction call for all of them: MetaSchedule's extractor takes a batch and spreads it
    over threads, and a tuning context per kernel cost more than the features.
    """
    from tvm.s_tir import meta_schedule as ms

    target = parse_target(target)
    prepare_for_target(target)  # TuneContext would otherwise spend ~30 s importing GPU intrinsics
    records = list(records) if records is not None else [None] * len(kernel_mods)
    assert len(records) == len(kernel_mods), "one record (or None) per kernel"
    if not kernel_mods:
        return np.zeros((0, 2 * STORE_FEATURES + 1 + len(KERNEL_FEATURE_NAMES)), dtype="float32")
    context = ms.TuneContext(target=target, num_threads=host_core_count())
    extractor = ms.feature_extractor.PerStoreFeature()
    rows = []
    for start in range(0, len(kernel_mods), FEATURE_BATCH):
        batch = list(kernel_mods[start:start + FEATURE_BATCH])
        candidates = [record.as_measure_candidate() if record is not None else
                      ms.MeasureCandidate(tvm.s_tir.Schedule(mod),
                                          ms.arg_info.ArgInfo.from_prim_func(mod["main"]))
                      for mod, record in zip(batch, records[start:start + FEATURE_BATCH])]
        extracted = extractor.extract_from(context, candidates)
        rows += [_feature_row(mod, features.numpy(), target)
                 for mod, features in zip(batch, extracted)]
    return np.stack(rows).astype("float32")


def _feature_row(kernel_mod: tvm.IRModule, store_features: np.ndarray, target) -> np.ndarray:
    """Per-store rows summed and maxed, their count, then the whole-kernel facts."""
    stores = store_features.reshape(-1, STORE_FEATURES)
    if len(stores) == 0:
        stores = np.zeros((1, STORE_FEATURES))
    shape = kernel_shape(kernel_mod)
    whole = [math.log2(shape.bytes_in + 1), math.log2(shape.bytes_out + 1),
             math.log2(shape.flops + 1), shape.blocks, shape.reduction_blocks, shape.params,
             math.log2(_roofline_seconds(shape, target))]
    return np.concatenate([stores.sum(0), stores.max(0), [len(stores)], whole])


class CostModel:
    """XGBoost regressor: kernel features -> log(seconds of the best known schedule)."""

    def __init__(self, booster, target, *, trained_on: int, use_best_schedule: bool) -> None:
        self.booster = booster
        self.target = parse_target(target)
        self.trained_on = trained_on
        self.use_best_schedule = use_best_schedule

    @classmethod
    def train(cls, samples: Sequence[CostSample], target="llvm", *, rounds: int = 300,
              use_best_schedule: bool = False, seed: int = 0) -> CostModel:
        """Fit on samples with finite latency; failed kernels carry no timing information."""
        import xgboost as xgb

        usable = [s for s in samples if math.isfinite(s.seconds) and s.seconds > 0]
        if len(usable) < 2:
            raise KorchError(f"the cost model needs at least 2 measured kernels, got {len(usable)}")
        features = kernel_features_many(
            [s.kernel for s in usable], target,
            [s.record if use_best_schedule else None for s in usable])
        labels = np.log([s.seconds for s in usable])
        params = {"max_depth": 4, "eta": 0.1, "subsample": 0.9, "min_child_weight": 1,
                  "nthread": 2, "seed": seed, "objective": "reg:squarederror"}
        booster = xgb.train(params, xgb.DMatrix(features, label=labels), rounds)
        return cls(booster, target, trained_on=len(usable), use_best_schedule=use_best_schedule)

    @classmethod
    def from_tuning_log(cls, tuning_log, *, use_best_schedule: bool = False, **kwargs) -> CostModel:
        """Train on every kernel the log has a successful measurement for (label: best time).

        Features describe the *untuned* schedule by default, because predictions are made for
        kernels that have no record yet; `use_best_schedule=True` describes the best one instead.
        """
        samples = [
            CostSample(k.kernel, k.best_seconds,
                       tuning_log.best_record(k.kernel) if use_best_schedule else None)
            for k in tuning_log.kernels() if math.isfinite(k.best_seconds)
        ]
        return cls.train(samples, tuning_log.target, use_best_schedule=use_best_schedule, **kwargs)

    def predict(self, kernel_mod: tvm.IRModule) -> float:
        return self.predict_many([kernel_mod])[0]

    def predict_many(self, kernel_mods: Sequence[tvm.IRModule]) -> list[float]:
        import xgboost as xgb

        if not kernel_mods:
            return []
        features = kernel_features_many(kernel_mods, self.target)
        return [float(v) for v in np.exp(self.booster.predict(xgb.DMatrix(features)))]

    def save(self, path: str | os.PathLike) -> None:
        """xgboost's JSON model at `path` plus `path + ".meta.json"`; no pickle anywhere."""
        path = os.fspath(path)
        if not path.endswith(".json"):
            raise KorchError(f"cost model path '{path}' must end in .json (xgboost's JSON format)")
        self.booster.save_model(path)
        meta = {"format_version": FORMAT_VERSION, "target": str(self.target),
                "trained_on": self.trained_on, "use_best_schedule": self.use_best_schedule,
                "label": "natural log of seconds", "store_features": STORE_FEATURES,
                "kernel_features": list(KERNEL_FEATURE_NAMES)}
        with open(path + ".meta.json", "w") as file:
            json.dump(meta, file, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostModel:
        import xgboost as xgb

        path = os.fspath(path)
        try:
            with open(path + ".meta.json") as file:
                meta = json.load(file)
            booster = xgb.Booster(params={"nthread": 2})
            booster.load_model(path)
        except (OSError, ValueError, xgb.core.XGBoostError) as err:
            raise KorchError(f"cannot load cost model '{path}': {err}; retrain it") from None
        if meta.get("format_version") != FORMAT_VERSION or \
                meta.get("kernel_features") != list(KERNEL_FEATURE_NAMES):
            raise KorchError(f"cost model '{path}' was saved by another korch_tvm version; retrain it")
        return cls(booster, json.loads(meta["target"]), trained_on=meta["trained_on"],
                   use_best_schedule=meta["use_best_schedule"])


MODEL_FILE = "cost_model.json"


def model_path(tuning_log) -> str:
    """Where a log directory keeps its trained cost model."""
    return os.path.join(tuning_log.directory, MODEL_FILE)


def default_predictor(tuning_log, target) -> Callable[[tvm.IRModule], float]:
    """The log's saved cost model when it has one, else the analytic estimate.

    The model is never retrained during a compile: pruning decisions depend on its predictions,
    and a model that changed with every compile would change which kernels survive, so a second
    compile of the same model would have new kernels to measure. Retrain explicitly with
    `train_log_model` (`korch-tvm logs DIR --train`).
    """
    path = model_path(tuning_log)
    if os.path.exists(path):
        return CostModel.load(path).predict
    return lambda kernel_mod: analytic_estimate(kernel_mod, target)


def predict_kernels(tuning_log, target, modules: Mapping[str, tvm.IRModule],
                    estimates: KeyedMemo[float] | None = None) -> dict[str, float]:
    """`default_predictor`'s seconds for every kernel of `modules` (by key). The saved model's
    predictions are cached beside the log (costing/prediction_cache.py), so a warm compile reuses
    them; `estimates` keeps analytic estimates by (key, target) between calls (the costing
    session's `estimates`: a compile meets most kernels in each layout and region; None: kept
    for this call only)."""
    path = model_path(tuning_log)
    if not os.path.exists(path):
        estimates = KeyedMemo() if estimates is None else estimates
        return {key: _remembered_estimate(estimates, key, module, target)
                for key, module in modules.items()}
    cache = PredictionCache(tuning_log.directory, file_digest(path))
    return cache.predict_all(modules, CostModel.load(path).predict_many)


def _remembered_estimate(estimates: KeyedMemo[float], key: str, module: tvm.IRModule,
                         target) -> float:
    return estimates.get((key, str(target)), lambda: analytic_estimate(module, target))


def train_log_model(tuning_log, **kwargs) -> tuple[CostModel, dict]:
    """Train on every measured kernel of the log, save it beside the log; returns (model, stats).

    The stats are the model's Spearman rank correlation and median relative error on a held-out
    third of the kernels (the saved model is then trained on all of them).
    """
    samples = [CostSample(k.kernel, k.best_seconds) for k in tuning_log.kernels()
               if math.isfinite(k.best_seconds)]
    if len(samples) < MIN_TRAINING_KERNELS:
        raise KorchError(f"the log holds {len(samples)} measured kernels; at least "
                         f"{MIN_TRAINING_KERNELS} are needed to train a cost model")
    held_out = samples[::3]
    training = [s for i, s in enumerate(samples) if i % 3]
    stats = evaluate(CostModel.train(training, tuning_log.target, **kwargs), held_out)
    model = CostModel.train(samples, tuning_log.target, **kwargs)
    model.save(model_path(tuning_log))
    return model, stats


def evaluate(model, samples: Sequence[CostSample]) -> dict[str, float]:
    """Spearman rank correlation and median relative error of `model.predict` on samples."""
    from scipy.stats import spearmanr

    usable = [s for s in samples if math.isfinite(s.seconds)]
    predicted = np.array(model.predict_many([s.kernel for s in usable])
                         if hasattr(model, "predict_many") else
                         [model.predict(s.kernel) for s in usable])
    actual = np.array([s.seconds for s in usable])
    # A constant prediction ranks nothing: report no rank skill instead of scipy's nan + warning.
    ranked = len(usable) > 1 and np.ptp(predicted) > 0 and np.ptp(actual) > 0
    return {
        "count": len(usable),
        "spearman": float(spearmanr(predicted, actual).correlation) if ranked else 0.0,
        "median_relative_error": float(np.median(np.abs(predicted - actual) / actual)),
    }


def prune_candidates(node_sets: Sequence[frozenset[int]], predicted: Sequence[float],
                     margin: float) -> list[int]:
    """Indices of the candidates worth measuring.

    Rule: candidates are visited smallest first; a candidate C with two or more nodes is dropped
    when `predicted[C] / (1 + margin)` exceeds the cheapest cover of C's nodes by *kept* candidates
    that are strict subsets of C. Even if the model overrates C by the whole margin, some plan
    that runs those smaller kernels instead (recomputing overlaps, which orchestration allows)
    computes the same primitives for less. Restricting covers to kept candidates loses nothing,
    since a dropped one is itself beaten by a cover of kept ones. Single-node candidates are
    never dropped, so every primitive stays computable and a plan always exists.

    Only "safe-ish": the model may be wrong by more than the margin, and the cover's kernels,
    though each convex, can depend on each other in a cycle, which the orchestrator must cut.
    """
    assert len(node_sets) == len(predicted), "one prediction per candidate"
    assert margin >= 0, "the margin is a relative error, >= 0"
    bit = {node: position for position, node in enumerate(sorted(set().union(*node_sets)))}
    masks = [sum(1 << bit[node] for node in nodes) for nodes in node_sets]
    kept: list[int] = []
    for index in sorted(range(len(node_sets)), key=lambda i: (len(node_sets[i]), i)):
        mask = masks[index]
        if len(node_sets[index]) <= 1:
            kept.append(index)
            continue
        parts = [(masks[k], float(predicted[k])) for k in kept
                 if masks[k] != mask and masks[k] & ~mask == 0]
        cover = _cheapest_cover(mask, parts)
        if not float(predicted[index]) / (1.0 + margin) > cover:
            kept.append(index)
    return sorted(kept)


def _cheapest_cover(mask: int, parts: list[tuple[int, float]]) -> float:
    """Least total cost of parts whose union is `mask` (inf when none).

    Exact for small sets: always extend by a part containing the lowest uncovered node, which
    visits each useful partial cover once. Larger sets use the greedy cover, whose cost is an
    upper bound on the cheapest, so pruning against it is still sound, only less aggressive.
    """
    parts = [(m, c) for m, c in parts if math.isfinite(c)]
    if bin(mask).count("1") > 16:
        return _greedy_cover(mask, parts)
    memo: dict[int, float] = {}

    def best(covered: int) -> float:
        if covered == mask:
            return 0.0
        if covered in memo:
            return memo[covered]
        lowest = (mask & ~covered) & -(mask & ~covered)
        memo[covered] = min((cost + best(covered | part) for part, cost in parts
                             if part & lowest), default=math.inf)
        return memo[covered]

    return best(0)


def _greedy_cover(mask: int, parts: list[tuple[int, float]]) -> float:
    covered, total = 0, 0.0
    while covered != mask:
        useful = [(cost / bin(part & ~covered).count("1"), part, cost)
                  for part, cost in parts if part & ~covered]
        if not useful:
            return math.inf
        _, part, cost = min(useful)
        covered |= part
        total += cost
    return total
