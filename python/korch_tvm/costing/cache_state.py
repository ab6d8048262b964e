"""The cache state a CPU kernel is timed from, chosen to match how the model will run it.

Inside a model a kernel finds its input just written by the kernel before it, and, where the
whole model fits in the last-level cache, its weights and its output's storage there too: in
steady state nothing comes from memory. Timed after TVM's flush of its operands to memory, small
models' kernels cost up to 1.5x what they take in the model on a host with a large L3, and the
solver adds those costs up (bench/results/cache-state/). So each compile times in one of two
states:

* "cold": before each timed call its operands but the first are flushed from every cache level
  (TVM's `cache_flush_cpu_non_first_arg`): a model larger than a fifth of the L3;
* "l3": before each timed call every pool thread's private caches are evicted into the shared
  L3, by reading a buffer twice their size on each thread: a model within a fifth of the L3.

A model's footprint is its weights, inputs and the activations alive at once at its peak.
Only a fifth of the L3 counts: it also holds the runtime, other processes' lines (a VM's
sysfs reports a cache other tenants share), what another engine timed beside it left there
and, where it is non-inclusive, not what sits in the private caches; the fraction is where
timed cold and timed from the L3 the modelled latency of the zoo's models came nearest their
measured (bench/results/zoo-intel-footprint/). "auto" picks per model (`for_model`);
remote and GPU targets are timed as before. Records timed in different states do not compare,
so an "l3" log is a directory of its own, its tag ending in `L3_SUFFIX`.
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass

import numpy as np

from ..errors import KorchError

L3_SUFFIX = "-l3"
L3_VARIABLE = "KORCH_TVM_L3_BYTES"
EVICT_FUNCTION = "korch_tvm.evict_private_caches"
FLUSH_FUNCTION = "cache_flush_cpu_non_first_arg"  # TVM's
_CACHE_ROOT = "/sys/devices/system/cpu/cpu0/cache"
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# Without sysfs (another OS, a sandbox): a private L2 of this size is assumed when evicting.
DEFAULT_L2_BYTES = 2 << 20
CACHE_LINE_BYTES = 64
L3_SHARE = 5  # a model's footprint within 1/L3_SHARE of the L3 is timed from the L3


def cache_bytes(level: int, root: str = _CACHE_ROOT) -> int | None:
    """The size of this CPU's data cache of `level` as sysfs gives it (per core for L1 and
    L2, per group of cores sharing it for L3); None where sysfs does not say."""
    try:
        for index in sorted(os.listdir(root)):
            read = functools.partial(_read, os.path.join(root, index))
            if read("level") == str(level) and read("type") in ("Data", "Unified"):
                text = read("size")
                scale = _UNITS.get(text[-1:], 1)
                return int(text.rstrip("KMG")) * scale
    except (OSError, ValueError):
        pass
    return None


def l3_bytes() -> int | None:
    """The L3 size "auto" compares a model with: `$KORCH_TVM_L3_BYTES` where set (0: unknown,
    so every model is timed cold; a VM's sysfs may report a cache other tenants share), else
    what sysfs says."""
    text = os.environ.get(L3_VARIABLE, "").strip()
    if not text:
        return cache_bytes(3)
    if not text.isdigit():
        raise KorchError(f"{L3_VARIABLE} must be a whole number of bytes, got {text!r}")
    return int(text) or None


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as file:
        return file.read().strip()


@dataclass(frozen=True)
class Choice:
    """The state a compile times in, and what decided it (for the report)."""

    state: str
    footprint_bytes: int | None = None
    l3_bytes: int | None = None
    reason: str = ""

    def as_dict(self) -> dict:
        return {"state": self.state, "footprint_bytes": self.footprint_bytes,
                "l3_bytes": self.l3_bytes, "reason": self.reason}


def choose(config, mod) -> Choice:
    """The state for compiling `mod` (a Relax module) with `config` (see the module
    docstring); `config.cache_state` itself unless it is "auto"."""
    if not on_this_cpu(config):
        return Choice("cold", reason="timed on another device")
    if config.cache_state != "auto":
        return Choice(config.cache_state, reason="as configured")
    l3, footprint = l3_bytes(), model_footprint(mod)
    if l3 is None:
        return Choice("cold", footprint, None, "the L3's size is unknown")
    fits = footprint <= l3 // L3_SHARE
    return Choice("l3" if fits else "cold", footprint, l3,
                  f"the model's {footprint / 2**20:.0f} MiB {'fit' if fits else 'exceed'} "
                  f"a fifth of the {l3 / 2**20:.0f} MiB L3")


def configured(config) -> str:
    """The state a compile of `config` times in: its own once decided; "cold" while it is
    "auto" (no model known yet: what korch_tvm always did) and off the host's CPU."""
    return config.cache_state if config.cache_state != "auto" and on_this_cpu(config) \
        else "cold"


def on_this_cpu(config) -> bool:
    """Whether `config`'s kernels are timed on this machine's CPU (not a GPU, not remotely)."""
    return config.target.kind.name == "llvm" and not config.rpc_tracker


def for_model(config, mod, choice: Choice | None = None):
    """`config` with its cache state decided for `mod` (`choice`: made already) or kept."""
    if config.cache_state != "auto":
        return config
    return config.with_changes(cache_state=(choice or choose(config, mod)).state)


def model_footprint(mod) -> int:
    """Bytes a run of `mod` keeps in the caches: its constants once each, plus the most bytes of
    parameters and bound tensors alive at once in any function, taking its bindings in order
    (Relax's memory plan reuses a dead tensor's storage)."""
    import tvm
    from tvm import relax

    constants: dict = {}

    def add_constant(expr) -> None:
        if isinstance(expr, tvm.ir.expr.Constant):
            constants.setdefault(expr, _tensor_bytes(getattr(expr, "ty", None)))

    peak = 0
    for function in mod.functions.values():
        if isinstance(function, relax.Function):
            relax.analysis.post_order_visit(function, add_constant)
            peak = max(peak, _peak_live_bytes(function))
    return sum(constants.values()) + peak


def _peak_live_bytes(function) -> int:
    """The most bytes of `function`'s parameters and bound tensors alive at once: a bound
    tensor lives from its binding to its last use (the function's result counts as a use)."""
    from ..graph.relax_exprs import last_uses

    bindings = [binding for block in function.body.blocks for binding in block.bindings]
    last_use = last_uses(function, bindings)
    alive = sum(_tensor_bytes(param.ty) for param in function.params)
    peak = alive
    live: dict = {}
    for index, binding in enumerate(bindings):
        live[binding.var] = _tensor_bytes(binding.var.ty)
        alive += live[binding.var]
        peak = max(peak, alive)
        for var in [var for var in live if last_use.get(var, -1) <= index]:
            alive -= live.pop(var)
    return peak


def _tensor_bytes(ty) -> int:
    """Bytes of a tensor (or tuple of tensors) type of static shape; 0 for anything else."""
    from tvm import relax

    from ..graph.primitive_graph import tensor_bytes

    if isinstance(ty, relax.TupleType):
        return sum(_tensor_bytes(field) for field in ty.fields)
    if isinstance(ty, relax.TensorType) and hasattr(ty.shape, "values"):
        extents = [getattr(extent, "value", None) for extent in ty.shape.values]
        if all(isinstance(extent, int) for extent in extents):
            return tensor_bytes(extents, str(ty.dtype))
    return 0


def tag_suffix(state: str) -> str:
    """What a log directory's tag gains for records timed in `state`."""
    return L3_SUFFIX if state == "l3" else ""


def preprocessing(state: str, threads: int) -> str:
    """The global function the time evaluator runs before each timed call in `state` (made
    here for "l3"), "" for none."""
    if state == "l3":
        return register_evict(threads)
    return FLUSH_FUNCTION if state == "cold" else ""


def register_evict(threads: int) -> str:
    """`EVICT_FUNCTION`, registered in this process for a pool of `threads` threads."""
    import tvm

    if tvm.get_global_func(EVICT_FUNCTION, allow_missing=True) is None:
        private = cache_bytes(2) or DEFAULT_L2_BYTES
        evict = _parallel_reader(max(1, threads), 2 * private)
        def evict_before_call(*operands) -> None:  # returns nothing: the evaluator wants none
            evict()

        tvm.register_global_func(EVICT_FUNCTION, evict_before_call)
    return EVICT_FUNCTION


@functools.lru_cache(maxsize=None)
def _parallel_reader(threads: int, bytes_per_thread: int):
    """A call that reads `bytes_per_thread` on each of `threads` pool threads (a parallel loop
    runs on the same pool threads that run kernels, so their private caches are the ones
    refilled with the buffer, their previous lines pushed out to the L3). One float of each
    cache line is read: a line comes whole, and the eviction costs a quarter of the time."""
    import tvm
    from tvm.script import tirx as T

    chunk, stride = bytes_per_thread // 4, CACHE_LINE_BYTES // 4

    @T.prim_func
    def read(data: T.Buffer((threads * chunk,), "float32"), sums: T.Buffer((threads,), "float32")):
        T.func_attr({"global_symbol": "read", "tir.noalias": True})
        for thread in T.parallel(threads):
            sums[thread] = T.float32(0)
            for line in range(chunk // stride):
                sums[thread] = sums[thread] + data[thread * chunk + line * stride]

    function = tvm.compile(tvm.IRModule({"read": read}), target="llvm")["read"]
    data = tvm.runtime.tensor(np.ones(threads * chunk, "float32"))
    sums = tvm.runtime.tensor(np.zeros(threads, "float32"))

    def read_buffer():
        function(data, sums)
        return sums  # what each thread read: a test checks it

    return read_buffer


def timed_samples(module, symbol: str, device, evaluator_config, state: str,
                  repeated_args) -> list[float]:
    """Seconds per sample of `module`'s `symbol`, each argument set timed as
    `evaluator_config` says, every timed call from `state` (as MetaSchedule's LocalRunner
    times an entry function, with this module's step before each call)."""
    from tvm.runtime import num_threads

    evaluator = module.time_evaluator(
        symbol, device, number=evaluator_config.number, repeat=evaluator_config.repeat,
        min_repeat_ms=evaluator_config.min_repeat_ms,
        f_preproc=preprocessing(state, num_threads()))
    samples = []
    for args in repeated_args:
        device.sync()
        samples.append(evaluator(*args).results)
    return [float(seconds) for seconds in itertools.chain.from_iterable(samples)]


def run_evaluator(rt_mod, device, evaluator_config, repeated_args) -> list[float]:
    """MetaSchedule's LocalRunner step for the "l3" state (`timed_samples` of its entry)."""
    return timed_samples(rt_mod, rt_mod.entry_name, device, evaluator_config, "l3",
                         repeated_args)
