"""Where logs live and how an empty log is seeded (log_seeds.py): same tag merged, a compatible
tag as predictions and starting points measured here, an incompatible one said so."""

import hashlib
import logging
import math
import shutil

import pytest

from conftest import REPO
from korch_tvm.backend.target import CPU_TAG_VARIABLE, parse_target
from korch_tvm.costing.log_seeds import (SEED_FILE, Seed, seed_log, seed_roots, tag_isa,
                                         target_isa, user_log_root)
from korch_tvm.costing.measure import profile_kernels, _default_schedules
from korch_tvm.costing.tuning_log import TuningLog
from test_measure import legalized_kernels, split_trace

SHIPPED = REPO / "tuning_logs"
SHIPPED_TAG = "llvm-znver4-2c"
ZNVER4 = parse_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})  # avx512 anywhere


def digest(directory) -> dict:
    """Every file of a directory and its SHA-256: what must not change in a seed root."""
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def small_log(root, target, tag=None):
    """A log of two kernels' default-schedule times (fixed numbers)."""
    log = TuningLog(root, target, tag=tag)
    for seconds, kernel in zip((4e-6, 2e-5), legalized_kernels(16).values()):
        log.commit_run(kernel, [seconds] * 3)
    return log


def test_logs_live_in_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("KORCH_TVM_CACHE_DIR", str(tmp_path / "c"))
    assert user_log_root() == str(tmp_path / "c" / "tuning_logs")
    monkeypatch.delenv("KORCH_TVM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert user_log_root() == str(tmp_path / "x" / "korch_tvm" / "tuning_logs")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_log_root() == str(tmp_path / "home" / ".cache" / "korch_tvm" / "tuning_logs")
    monkeypatch.setenv("KORCH_TVM_SEED_LOGS", "")
    assert seed_roots() == []
    monkeypatch.delenv("KORCH_TVM_SEED_LOGS")
    assert seed_roots() == [str(SHIPPED)]  # the repository's, found from the package


def test_the_cli_default_log_root_is_the_cache(monkeypatch, tmp_path):
    from korch_tvm.tools.cli import build_parser

    monkeypatch.setenv("KORCH_TVM_CACHE_DIR", str(tmp_path))
    args = build_parser().parse_args(["compile", "m.onnx"])
    assert args.tuning_logs == str(tmp_path / "tuning_logs")
    assert build_parser().parse_args(["compile", "m.onnx", "--tuning-logs", ""]).tuning_logs == ""


def test_vector_isa_of_tags_and_targets():
    assert tag_isa(SHIPPED_TAG) == "avx512" and target_isa(ZNVER4) == "avx512"
    assert tag_isa("llvm-haswell-2c") == "avx2" and tag_isa("llvm-nehalem-4c") == "sse"
    assert tag_isa("llvm-nosuchcpu-2c") == "unknown" and tag_isa("not a tag") == "unknown"
    assert tag_isa("cuda-sm_90") == tag_isa("cuda-sm_90a") == "sm_9x" != tag_isa("cuda-sm_80")


def test_a_seed_of_the_same_tag_is_merged_and_never_written(tmp_path, caplog):
    seeds = tmp_path / "seeds"
    shipped = small_log(seeds, ZNVER4)
    before = digest(seeds)
    local = TuningLog(tmp_path / "mine", ZNVER4)
    with caplog.at_level(logging.INFO, logger="korch_tvm.log_seeds"):
        assert seed_log(local, [str(seeds)]) is None  # nothing foreign: records as they are
    assert "seeded with the 2 records of 2 kernels logged for this CPU" in caplog.text
    for kernel in shipped.kernels():
        assert local.best_seconds(kernel.kernel) == kernel.best_seconds
    assert digest(seeds) == before
    assert seed_log(local, [str(seeds)]) is None and len(local.database) == 2  # not again


def test_an_incompatible_log_seeds_nothing_and_says_why(tmp_path, caplog):
    seeds = tmp_path / "seeds"
    small_log(seeds, ZNVER4, tag="llvm-haswell-2c")
    small_log(seeds, ZNVER4, tag="llvm-nosuchcpu-2c")
    local = TuningLog(tmp_path / "mine", ZNVER4)
    with caplog.at_level(logging.INFO, logger="korch_tvm.log_seeds"):
        assert seed_log(local, [str(seeds)]) is None
    assert len(local.database) == 0
    assert ("no compatible log seeds it: the logs found have ISA llvm-haswell-2c (avx2), "
            "llvm-nosuchcpu-2c (unknown), this target avx512") in caplog.text


def test_seed_predictions_are_calibrated_by_default_times_measured_in_both(tmp_path):
    kernels = list(legalized_kernels(16).values()) + list(legalized_kernels(24).values())
    seed_log_dir = TuningLog(tmp_path / "seed", ZNVER4, tag="llvm-haswell-2c")
    local = TuningLog(tmp_path / "mine", ZNVER4)
    for index, kernel in enumerate(kernels):
        seed_log_dir.commit_run(kernel, [1e-5 * (index + 1)] * 3)
        seed_log_dir.commit_run(kernel, [1e-6] * 3,  # a tuned time: no prediction of a default
                                trace=split_trace(kernel, 2))
    seed = Seed("llvm-haswell-2c", "avx2", seed_log_dir)
    keys = {f"k{i}": kernel for i, kernel in enumerate(kernels)}
    assert seed.predictions(keys, local) == pytest.approx(
        {f"k{i}": 1e-5 * (i + 1) for i in range(4)})  # nothing timed here yet: as logged
    for index, kernel in enumerate(kernels[:3]):
        local.commit_run(kernel, [2e-5 * (index + 1)] * 3)  # this machine is 2x slower
    assert seed.calibration(local) == pytest.approx(2.0)
    assert seed.predictions({"k3": kernels[3]}, local) == {"k3": pytest.approx(8e-5)}


@pytest.mark.skipif(target_isa(parse_target("llvm")) != tag_isa(SHIPPED_TAG),
                    reason="this CPU's vector ISA is not the shipped log's")
def test_the_shipped_log_seeds_this_cpu_as_predictions_and_starting_points(tmp_path, caplog,
                                                                          monkeypatch):
    """This machine (another CPU of the shipped log's ISA) is seeded for real: the shipped
    best schedules are measured here beside the defaults, the faster result is committed, and
    no foreign time becomes a cost."""
    # another CPU even on a znver4 host, whose own log the shipped one would otherwise be
    monkeypatch.setenv(CPU_TAG_VARIABLE, "unshipped-test")
    target = parse_target("llvm")
    before = digest(SHIPPED)
    local = TuningLog(tmp_path, target)
    with caplog.at_level(logging.INFO, logger="korch_tvm.log_seeds"):
        seed = seed_log(local, [str(SHIPPED)])
    shipped_kernels = seed.log.kernels()
    assert seed.tag == SHIPPED_TAG and seed.kernel_count == len(shipped_kernels) > 100
    assert (f"is empty: seeding from {SHIPPED_TAG} (same ISA avx512): {seed.kernel_count} "
            "kernels as predictions and starting points") in caplog.text
    assert (tmp_path / local.directory.split("/")[-1] / SEED_FILE).is_file()
    # the three smallest kernels that have a tuned schedule there
    tuned = sorted((k for k in shipped_kernels if seed.starting_trace(k.kernel) is not None),
                   key=lambda k: k.best_seconds)[:3]
    kernels = {f"k{i}": k.kernel for i, k in enumerate(tuned)}
    costs = profile_kernels(kernels, target, local, trials=0, progress=False, seed_log=seed)
    assert all(cost.source == "measured" and cost.seed_schedule in ("kept", "slower")
               for cost in costs.values())
    kept = sum(cost.seed_schedule == "kept" for cost in costs.values())
    defaults = sum(len(_default_schedules(kernel, target)) for kernel in kernels.values())
    assert sum(local.record_count(kernel) for kernel in kernels.values()) == defaults + kept
    for name, kernel in kernels.items():
        assert costs[name].seconds == local.best_seconds(kernel)  # measured here
    assert digest(SHIPPED) == before
    # later compiles keep the seed the log took, though the log has records now
    again = seed_log(TuningLog(tmp_path, target), [str(SHIPPED)])
    assert again is not None and again.tag == SHIPPED_TAG
    assert math.isfinite(again.calibration(local))


def test_a_compatible_log_in_the_users_own_root_seeds_too(tmp_path):
    small_log(tmp_path, ZNVER4, tag="llvm-sapphirerapids-2c")
    local = TuningLog(tmp_path, ZNVER4)
    seed = seed_log(local, [])
    assert seed is not None and seed.tag == "llvm-sapphirerapids-2c" and seed.kernel_count == 2
    assert len(local.database) == 0  # foreign records never enter the log as they are
    shutil.rmtree(tmp_path / "llvm-sapphirerapids-2c")  # a remembered seed that is gone
    assert seed_log(TuningLog(tmp_path, ZNVER4), []) is None


def test_a_log_timed_from_the_l3_is_its_own_tag_and_prefers_a_seed_timed_so(tmp_path):
    """Records timed from another cache state do not compare: an "l3" log (costing/
    cache_state.py) is a directory of its own, the shipped cold tag never merges into it, and
    of two compatible seeds it takes the one timed from the same state."""
    assert tag_isa("llvm-znver4-2c-l3") == "avx512" and tag_isa("llvm-znver4-2c-l4") == "unknown"
    seeds = tmp_path / "seeds"
    small_log(seeds, ZNVER4)                                     # llvm-znver4-2c: cold
    small_log(seeds, ZNVER4, tag="llvm-sapphirerapids-2c-l3")
    local = TuningLog(tmp_path / "mine", ZNVER4, cache_state="l3")
    assert local.directory.endswith("llvm-znver4-2c-l3")
    seed = seed_log(local, [str(seeds)])
    assert seed is not None and seed.tag == "llvm-sapphirerapids-2c-l3"
    assert len(local.database) == 0  # the same CPU's cold records were not merged
    cold = TuningLog(tmp_path / "cold", ZNVER4)
    assert cold.directory.endswith("llvm-znver4-2c") and seed_log(cold, [str(seeds)]) is None
    assert len(cold.database) == 2  # the shipped tag, timed cold like this log: merged


def test_each_opening_reads_its_own_seed(tmp_path):
    """A seed is read for the log that opens it (one per costing session, so per compile),
    through that log's verdicts; no process-wide table hands a later compile the same one."""
    small_log(tmp_path, ZNVER4, tag="llvm-sapphirerapids-2c")
    first_log = TuningLog(tmp_path, ZNVER4)
    first = seed_log(first_log, [])
    second = seed_log(TuningLog(tmp_path, ZNVER4), [])
    assert second is not first and second.log is not first.log
    assert first.log.verdicts is first_log.verdicts
    assert second.kernel_count == first.kernel_count == 2
    assert second.log.directory == first.log.directory  # the copy a writable log keeps


@pytest.mark.skipif(target_isa(parse_target("llvm")) != tag_isa(SHIPPED_TAG),
                    reason="this CPU's vector ISA is not the shipped log's")
def test_a_seeded_plan_predicts_from_the_seed(tmp_path, monkeypatch):
    """A plan on an empty, seeded log (predictions only: nothing is measured) costs every
    kernel the seed holds at the seed's default-schedule time (nothing was timed here to
    calibrate by)."""
    from conftest import MODELS
    from korch_tvm.config import KorchConfig
    from korch_tvm.frontend.onnx_import import import_onnx
    from korch_tvm.pipeline.korch import plan_korch

    monkeypatch.setenv("KORCH_TVM_SEED_LOGS", str(SHIPPED))
    monkeypatch.setenv(CPU_TAG_VARIABLE, "unshipped-test")  # not the shipped log's CPU
    config = KorchConfig(target=parse_target("llvm"), tuning_logs=str(tmp_path), layout="NCHW")
    import onnx

    plan = plan_korch(import_onnx(onnx.load(str(MODELS / "bert_layer.onnx")), None), config,
                      predict_only=True)
    seed = seed_log(plan.tuning_log)
    from_seed = {key: seed.log.default_seconds(plan.kernel_modules[key]) for key in plan.costs}
    from_seed = {key: seconds for key, seconds in from_seed.items() if seconds is not None}
    assert len(from_seed) > 10
    assert all(plan.costs[key].source == "predicted" for key in from_seed)
    assert {key: plan.costs[key].seconds for key in from_seed} == pytest.approx(from_seed)
    assert len(plan.tuning_log.database) == 0  # predictions never enter the log
