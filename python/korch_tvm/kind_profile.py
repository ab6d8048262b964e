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

from .kernel_kinds import KINDS, ort_kind_times
from .layout import original_kernel_name

RUNTIME = "runtime"  # the VM's own builtins (allocation, shape checks, reshapes without copy)
PROFILE_KINDS = KINDS + (RUNTIME,)


def _empty() -> dict[str, float]:
    return {kind: 0.0 for kind in PROFILE_KINDS}


def tvm_kind_times(vm, args, kernel_kinds: Mapping[str, str], runs: int = 10,
                   warmup: int = 2) -> dict[str, float]:
    """Milliseconds per kind per run of `vm["main"](*args)`.

    `kernel_kinds` maps PrimFunc names to kinds (a compile report's "kernel_kinds"); a called
    name missing there is a function TVM's build added (a legalized leftover op: "memory") or
    a VM builtin ("runtime").
    """
    main = vm["main"]
    for _ in range(warmup):
        main(*args)
    totals = _empty()
    started: dict[str, float] = {}

    def instrument(func, symbol, before_run, ret_value, *call_args):
        if before_run:
            started[symbol] = time.perf_counter()
        else:
            totals[_kind_of(str(symbol), kernel_kinds)] += time.perf_counter() - started[symbol]
        return 0  # VMInstrumentReturnKind.NO_OP: run the call as usual

    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            main(*args)
    finally:
        vm.set_instrument(None)
    return {kind: seconds * 1e3 / runs for kind, seconds in totals.items()}


def _kind_of(symbol: str, kernel_kinds: Mapping[str, str]) -> str:
    if symbol.startswith("vm.builtin.") or symbol.startswith("vm."):
        return RUNTIME
    return kernel_kinds.get(original_kernel_name(symbol), "memory")


def ort_profiled_kind_times(make_session: Callable, inputs: Mapping, runs: int = 10,
                            warmup: int = 2) -> dict[str, float]:
    """Milliseconds per kind per run from ONNX Runtime's profiler.

    `make_session(options)` builds the session from SessionOptions with profiling switched on;
    the profile file goes to a temporary directory and is removed.
    """
    import onnxruntime

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
