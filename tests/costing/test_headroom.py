"""Trials by headroom: the empirical roofline of default schedules, and where the budget goes."""

import math

import pytest
import tvm
from tvm import relax

from korch_tvm.backend.target import parse_target
from korch_tvm.costing.cost_model import KernelShape, kernel_shape
from korch_tvm.costing.headroom import (MIN_HEADROOM, Roofline, empirical_roofline, headroom,
                                        kernel_headrooms)
from korch_tvm.costing.measure import trial_allocation
from korch_tvm.costing.metaschedule_setup import SAMPLES
from korch_tvm.costing.tuning_log import TuningLog

TARGET = parse_target({"kind": "llvm", "num-cores": 2})


def legalized_kernel(size: int, op=relax.op.matmul) -> tvm.IRModule:
    """`op(x, x)` of a `size`x`size` matrix, legalized, as a standalone `main` PrimFunc."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(x, x)))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def shape(flops: float, bytes_moved: int) -> KernelShape:
    return KernelShape(bytes_in=bytes_moved, bytes_out=0, flops=flops, blocks=1,
                       reduction_blocks=1, params=2, reduction_flops=flops)


def test_roofline_is_the_best_rates_and_the_least_time():
    shapes = {"conv": shape(2e9, 10**6), "slow_conv": shape(2e9, 10**6),
              "add": shape(1e6, 8 * 10**6), "failed": shape(1e9, 10**6)}
    seconds = {"conv": 0.01, "slow_conv": 0.04, "add": 0.0004, "failed": math.inf}
    roofline = empirical_roofline(shapes, seconds)
    assert roofline == Roofline(flops_per_second=2e11, bytes_per_second=2e10,
                                least_seconds=0.0004)
    assert roofline.floor_seconds(shapes["slow_conv"]) == pytest.approx(0.01)   # compute-bound
    assert roofline.floor_seconds(shape(1e3, 10**3)) == 0.0004                  # a call's least
    assert roofline.floor_seconds(shape(0, 4 * 10**7)) == pytest.approx(0.002)  # memory-bound
    assert headroom(0.04, 0.01) == pytest.approx(0.75)
    assert headroom(0.01, 0.01) == MIN_HEADROOM  # on the roofline: a little, never nothing
    assert empirical_roofline(shapes, {"failed": math.inf}) is None


def test_kernel_headrooms_read_flops_and_bytes_from_the_kernels():
    kernels = {"small": legalized_kernel(32), "large": legalized_kernel(64)}
    small, large = kernel_shape(kernels["small"]), kernel_shape(kernels["large"])
    assert (small.reduction_flops, large.reduction_flops) == (2 * 32**3, 2 * 64**3)
    # elementwise math is not multiply-adds: it never sets the roofline's FLOP rate
    elementwise = kernel_shape(legalized_kernel(64, relax.op.add))
    assert elementwise.flops > 0 and elementwise.reduction_flops == 0
    # the large matmul runs at a quarter of the small one's FLOP rate: 3/4 of its time is headroom
    seconds = {"small": 1e-5, "large": 4 * 8 * 1e-5}
    headrooms = kernel_headrooms(kernels, seconds)
    assert headrooms == {"small": MIN_HEADROOM, "large": pytest.approx(0.75)}
    assert kernel_headrooms(kernels, {"small": math.inf}) == {}


def test_trials_go_where_time_can_be_saved(tmp_path):
    """Two kernels with the same latency share: the one already on the roofline gets the
    minimum, the one four times above its floor the rest; the split is read from the log's
    default-schedule records, so a re-run sees the same allocation."""
    kernels = {"small": legalized_kernel(32), "large": legalized_kernel(64)}
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernels["small"], [1e-5] * SAMPLES)
    log.commit_run(kernels["large"], [32e-5] * SAMPLES)
    shares = {"small": 1.0, "large": 1.0}
    allocation = trial_allocation(kernels, shares, 40, log)
    assert allocation == {"small": 4, "large": 36}
    # a later, faster record (a tuned schedule) does not move the split
    log.commit_run(kernels["large"], [8e-5] * SAMPLES)
    assert trial_allocation(kernels, shares, 40, TuningLog(tmp_path, TARGET)) == allocation


def test_trials_on_kernels_the_plan_left_count_toward_the_budget(tmp_path):
    """A kernel named twice is one kernel (shares added, one target); trials the log holds for
    a kernel the plan no longer chooses count toward the budget, so a re-solve that swapped it
    out does not earn the next compile more trials at the same budget."""
    kernels = {"small": legalized_kernel(32), "large": legalized_kernel(64),
               "twin": legalized_kernel(64)}
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernels["small"], [1e-5] * SAMPLES)
    log.commit_run(kernels["large"], [32e-5] * SAMPLES)
    allocation = trial_allocation(kernels, {"small": 1.0, "large": 0.5, "twin": 0.5}, 40, log)
    assert allocation == {"small": 4, "large": 36, "twin": 36}
    log.add_tuning_attempts(kernels["small"], 4)   # the compile tunes as allotted
    log.add_tuning_attempts(kernels["large"], 36)
    assert trial_allocation(kernels, {"small": 1.0}, 40, log) == {"small": 0}
    assert trial_allocation({"small": kernels["small"]}, {"small": 1.0}, 40, log) == {"small": 40}
    assert trial_allocation(kernels, {"small": 1.0}, 80, log) == {"small": 44}
