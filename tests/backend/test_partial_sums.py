"""A reduction to a handful of values is summed in parallel vectors of partial sums."""

import re

import numpy as np
import pytest
import tvm
from tvm import te

from korch_tvm.backend.cpu_schedule import default_schedule
from korch_tvm.backend.partial_sums import PARTS

from test_cpu_schedule import TARGET, _te_kernel, loop_kinds


def whole_sum(shape, keep: int = 0) -> tvm.IRModule:
    """The sum of an NHWC tensor over every axis after the first `keep + 1` (batch, then `keep`
    kept axes), as a kernel."""
    a = te.placeholder(shape, name="a")
    axes = [te.reduce_axis((0, n), name=f"k{i}") for i, n in enumerate(shape[1 + keep:])]

    def body(*kept):
        return te.sum(a[(*kept, *axes)], axis=axes)

    return _te_kernel(a, te.compute(shape[:1 + keep], body, name="total"))


def blocks_of(func) -> list[str]:
    return [line.split('"')[1] for line in func.script().splitlines() if "T.sblock(" in line]


def partial_buffer_parts(func) -> int:
    """The first extent of the partial sums' buffer."""
    line = next(line for line in func.script().splitlines() if "total_rf = " in line)
    return int(re.search(r"\(\((?:T\.int64\()?(\d+)", line).group(1))


def run(mod, shape):
    library = tvm.compile(mod, target=TARGET)
    x = np.random.default_rng(0).uniform(0.0, 1.0, shape).astype("float32")
    out = tvm.runtime.tensor(np.zeros([int(d) for d in mod["main"].params[-1].ty.shape],
                                      "float32"))
    library["main"](tvm.runtime.tensor(x), out)
    return x, out.numpy()


@pytest.mark.parametrize("shape,parts", [((1, 56, 56, 64), 64), ((1, 14, 14, 40), 8)])
def test_a_whole_tensor_sum_runs_as_parallel_vectors_of_partial_sums(shape, parts):
    mod = whole_sum(shape)
    scheduled = default_schedule(mod, TARGET)
    func = scheduled.mod["main"]
    assert "total_rf_update" in blocks_of(func)
    assert {"parallel", "vectorized"} <= loop_kinds(func)
    assert partial_buffer_parts(func) == parts
    x, total = run(scheduled.mod, shape)
    np.testing.assert_allclose(total, x.astype(np.float64).sum(), rtol=1e-5)
    replayed = tvm.s_tir.Schedule(mod)  # the trace is the kernel's record in the log
    scheduled.trace.apply_to_schedule(replayed, remove_postproc=False)
    tvm.ir.assert_structural_equal(replayed.mod, scheduled.mod)


@pytest.mark.parametrize("shape,keep", [((1, 56, 56, 64), 1), ((1, 16, 16, 8), 0),
                                        ((1, 9, 9, 65), 0)])
def test_reductions_with_outputs_to_spread_or_little_to_sum_keep_the_generic_rule(shape, keep):
    """56 outputs to spread over the cores; 2048 elements; an innermost extent of 65 that no
    part count divides: none is split into partial sums."""
    assert 65 % min(PARTS)
    func = default_schedule(whole_sum(shape, keep), TARGET).mod["main"]
    assert not any("_rf" in name for name in blocks_of(func))
