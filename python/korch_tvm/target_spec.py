"""Target specs -> TVM targets: the one place a user's target is read and checked.

`llvm` means *this* CPU: LLVM only emits AVX-512/AVX2 when it is told the `mcpu`, and TVM's
thread pool uses half the cores unless told otherwise, so both are detected and made explicit.
An `mcpu` must be one of LLVM's CPU names for the target's triple and a CUDA `arch` must read
`sm_<digits>`, both checked before TVM or LLVM sees them (LLVM would only complain on stderr, at
code generation); both end up in a tuning-log directory name (backend/target.py).

`KorchConfig` resolves its target here when it is made, so this module sits beside the config,
below every stage.
"""

from __future__ import annotations

import json
import os
import re

import tvm
from tvm.target import Target

from .errors import KorchError

SAFE_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,100}")
_CUDA_ARCH = re.compile(r"sm_[0-9]{2,3}[af]?")


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
        _check_cpu(spec)
    elif spec["kind"] == "cuda":
        for key, value in cuda_defaults().items():
            spec.setdefault(key, value)
        spec.setdefault("host", {"kind": "llvm", "mcpu": host_cpu_name()})
        if not (isinstance(spec["arch"], str) and _CUDA_ARCH.fullmatch(spec["arch"])):
            raise KorchError(f"CUDA arch {spec['arch']!r} is not of the form sm_<digits> "
                             "(e.g. sm_90)")
        if isinstance(spec["host"], dict) and "mcpu" in spec["host"]:
            _check_cpu(spec["host"])
    try:
        return Target(spec)
    except Exception as err:  # noqa: BLE001 - TVM raises many kinds here
        raise KorchError(f"TVM rejects target {spec}: {str(err).splitlines()[0]}") from None


def _check_cpu(spec: dict) -> None:
    """An llvm spec's `mcpu` must be a CPU LLVM knows for its triple (and a safe token)."""
    from tvm.target.codegen import llvm_get_cpu_archlist

    cpu = spec.get("mcpu")
    triple = spec.get("mtriple")
    if not (isinstance(cpu, str) and SAFE_TOKEN.fullmatch(cpu) and ".." not in cpu):
        raise KorchError(f"target mcpu {cpu!r} is not a CPU name; use e.g. 'generic' or "
                         "'znver4' (llc -mcpu=help lists them)")
    try:
        probe = Target({"kind": "llvm", **({"mtriple": triple} if triple else {})})
        known = set(llvm_get_cpu_archlist(probe))
    except Exception as err:  # noqa: BLE001 - TVM raises many kinds here
        raise KorchError(f"TVM rejects target triple {triple!r}: "
                         f"{str(err).splitlines()[0] if str(err) else err}") from None
    if cpu not in known and cpu != host_cpu_name():  # LLVM's own detection is trusted
        raise KorchError(f"target mcpu {cpu!r} is not a CPU LLVM knows for "
                         f"{triple or 'this host'}; use e.g. 'generic' (llc -mcpu=help lists "
                         "them)")


# The paper's GPU class (H100/H200, sm_90) with CUDA's static per-block limits; used where no
# GPU is visible, so that planning and code generation work on a CPU-only machine.
CUDA_FALLBACK = {"arch": "sm_90", "max_threads_per_block": 1024,
                 "max_shared_memory_per_block": 49152, "thread_warp_size": 32}


def cuda_defaults() -> dict:
    """Limits of the visible GPU (device 0), else `CUDA_FALLBACK`; explicit target fields win.

    `max_shared_memory_per_block` is the static per-block amount (48 KiB on every NVIDIA GPU);
    TVM's CUDA code generator allocates shared memory statically, so that is the usable limit.
    """
    try:
        device = tvm.cuda(0)
        if not (tvm.runtime.enabled("cuda") and device.exist):
            return dict(CUDA_FALLBACK)
        return {"arch": "sm_" + str(device.compute_version).replace(".", ""),
                "max_threads_per_block": int(device.max_threads_per_block),
                "max_shared_memory_per_block": int(device.max_shared_memory_per_block),
                "thread_warp_size": int(device.warp_size)}
    except Exception:  # noqa: BLE001 - no CUDA runtime, or a device that cannot be queried
        return dict(CUDA_FALLBACK)
