"""Measured time per kernel kind inside a model run: TVM libraries and ONNX Runtime alike.

The compile reports carry *modelled* time per kind (isolated kernel timings added up); this
measures the same split in the running model, so the gap to ONNX Runtime shows by kind and the
modelled numbers can be checked against what the kernels take in place. TVM: the Relax VM's
instrument hook times every call (a few microseconds of Python per call are included, so the
kinds add up to a little more than a plain run). ONNX Runtime: its own profiler.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping

from ..costing.in_model import LIBRARY_KIND, is_library_call, library_call_name
from ..kernels.kinds import KINDS, ort_kind_times
from ..kernels.weight_packing import original_kernel_name

RUNTIME = "runtime"  # the VM's own builtins (allocation, shape checks, reshapes without copy)
# Vendor-library calls (korch_tvm.blas.*, korch_tvm.cublas.*): one packed function serves every
# GEMM or convolution it replaced, so the VM's hook cannot tell their kinds apart.
LIBRARY = LIBRARY_KIND
PROFILE_KINDS = KINDS + (LIBRARY, RUNTIME)
_LIBRARY_PREFIXES = ("korch_tvm.blas.", "korch_tvm.cublas.")


def _empty() -> dict[str, float]:
    return {kind: 0.0 for kind in PROFILE_KINDS}


def tvm_kernel_times(vm, args, runs: int = 10, warmup: int = 2) -> dict[str, float]:
    """Milliseconds per run of `vm["main"](*args)` spent in each called function, by name.

    Pre-packed kernels are reported under their original name; the VM's builtins are summed
    under "runtime"; library calls, which the hook sees only by the packed function's name, go
    by their order in a run (`library_call_name`). Each call is timed from the instrument
    hook's before- to its after-callback, a window that holds the return from one Python
    callback and the entry into the next: about half of the hook's cost per call, which is the
    instrumented runs' excess over as many plain runs divided by the calls. That half is taken
    off each call (never more than half its timed value), so small kernels are not charged for
    the profiler.
    """
    main = vm["main"]
    for _ in range(warmup):
        main(*args)
    started_plain = time.perf_counter()
    for _ in range(runs):
        main(*args)
    plain = time.perf_counter() - started_plain
    totals: dict[str, float] = {}
    calls: dict[str, int] = {}
    started: dict[str, float] = {}
    library_calls = [0]  # library calls so far in this run

    def instrument(func, symbol, before_run, ret_value, *call_args):
        if before_run:
            started[symbol] = time.perf_counter()
        else:
            name = _kernel_name(str(symbol))
            if name == LIBRARY:
                name = library_call_name(library_calls[0])
                library_calls[0] += 1
            totals[name] = totals.get(name, 0.0) + time.perf_counter() - started[symbol]
            calls[name] = calls.get(name, 0) + 1
        return 0  # VMInstrumentReturnKind.NO_OP: run the call as usual

    vm.set_instrument(instrument)
    started_instrumented = time.perf_counter()
    try:
        for _ in range(runs):
            library_calls[0] = 0
            main(*args)
    finally:
        vm.set_instrument(None)
    excess = time.perf_counter() - started_instrumented - plain
    per_call = max(0.0, excess) / max(1, sum(calls.values())) / 2
    return {name: max(seconds - per_call * calls[name], seconds / 2) * 1e3 / runs
            for name, seconds in totals.items()}


def tvm_kind_times(vm, args, kernel_kinds: Mapping[str, str], runs: int = 10,
                   warmup: int = 2) -> dict[str, float]:
    """Milliseconds per kind per run of `vm["main"](*args)`.

    `kernel_kinds` maps PrimFunc names to kinds (a compile report's "kernel_kinds"); a called
    name missing there is a function TVM's build added (a legalized leftover op: "memory").
    """
    return sum_by_kind(tvm_kernel_times(vm, args, runs, warmup), kernel_kinds)


def sum_by_kind(kernel_ms: Mapping[str, float], kernel_kinds: Mapping[str, str]) -> dict:
    """`kernel_ms` ({function name: ms per run}) summed per kind; `kernel_kinds` names each
    kernel's kind (a function it does not name counts as memory-bound, the VM's as runtime,
    library calls as library)."""
    totals = _empty()
    for name, ms in kernel_ms.items():
        kind = LIBRARY if is_library_call(name) else kernel_kinds.get(name, "memory")
        totals[RUNTIME if name == RUNTIME else kind] += ms
    return totals


def _kernel_name(symbol: str) -> str:
    if symbol.startswith("vm.builtin.") or symbol.startswith("vm."):
        return RUNTIME
    if symbol.startswith(_LIBRARY_PREFIXES):
        return LIBRARY
    return original_kernel_name(symbol)


def ort_profiled_kind_times(make_session: Callable, inputs: Mapping, runs: int = 10,
                            warmup: int = 2) -> dict[str, float]:
    """Milliseconds per kind per run from ONNX Runtime's profiler.

    `make_session(options)` builds the session from SessionOptions with profiling switched on;
    the profile file goes to a temporary directory and is removed.
    """
    from ..backend.verify import import_onnxruntime

    onnxruntime = import_onnxruntime()  # telemetry off

    with tempfile.TemporaryDirectory(prefix="korch-ort-profile-") as directory:
        options = onnxruntime.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(directory, "ort")
        session = make_session(options)
        for _ in range(warmup + runs):
            session.run(None, dict(inputs))
        path = session.end_profiling()
        times = ort_kind_times(path, skip_runs=warmup)
    return {**_empty(), **times}


def orchestration_ceiling(stock_kind_ms: Mapping[str, float]) -> float | None:
    """The Korch/stock speed-up a plan would reach if every memory-bound kernel and VM builtin
    of the stock run cost nothing while its convolutions and matmuls ran as they do.

    Orchestration regroups the memory-bound work around the compute-bound kernels (both paths
    tune those the same way), so this bounds what it can buy on a model: a target above it
    needs faster compute kernels, not a better plan. None without compute-bound time.
    """
    total = sum(stock_kind_ms.values())
    compute = total - stock_kind_ms.get("memory", 0.0) - stock_kind_ms.get(RUNTIME, 0.0)
    return total / compute if compute > 0 else None


def kind_table(profiles: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Rows "kind  ms per runtime ..." for the kinds where some runtime spends time."""
    names = list(profiles)
    lines = ["  " + f"{'kind':15s}" + "".join(f"{name:>13s}" for name in names)]
    for kind in PROFILE_KINDS:
        values = [profiles[name].get(kind, 0.0) for name in names]
        if any(value >= 5e-4 for value in values):
            lines.append("  " + f"{kind:15s}" + "".join(f"{value:10.3f} ms" for value in values))
    lines.append("  " + f"{'total':15s}" + "".join(
        f"{sum(profiles[name].values()):10.3f} ms" for name in names))
    return lines
