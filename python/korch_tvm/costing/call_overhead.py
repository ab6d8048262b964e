"""The Relax VM's own time per kernel call: a term of every plan's modelled latency.

A kernel's cost is its time under a time evaluator, which calls it back to back. In a model
the VM also runs instructions around each call (the output's storage view, the argument list,
the dispatch), so a plan of many small kernels runs slower than its kernels' costs add up to.
The VM's share is measured once per machine and thread count: a chain of CHAIN_CALLS calls of a
small parallel kernel against a single call, less the kernel's own time. It is kept beside the
tuning log (`call_overhead.json`), so later compiles price kernels the same and choose the same
plans; `$KORCH_TVM_CALL_OVERHEAD_US` sets it instead (0: leave it out). On a GPU or a remote
runner it is left out: this process cannot time it there.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable

from ..errors import KorchError
from ..support.pool_spin import note_parallel_work, wait_for_idle_pool
from ..support.safe_io import write_text_atomically

logger = logging.getLogger(__name__)

FILE_NAME = "call_overhead.json"
FORMAT_VERSION = 1
VARIABLE = "KORCH_TVM_CALL_OVERHEAD_US"
CHAIN_CALLS = 64
# Floats each thread of the chain's kernel adds to: a small kernel, its data in the L1.
_FLOATS_PER_THREAD = 2048
# Above this the measurement is broken (a machine busy with other work), not the VM.
MAX_SECONDS = 100e-6


def call_overhead_seconds(directory: str, threads: int, target=None,
                          measure: Callable[[object, int], float] | None = None) -> float:
    """The VM's seconds per kernel call for this machine at `threads` threads: the variable's
    value where set, else the one kept in `directory`, else measured (`measure(target,
    threads)`, default `measure_call_overhead`) and kept there; 0 when it cannot be measured."""
    text = os.environ.get(VARIABLE, "").strip()
    if text:
        return _from_variable(text)
    path = os.path.join(directory, FILE_NAME)
    kept = read_call_overhead(path, threads)
    if kept is not None:
        return kept
    try:
        seconds = (measure or measure_call_overhead)(target, threads)
    except Exception as err:  # noqa: BLE001 - a small term of every price, never the compile:
        # left out (and not kept, so the next compile measures again)
        logger.warning("the VM's time per kernel call was not measured (%s); this compile's "
                       "prices leave it out", str(err).splitlines()[0] if str(err) else
                       type(err).__name__)
        return 0.0
    text = json.dumps({"format": FORMAT_VERSION, "threads": threads, "seconds": seconds,
                       "date": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1)
    try:
        write_text_atomically(path, text + "\n")
    except KorchError as err:
        logger.warning("call overhead not kept: %s", err)
    return seconds


def _from_variable(text: str) -> float:
    try:
        micros = float(text)
    except ValueError:
        micros = math.nan
    if not (math.isfinite(micros) and 0.0 <= micros * 1e-6 <= MAX_SECONDS):
        raise KorchError(f"{VARIABLE} must be microseconds from 0 to {MAX_SECONDS * 1e6:.0f}, "
                         f"got {text!r}")
    return micros * 1e-6


def read_call_overhead(path: str, threads: int) -> float | None:
    """The seconds kept at `path` for `threads` threads; None when there are none (the file is
    absent, for another thread count, or refused: one warning line, then measured again)."""
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        logger.warning("%s is unreadable (%s); measuring the call overhead again", path,
                       str(err).splitlines()[0] if str(err) else type(err).__name__)
        return None
    seconds = content.get("seconds") if isinstance(content, dict) else None
    if not (isinstance(content, dict) and content.get("format") == FORMAT_VERSION
            and isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
            and 0.0 <= seconds <= MAX_SECONDS):
        logger.warning("%s is not a format-%d call overhead from 0 to %.0f us; measuring it "
                       "again", path, FORMAT_VERSION, MAX_SECONDS * 1e6)
        return None
    return float(seconds) if content.get("threads") == threads else None


def measure_call_overhead(target, threads: int) -> float:
    """Seconds the VM adds to each call of a parallel kernel on `threads` threads of this
    process's pool: (CHAIN_CALLS calls - 1 call) / (CHAIN_CALLS - 1), less the kernel alone.
    Each time is the least of several repeats, so a busy moment of the machine weighs little;
    a result above MAX_SECONDS is refused the same way."""
    import numpy as np
    import tvm

    device = tvm.cpu()
    size = threads * _FLOATS_PER_THREAD
    data = tvm.runtime.tensor(np.zeros(size, "float32"), device)
    out = tvm.runtime.tensor(np.zeros(size, "float32"), device)
    kernel = _add_one(size, threads)
    wait_for_idle_pool()
    alone = _least(tvm.compile(kernel, target=target).jit(), "add_one", device, data, out)
    chained = [_least(_chain_vm(kernel, size, calls, target), "main", device, data)
               for calls in (1, CHAIN_CALLS)]
    note_parallel_work()
    seconds = max(0.0, (chained[1] - chained[0]) / (CHAIN_CALLS - 1) - alone)
    if seconds > MAX_SECONDS:
        raise KorchError(f"the VM's time per kernel call measured {seconds * 1e6:.0f} us, "
                         f"above {MAX_SECONDS * 1e6:.0f}: is the machine busy? Set "
                         f"{VARIABLE} to give it")
    logger.info("the VM adds %.2f us to each kernel call (%d threads)", seconds * 1e6, threads)
    return seconds


def _least(function_holder, name: str, device, *args) -> float:
    evaluator = function_holder.time_evaluator(name, device, number=50, repeat=9,
                                               min_repeat_ms=5)
    return float(min(evaluator(*args).results))


def _add_one(size: int, threads: int):
    """out = data + 1, its loop split over `threads` in parallel and vectorized."""
    from tvm import s_tir, te

    data = te.placeholder((size,), "float32", name="data")
    out = te.compute((size,), lambda i: data[i] + 1.0, name="out")
    schedule = s_tir.Schedule(te.create_prim_func([data, out]))
    (loop,) = schedule.get_loops(schedule.get_sblock("out"))
    outer, inner = schedule.split(loop, [threads, None])
    schedule.parallel(outer)
    schedule.vectorize(schedule.split(inner, [None, 16])[1])
    return schedule.mod["main"].with_attr("global_symbol", "add_one")


def _chain_vm(kernel, size: int, calls: int, target):
    """A VM running `calls` calls of `kernel` (of `size` floats), each on the previous one's
    output."""
    import tvm
    from tvm import relax

    builder = relax.BlockBuilder()
    function = builder.add_func(kernel, "add_one")
    tensor = relax.TensorType((size,), "float32")
    data = relax.Var("data", tensor)
    with builder.function("main", [data]):
        with builder.dataflow():
            value = data
            for _ in range(calls):
                value = builder.emit(relax.call_tir(function, [value], tensor))
            result = builder.emit_output(value)
        builder.emit_func_output(result)
    return relax.VirtualMachine(tvm.compile(builder.get(), target=target), tvm.cpu())
