"""Check a tuned schedule against the kernel it schedules before any plan uses it.

MetaSchedule's runner only times a candidate schedule; nothing compares its outputs. A schedule
transformation that drops part of a kernel's work then wins by being fast (seen: a concat
computed inside a convolution's loop over half its output channels, leaving the other half
unwritten). Here a record's schedule and the kernel as
written run on the same seeded inputs, every output starting as NaN so that an element the
schedule never writes shows, and they must agree. The kernel as written is built for the host
CPU, which can build any TIR; the record is built for, and run on, its own target.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import tvm

from ..backend.cuda import cuda_device_present
from ..backend.target import device_for
from ..errors import error_summary
from ..kernels.fused import written_params

logger = logging.getLogger("korch_tvm.record_check")

# Of each output's largest magnitude: float32 sums reassociated by a schedule differ by ~1e-6 of
# it; a wrong or unwritten element differs by the order of the output itself.
TOLERANCE = 1e-3


@dataclass(frozen=True)
class Verdict:
    """How far a schedule's outputs are from the kernel's, relative to each output's scale."""

    error: float  # math.inf where the schedule leaves an element unwritten
    problem: str | None = None  # why the schedule could not be checked (it did not build/run)

    @property
    def wrong(self) -> bool:
        return self.problem is None and not self.error <= TOLERANCE

    def describe(self) -> str:
        if self.problem is not None:
            return f"not checked ({self.problem})"
        if math.isinf(self.error):
            return "leaves part of its output unwritten"
        return f"differs from the kernel by {self.error:.3g} of the output's scale"


def can_check(target) -> bool:
    """Whether records for `target` can run here: the host CPU (no cross triple), or CUDA with a
    GPU present. Records tuned through RPC on another machine are not checked here."""
    if target.kind.name == "llvm":
        from tvm.target.codegen import llvm_get_system_triple

        triple = str(target.attrs.get("mtriple") or llvm_get_system_triple())
        return triple.split("-")[0] == llvm_get_system_triple().split("-")[0]
    if target.kind.name == "cuda":
        return cuda_device_present()
    return False


class KernelReference:
    """One kernel's seeded inputs and its outputs as written, computed once for all records."""

    def __init__(self, kernel_mod: tvm.IRModule, seed: int = 0) -> None:
        self.kernel_mod = kernel_mod
        self.is_output = written_params(kernel_mod)
        rng = np.random.default_rng(seed)
        self.inputs = [_random_array(param, rng) for param, out in
                       zip(kernel_mod["main"].params, self.is_output) if not out]
        as_written = tvm.compile(kernel_mod, target=tvm.target.Target("llvm"))
        self.outputs = self._run(as_written, tvm.cpu(0))

    def check(self, trace, target) -> Verdict:
        """Build `trace` applied to the kernel for `target`, run it, compare with the kernel."""
        try:
            schedule = tvm.s_tir.Schedule(self.kernel_mod)
            trace.apply_to_schedule(schedule, remove_postproc=False)
            library = tvm.compile(schedule.mod, target=target)
            got = self._run(library, device_for(target))
        except Exception as err:  # noqa: BLE001 - TVM raises many kinds; the record is unjudged
            return Verdict(math.nan, error_summary(str(err)))
        return Verdict(max((_relative_error(g, w) for g, w in zip(got, self.outputs)),
                           default=0.0))

    def _run(self, library, device) -> list[np.ndarray]:
        inputs = iter(self.inputs)
        arrays = [tvm.runtime.tensor(_nan_like(param) if out else next(inputs), device)
                  for param, out in zip(self.kernel_mod["main"].params, self.is_output)]
        library["main"](*arrays)
        return [array.numpy() for array, out in zip(arrays, self.is_output) if out]


def _shape(param) -> list[int]:
    return [int(dim) for dim in param.ty.shape]


def _random_array(param, rng) -> np.ndarray:
    """Normal floats; integers and booleans zero (a valid index into any gathered axis)."""
    dtype = np.dtype(str(param.ty.dtype))
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(_shape(param)).astype(dtype)
    return np.zeros(_shape(param), dtype)


def _nan_like(param) -> np.ndarray:
    """An output buffer holding what no kernel writes: NaN, or the least integer."""
    dtype = np.dtype(str(param.ty.dtype))
    if np.issubdtype(dtype, np.floating):
        return np.full(_shape(param), np.nan, dtype)
    if np.issubdtype(dtype, np.integer):
        return np.full(_shape(param), np.iinfo(dtype).min, dtype)
    return np.ones(_shape(param), dtype)


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference where the kernel's output is finite, over its largest magnitude."""
    finite = np.isfinite(want)
    if not finite.any():
        return 0.0
    got, want = got[finite].astype("float64"), want[finite].astype("float64")
    if not np.isfinite(got).all():
        return math.inf
    scale = float(np.abs(want).max()) or 1.0
    return float(np.abs(got - want).max()) / scale


def first_correct(kernel_mod: tvm.IRModule, records, target, name: str = "kernel"
                  ) -> tuple[list, list[Verdict]]:
    """Check `records` (fastest first) until one agrees with the kernel.

    Returns the wrong records with their verdicts. A record that cannot be built or run here
    ends the search unjudged (with a warning): it stays the one builds use, as without a check.
    """
    if not records:
        return [], []
    try:
        reference = KernelReference(kernel_mod)
    except Exception as err:  # noqa: BLE001 - no reference, no judgement
        logger.warning("%s: cannot run the kernel as written to check its tuned records (%s)",
                       name, error_summary(str(err)))
        return [], []
    wrong, verdicts = [], []
    for record in records:
        verdict = reference.check(record.trace, target)
        if verdict.problem is not None:
            logger.warning("%s: a tuned record was %s", name, verdict.describe())
            break
        if not verdict.wrong:
            break
        wrong.append(record)
        verdicts.append(verdict)
    return wrong, verdicts
