"""Target strings -> TVM targets, and the stable tag that names a tuning-log directory.

`llvm` means *this* CPU: LLVM only emits AVX-512/AVX2 when it is told the `mcpu`, and TVM's
thread pool uses half the cores unless told otherwise, so both are detected and made explicit.
"""

from __future__ import annotations

import json
import os
import re

import tvm
from tvm.target import Target

from .errors import KorchError


def host_cpu_name() -> str:
    """LLVM's name for the host CPU (e.g. `znver4`), or `generic` when LLVM cannot tell."""
    try:
        return str(tvm.target.codegen.llvm_get_system_cpu()) or "generic"
    except Exception:  # an LLVM without host detection  # noqa: BLE001
        return "generic"


def host_core_count() -> int:
    """Cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_target(spec: str | dict | Target = "llvm") -> Target:
    """Accept `llvm`, `cuda`, a JSON target dict (or its text), or a ready `Target`.

    A bare `llvm` is completed with the host's `mcpu` and core count; explicit fields win.
    """
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, str):
        text = spec.strip()
        if text.startswith("{"):
            try:
                spec = json.loads(text)
            except json.JSONDecodeError as err:
                raise KorchError(f"target JSON is not valid: {err}") from None
        elif re.fullmatch(r"[a-z_]+", text):
            spec = {"kind": text}
        else:
            raise KorchError(
                f"target '{spec}' is not understood; use 'llvm', 'cuda' or a JSON dict such as "
                '\'{"kind": "llvm", "mcpu": "znver4", "num-cores": 2}\''
            )
    if not isinstance(spec, dict) or "kind" not in spec:
        raise KorchError(f"target must name its 'kind', got {spec!r}")
    spec = dict(spec)
    if spec["kind"] == "llvm":
        spec.setdefault("mcpu", host_cpu_name())
        spec.setdefault("num-cores", host_core_count())
    elif spec["kind"] == "cuda":
        for key, value in cuda_defaults().items():
            spec.setdefault(key, value)
        spec.setdefault("host", {"kind": "llvm", "mcpu": host_cpu_name()})
    try:
        return Target(spec)
    except Exception as err:  # noqa: BLE001 - TVM raises many kinds here
        raise KorchError(f"TVM rejects target {spec}: {str(err).splitlines()[0]}") from None


# The paper's GPU class (H100/H200, sm_90) with CUDA's static per-block limits; used where no
# GPU is visible, so that planning and code generation work on a CPU-only machine.
CUDA_FALLBACK = {"arch": "sm_90", "max_threads_per_block": 1024,
                 "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def cuda_defaults() -> dict:
    """Limits of the visible GPU (device 0), else `CUDA_FALLBACK`; explicit target fields win.

    `max_shared_memory_per_block` is the static per-block amount (48 KiB on every NVIDIA GPU);
    TVM's CUDA code generator allocates shared memory statically, so that is the usable limit.
    """
    from .cuda_build import cuda_device_present

    if not cuda_device_present():
        return dict(CUDA_FALLBACK)
    try:
        device = tvm.cuda(0)
        return {"arch": "sm_" + str(device.compute_version).replace(".", ""),
                "max_threads_per_block": int(device.max_threads_per_block),
                "max_shared_memory_per_block": int(device.max_shared_memory_per_block),
                "thread_warp_size": int(device.warp_size)}
    except Exception:  # noqa: BLE001 - a device that cannot be queried: the fallback
        return dict(CUDA_FALLBACK)


def target_tag(target: Target) -> str:
    """A stable directory name for tuning logs: kind, arch/mcpu and core count.

    Two machines with the same tag can share tuning records; anything that changes generated
    code or timings (CPU model, core count, GPU arch) changes the tag.
    """
    kind = target.kind.name
    if kind == "llvm":
        cpu = str(target.attrs.get("mcpu", "generic")) or "generic"
        cores = int(target.attrs.get("num-cores", 1))
        return f"llvm-{cpu}-{cores}c"
    if kind == "cuda":
        return f"cuda-{target.attrs.get('arch', 'unknown')}"
    return kind


def device_for(target: Target):
    """The runtime device that executes code built for `target`."""
    return tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)


def configure_threads(num_threads: int | None = None) -> int:
    """Pin TVM's CPU thread pool to `num_threads` (default: every available core).

    TVM's default is half the hardware threads, i.e. one thread on a 2-core machine. The
    environment variable is read when the pool is first made; the global call resizes an
    existing pool, so this works before and after the first kernel runs.
    """
    count = int(num_threads or os.environ.get("TVM_NUM_THREADS") or host_core_count())
    os.environ["TVM_NUM_THREADS"] = str(count)
    config = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if config is not None:
        config(1, count)  # mode 1 = big cores; one worker per requested thread
    return count
