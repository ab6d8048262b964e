"""A resolved target's stable tag (it names a tuning-log directory), its device and threads.

Targets are read and checked in `target_spec.py` (re-exported here: `parse_target`,
`host_cpu_name`, `host_core_count`), which `KorchConfig` uses when it is made. The tag becomes
a directory name under the user's `--tuning-logs`, so it is a safe token
(`[A-Za-z0-9._-]+`, no `..`). `KORCH_TVM_CPU_TAG` replaces the CPU part of the
host CPU's llvm tag (never the `mcpu` code is generated for, and not the tag of a CPU named on
purpose), so that CI can act as a CPU without logs.
"""

from __future__ import annotations

import os

import tvm
from tvm.target import Target

from ..errors import KorchError
from ..target_spec import (CUDA_FALLBACK, SAFE_TOKEN, cuda_defaults,  # noqa: F401 - re-exported
                           host_core_count, host_cpu_name, parse_target)

CPU_TAG_VARIABLE = "KORCH_TVM_CPU_TAG"


def target_tag(target: Target) -> str:
    """A stable directory name for tuning logs: kind, arch/mcpu and core count.

    Two machines with the same tag can share tuning records; anything that changes generated
    code or timings (CPU model, core count, GPU arch) changes the tag.
    """
    kind = target.kind.name
    if kind == "llvm":
        cpu = str(target.attrs.get("mcpu", "generic")) or "generic"
        override = os.environ.get(CPU_TAG_VARIABLE)
        if override and cpu == host_cpu_name():  # this machine, not a CPU named on purpose
            cpu = override
        _check_token(cpu, CPU_TAG_VARIABLE if override else "mcpu")
        cores = int(target.attrs.get("num-cores", 1))
        tag = f"llvm-{cpu}-{cores}c"
    elif kind == "cuda":
        tag = f"cuda-{target.attrs.get('arch', 'unknown')}"
    else:
        tag = kind
    _check_token(tag, "target tag")
    return tag


def _check_token(text: str, what: str) -> None:
    if not (SAFE_TOKEN.fullmatch(text) and ".." not in text):
        raise KorchError(f"{what} {text!r} cannot name a tuning-log directory: use letters, "
                         "digits, '.', '_' and '-' only")


def inside_root(root: str, name: str) -> str:
    """`root/name`, refused unless it resolves (symbolic links followed) inside `root`."""
    path = os.path.join(root, name)
    real_root, real_path = os.path.realpath(root), os.path.realpath(path)
    if os.path.commonpath([real_root, real_path]) != real_root or real_path == real_root:
        raise KorchError(f"tuning-log directory {path} resolves to {real_path}, outside "
                         f"{real_root}; refusing to write there")
    return path


def device_for(target: Target):
    """The runtime device that executes code built for `target`."""
    return tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)


def thread_count(num_threads: int | None = None) -> int:
    """The CPU threads kernels run on: `num_threads`, else the user's TVM_NUM_THREADS, else
    every available core (TVM's own default is half the hardware threads: one on 2 cores)."""
    return int(num_threads or os.environ.get("TVM_NUM_THREADS") or host_core_count())


def configure_threads(num_threads: int | None = None) -> int:
    """Size the calling thread's TVM pool to `thread_count(num_threads)` threads; returns it.

    The count goes to TVM itself, not through the environment (a library call leaves that
    alone): `runtime.config_threadpool` with a CPU list of that length, which is what raises
    the thread's limit (TVM's `max_concurrency`) from its default. In mode 1 (big cores) the
    list's entries pin nothing. TVM keeps one pool per thread and sizes it when the thread first
    runs a kernel, so call this first: afterwards a pool can only shrink. A worker process
    (a runner's) calls it as its initializer, the count its argument.
    """
    count = thread_count(num_threads)
    config = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if config is not None:
        config(1, count, [str(cpu) for cpu in range(count)])  # mode 1 = big cores
    return count

