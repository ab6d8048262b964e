"""How far each kernel is from its floor, judged by an empirical roofline of the kernels at hand.

Tuning pays where a kernel runs well below what the machine does elsewhere: kernels near their
floor gained little from their trials, kernels far above it mostly gained much
(bench/headroom_gain.py). So the trial budget is split by the time a kernel could save, its
latency share times its headroom `1 - floor / time`, rather than by its share alone
(bench/results/headroom-allocation/ compares the two).

The roofline is read from the kernels' own default-schedule times: the best rate of
multiply-adds (reduction FLOPs, what a peak is stated in) and the best byte rate any of them
reached, and the fastest of them as the least a kernel call costs. No target states its peak
reliably (the analytic constants in cost_model are deliberately rough), and the same default
times weight the allocation, so it is the same on every compile and a re-run still finds every
kernel tuned as far as its allocation asks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import tvm

from .cost_model import (CPU_LAUNCH_SECONDS, GPU_LAUNCH_SECONDS, KernelShape, analytic_estimate,
                         kernel_shape)

logger = logging.getLogger(__name__)

# The roofline is a lower bound of the machine's (the best of a few default schedules), so a
# kernel on it may still gain a little; it keeps this fraction of its share rather than none.
# This also keeps a lone kernel tunable: it is its own roofline.
MIN_HEADROOM = 0.1
# A logged time this many times above both the kernel's analytic floor and its prediction is
# more likely a stalled run (a busy machine, a page fault storm) than the kernel. It is
# measured again before it is used.
IMPLAUSIBLE_FACTOR = 20.0


@dataclass(frozen=True)
class Roofline:
    """The best rates the kernels reached, and the least time any of them took."""

    flops_per_second: float
    bytes_per_second: float
    least_seconds: float

    def floor_seconds(self, shape: KernelShape) -> float:
        """The time under which this roofline says `shape` cannot run."""
        compute = (shape.reduction_flops / self.flops_per_second
                   if self.flops_per_second > 0 else 0.0)
        memory = (shape.bytes_in + shape.bytes_out) / self.bytes_per_second
        return max(self.least_seconds, compute, memory)


def empirical_roofline(shapes: Mapping[str, KernelShape],
                       seconds: Mapping[str, float]) -> Roofline | None:
    """The roofline of kernels timed at `seconds` (finite, positive); None with none such."""
    timed = [name for name in shapes
             if math.isfinite(seconds.get(name, math.inf)) and seconds[name] > 0]
    if not timed:
        return None
    return Roofline(
        flops_per_second=max(shapes[name].reduction_flops / seconds[name] for name in timed),
        bytes_per_second=max((shapes[name].bytes_in + shapes[name].bytes_out) / seconds[name]
                             for name in timed),
        least_seconds=min(seconds[name] for name in timed),
    )


def headroom(seconds: float, floor_seconds: float) -> float:
    """The fraction of `seconds` above the floor, at least MIN_HEADROOM."""
    return max(MIN_HEADROOM, 1.0 - floor_seconds / seconds)


def kernel_headrooms(kernels: Mapping[str, tvm.IRModule],
                     seconds: Mapping[str, float]) -> dict[str, float]:
    """Each timed kernel's headroom under the roofline of all of them (untimed ones: none)."""
    shapes = {name: kernel_shape(kernels[name]) for name in seconds
              if math.isfinite(seconds[name]) and seconds[name] > 0}
    roofline = empirical_roofline(shapes, seconds)
    if roofline is None:
        return {}
    logger.info("trial allocation: roofline of %d default schedules: %.1f GFLOP/s, %.1f GB/s, "
                "%.1f us per call at least", len(shapes), roofline.flops_per_second / 1e9,
                roofline.bytes_per_second / 1e9, roofline.least_seconds * 1e6)
    return {name: headroom(seconds[name], roofline.floor_seconds(shape))
            for name, shape in shapes.items()}


def implausible(tuning_log, kernel_mod: tvm.IRModule, seconds: float, target,
                predictor) -> bool:
    """Whether the logged best `seconds` of a kernel is more than IMPLAUSIBLE_FACTOR times its
    analytic floor (cost_model's roofline) and its prediction (`predictor()` gives the
    predictor, made only when needed), and no schedule of it was measured twice (a time
    measured twice, e.g. by an earlier re-check, is the kernel's). Cheapest tests first: a
    warm compile asks this of every logged kernel."""
    launch = GPU_LAUNCH_SECONDS if target.kind.name == "cuda" else CPU_LAUNCH_SECONDS
    if not math.isfinite(seconds) or seconds <= IMPLAUSIBLE_FACTOR * launch:
        return False
    if seconds <= IMPLAUSIBLE_FACTOR * analytic_estimate(kernel_mod, target):
        return False
    if tuning_log.record_count(kernel_mod) > tuning_log.schedule_count(kernel_mod):
        return False
    try:
        prediction = float(predictor()(kernel_mod))
    except Exception:  # noqa: BLE001 - a failing model: the floor alone decides
        prediction = 0.0
    return seconds > IMPLAUSIBLE_FACTOR * prediction
