"""Each compute kind's untuned default schedule against its roofline floor, on kernels of the zoo.

    .venv/bin/python bench/kind_floor.py [--models deit_tiny,...] [--per-kind 3] [--repeat 15]
        [--out bench/results/kinds-0]

The kernels are the real ones: every zoo model (bench/zoo/models/*.onnx) is imported, lowered to
primitives in NCHW and NHWC and cut into Korch's candidate kernels (the kernels a 0-trial compile
measures and may run); each distinct kernel gets its kind (`kernels.kinds.compute_kind`), and per
kind the `--per-kind` kernels of most work (FLOPs for contractions, bytes otherwise), at most one
per model, are kept (the extracted kernels are cached under `--cache`, keyed by model).

Each kernel is timed under the schedules a 0-trial compile would measure and keep the fastest of
(`schedule_variants.default_schedules`): once with the per-kind rules (`backend/cpu_rules.py`, "after")
and once with the generic rule alone ("before", `kind_rules=False`), interleaved, so both columns
come from one run. A time is the median of `--repeat` samples of `time_evaluator` (each sample at
least 20 ms of calls), with p10-p90 of the samples; the machine is shared, so the spread is real.

Floor = max(FLOPs / peak, bytes / bandwidth), FLOPs TVM's estimate for the kernel, bytes every
parameter read or written once. The peak is measured here (bench/peak_fma.c: independent FMA
chains on every thread, no memory traffic: no kernel can beat it) and the bandwidth too (numpy
copies of 256 MiB arrays split over the threads), each the best of several runs at the start and
the end of the run; the nominal peak from the clock is reported beside them.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated zoo names (default all)")
    parser.add_argument("--per-kind", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", default="/tmp/korch-kind-floor")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "kinds-0"))
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    return args


# ----------------------------------------------------------------------------- machine
def fma_peak(threads: int, runs: int = 5) -> float:
    """Best FLOP/s of bench/peak_fma.c over `runs` runs on `threads` threads."""
    binary = os.path.join("/tmp", f"korch-peak-fma-{os.getuid()}")
    if not os.path.exists(binary):
        subprocess.run(["cc", "-O2", "-march=native", "-pthread",
                        os.path.join(HERE, "peak_fma.c"), "-o", binary], check=True)
    best = 0.0
    for _ in range(runs):
        out = subprocess.run([binary, str(threads), "20000000"], check=True,
                             capture_output=True, text=True).stdout.split()
        best = max(best, float(out[2]) * 1e9)
    return best


def copy_bandwidth(threads: int, runs: int = 8) -> float:
    """Best bytes/s (read + written) of numpy copies of 256 MiB float32, split over threads."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    a = np.ones(64 * 1024 * 1024, dtype=np.float32)
    c = np.empty_like(a)
    bounds = np.linspace(0, a.size, threads + 1).astype(int)
    parts = [slice(bounds[i], bounds[i + 1]) for i in range(threads)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(runs):
            start = time.perf_counter()
            list(pool.map(lambda s: np.copyto(c[s], a[s]), parts))
            best = min(best, time.perf_counter() - start)
    return 2 * a.nbytes / best


def nominal_peak(cores: int) -> float | None:
    """Cores x clock (MHz of /proc/cpuinfo) x 2 AVX-512 FMA pipes x 16 lanes x 2 FLOPs."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            mhz = next(float(line.split(":")[1]) for line in handle if line.startswith("cpu MHz"))
    except (OSError, StopIteration, ValueError):
        return None
    return cores * mhz * 1e6 * 2 * 16 * 2


# ----------------------------------------------------------------------------- kernels
def kernel_bytes(kernel_mod, kind: str) -> int:
    """Bytes every implementation must move: each parameter once; a gather reads at most as
    many table elements as it writes, so no parameter counts above the output's size there."""
    sizes = []
    for param in kernel_mod["main"].params:
        count = 1
        for dim in param.ty.shape:
            count *= int(dim)
        bits = "".join(ch for ch in str(param.ty.dtype) if ch.isdigit())
        sizes.append(count * max(1, int(bits or 8) // 8))
    if kind == "gather":
        return sum(min(size, sizes[-1]) for size in sizes)
    return sum(sizes)


def model_kernels(name: str, target, cache: str, keep: int = 2) -> list[dict]:
    """The `keep` kernels of most work per kind of one zoo model, in NCHW and NHWC, cached."""
    import tvm

    path = os.path.join(cache, f"{name}.json")
    if os.path.exists(path):
        from korch_tvm.kernels.kinds import compute_kind

        with open(path, encoding="utf-8") as handle:
            entries = [{**entry, "module": tvm.ir.load_json(entry["module"])}
                       for entry in json.load(handle)]
        # the kind as the current classifier says (the cache may predate a change to it)
        return [{**entry, "kind": compute_kind(entry["module"]["main"])} for entry in entries]
    from korch_tvm.config import KorchConfig
    from korch_tvm.frontend.onnx_import import import_onnx, load_onnx
    from korch_tvm.graph.primitive_graph import PrimitiveGraph
    from korch_tvm.kernels.fused import kernel_flops
    from korch_tvm.kernels.keys import structural_key
    from korch_tvm.kernels.kinds import compute_kind
    from korch_tvm.layout.activations import convert_layout
    from korch_tvm.lowering.fission import lower_to_primitives
    from korch_tvm.pipeline.layout_plan import find_candidates

    config = KorchConfig(target=target)
    source = import_onnx(load_onnx(os.path.join(HERE, "zoo", "models", f"{name}.onnx")))
    by_kind: dict[str, dict] = {}
    for layout in ("NCHW", "NHWC"):
        mod = source if layout == "NCHW" else convert_layout(source, layout)
        graph = PrimitiveGraph.from_module(lower_to_primitives(mod), fast_math=True)
        for module in find_candidates(graph, config).kernels.modules.values():
            kind = compute_kind(module["main"])
            if kind == "memory":
                continue
            entry = {"model": name, "layout": layout, "kind": kind,
                     "flops": kernel_flops(module), "bytes": kernel_bytes(module, kind),
                     "blocks": module["main"].script().count("T.sblock("), "module": module}
            by_kind.setdefault(kind, {})[structural_key(module)] = entry
    chosen = []
    for kind, entries in by_kind.items():
        # most work first; among equals, the kernel with fewest blocks (the bare contraction)
        ranked = sorted(entries.values(), key=lambda e: (-max(e["flops"], e["bytes"] / 4),
                                                         e["blocks"]))
        chosen += ranked[:keep]
    os.makedirs(cache, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump([{**e, "module": tvm.ir.save_json(e["module"])} for e in chosen], handle)
    return chosen


def representatives(entries: list[dict], per_kind: int) -> dict[str, list[dict]]:
    """Per kind, the `per_kind` kernels of most work, at most one per model."""
    chosen: dict[str, list[dict]] = {}
    for entry in sorted(entries, key=lambda e: -max(e["flops"], e["bytes"] / 4)):
        picked = chosen.setdefault(entry["kind"], [])
        if len(picked) < per_kind and all(e["model"] != entry["model"] for e in picked):
            picked.append(entry)
    return chosen


def describe(kernel_mod) -> str:
    """The parameter shapes, e.g. "1x3x197x64, 1x3x64x197 -> 1x3x197x197"."""
    shapes = ["x".join(str(int(d)) for d in p.ty.shape) or "scalar"
              for p in kernel_mod["main"].params]
    return ", ".join(shapes[:-1]) + " -> " + shapes[-1]


# ----------------------------------------------------------------------------- timing
def seeded_arguments(module, seed: int, device) -> list:
    """Arguments for `module["main"]`, output buffers included: standard-normal floats,
    integers zero (an index must stay in range), from `seed`."""
    import numpy as np
    import tvm

    rng = np.random.default_rng(seed)
    args = []
    for param in module["main"].params:
        shape, dtype = [int(d) for d in param.ty.shape], str(param.ty.dtype)
        data = (rng.standard_normal(shape) if dtype.startswith("float")
                else np.zeros(shape)).astype(dtype)
        args.append(tvm.runtime.tensor(data, device))
    return args


def timer(module, target):
    """A callable returning one sample (seconds per call) of `module` built as the profiler
    builds it (the weight repacking left out), on seeded inputs (integer inputs: zeros)."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    module = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(module)
    library = tvm.compile(module, target=target)
    device = tvm.cpu()
    args = seeded_arguments(module, seed=0, device=device)
    evaluate = library.mod.time_evaluator("main", device, number=1, repeat=1, min_repeat_ms=20)
    return lambda: evaluate(*args).mean


def time_forms(forms: dict[str, list], target, repeat: int) -> dict[str, dict]:
    """{form: {"p10", "median", "p90", "schedule"}} in ms: each form's fastest schedule (by
    median), the samples of all forms' schedules taken round-robin so load hits all alike."""
    import numpy as np

    timers = {(form, i): timer(schedule.mod, target)
              for form, schedules in forms.items() for i, schedule in enumerate(schedules)}
    samples = {key: [] for key in timers}
    for _ in range(repeat):
        for key, sample in timers.items():
            samples[key].append(sample() * 1e3)
    result = {}
    for form in forms:
        best = min((key for key in samples if key[0] == form),
                   key=lambda key: float(np.median(samples[key])))
        values = samples[best]
        result[form] = {"p10": float(np.percentile(values, 10)),
                        "median": float(np.median(values)),
                        "p90": float(np.percentile(values, 90)), "schedule": best[1]}
    return result


def schedules_of(kernel_mod, target, kind_rules: bool) -> list:
    """What a 0-trial compile measures for the kernel; the kernel as written where no rule
    applies (the profiler then measures that)."""
    import tvm

    from korch_tvm.backend.schedule_variants import default_schedules

    return (default_schedules(kernel_mod, target, kind_rules=kind_rules)
            or [tvm.s_tir.Schedule(kernel_mod)])


def check_numerics(kernel_mod, schedule, target) -> float:
    """Largest |scheduled - as written| / (1 + |as written|) of the output on seeded inputs."""
    import numpy as np
    import tvm

    outputs = []
    for module in (kernel_mod, schedule.mod):  # the repacking stays in: same parameters
        library = tvm.compile(module, target=target)
        args = seeded_arguments(module, seed=1, device=tvm.cpu())
        library["main"](*args)
        outputs.append(args[-1].numpy().astype("float64"))
    return float(np.max(np.abs(outputs[1] - outputs[0]) / (1 + np.abs(outputs[0]))))


def machine(threads: int) -> dict:
    return {"fma_peak_flops": fma_peak(threads), "copy_bandwidth": copy_bandwidth(threads),
            "load_average": os.getloadavg()[0]}


def main(argv=None) -> int:
    args = arguments(argv)
    from korch_tvm.backend.target import parse_target

    target = parse_target({"kind": "llvm", "num-cores": args.threads})
    names = (args.models.split(",") if args.models else sorted(
        os.path.basename(p)[:-5] for p in glob.glob(os.path.join(HERE, "zoo", "models", "*.onnx"))))
    before = machine(args.threads)
    entries = []
    for name in names:
        started = time.perf_counter()
        entries += model_kernels(name, target, args.cache)
        print(f"{name}: kernels in {time.perf_counter() - started:.0f} s", flush=True)
    rows = []
    for kind, picked in sorted(representatives(entries, args.per_kind).items()):
        for entry in picked:
            module = entry["module"]
            forms = {"before": schedules_of(module, target, False),
                     "after": schedules_of(module, target, True)}
            times = time_forms(forms, target, args.repeat)
            error = check_numerics(module, forms["after"][times["after"]["schedule"]], target)
            rows.append({key: entry[key] for key in ("model", "layout", "kind", "flops", "bytes")}
                        | {"shapes": describe(module), "times": times, "max_rel_error": error,
                           "load_average": os.getloadavg()[0]})
            print(kind, entry["model"], rows[-1]["shapes"],
                  {f: round(t["median"], 3) for f, t in times.items()}, flush=True)
    after = machine(args.threads)
    write_results(args, target, rows, before, after)
    return 0


def floor_ms(row: dict, peak: float, bandwidth: float) -> tuple[float, str]:
    compute, memory = row["flops"] / peak, row["bytes"] / bandwidth
    return max(compute, memory) * 1e3, "compute" if compute >= memory else "memory"


def write_results(args, target, rows, before: dict, after: dict) -> None:
    """bench/results/kinds-0.json (every sample statistic) and .md (per kind, before/after)."""
    peak = max(before["fma_peak_flops"], after["fma_peak_flops"])
    bandwidth = max(before["copy_bandwidth"], after["copy_bandwidth"])
    for row in rows:
        row["floor_ms"], row["bound"] = floor_ms(row, peak, bandwidth)
        for form in row["times"].values():
            form["over_floor"] = form["median"] / row["floor_ms"]
    machine_facts = {"target": str(target), "threads": args.threads, "peak_flops": peak,
                     "bandwidth_bytes_per_s": bandwidth, "nominal_peak_flops":
                     nominal_peak(args.threads), "start": before, "end": after,
                     "repeat": args.repeat, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                   time.gmtime())}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w", encoding="utf-8") as handle:
        json.dump({"machine": machine_facts, "kernels": rows}, handle, indent=1)
    with open(args.out + ".md", "w", encoding="utf-8") as handle:
        handle.write("\n".join(markdown(rows, machine_facts)) + "\n")


def markdown(rows: list[dict], facts: dict) -> list[str]:
    lines = [f"# Default schedule per compute kind vs its roofline floor ({facts['date']})", "",
             f"Target `{facts['target']}`, {facts['threads']} threads. Floor = max(FLOPs / "
             f"{facts['peak_flops'] / 1e9:.0f} GFLOP/s, bytes / "
             f"{facts['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s): peak and bandwidth measured in "
             f"this run (best of bench/peak_fma.c and of 256 MiB copies, at start and end; "
             f"nominal peak from the clock "
             f"{(facts['nominal_peak_flops'] or 0) / 1e9:.0f} GFLOP/s). 1-minute load average "
             f"{facts['start']['load_average']:.1f} at the start, {facts['end']['load_average']:.1f}"
             f" at the end. Times: median (p10-p90) of {facts['repeat']} samples of >= 20 ms, "
             "the fastest of the schedules a 0-trial compile measures; before = the generic "
             "rule alone, after = with the per-kind rules, timed interleaved in this run.", "",
             "| kind | model (layout) | kernel | floor ms (bound) | before ms | after ms "
             "| before / floor | after / floor |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        b, a = row["times"]["before"], row["times"]["after"]
        lines.append(f"| {row['kind']} | {row['model']} ({row['layout']}) | {row['shapes']} "
                     f"| {row['floor_ms']:.4f} ({row['bound']}) "
                     f"| {b['median']:.3f} ({b['p10']:.3f}-{b['p90']:.3f}) "
                     f"| {a['median']:.3f} ({a['p10']:.3f}-{a['p90']:.3f}) "
                     f"| {b['over_floor']:.1f}x | {a['over_floor']:.1f}x |")
    lines += ["", "Per kind (geometric mean of its kernels' distance to the floor; worst in "
              "brackets):", "", "| kind | kernels | before / floor | after / floor |",
              "|---|---|---|---|"]
    for kind in sorted({row["kind"] for row in rows}):
        of_kind = [row for row in rows if row["kind"] == kind]
        cells = []
        for form in ("before", "after"):
            ratios = [row["times"][form]["over_floor"] for row in of_kind]
            cells.append(f"{_geomean(ratios):.1f}x ({max(ratios):.1f}x)")
        lines.append(f"| {kind} | {len(of_kind)} | {cells[0]} | {cells[1]} |")
    return lines


def _geomean(values: list[float]) -> float:
    import math

    return math.exp(sum(math.log(v) for v in values) / len(values))


if __name__ == "__main__":
    raise SystemExit(main())
