"""Reductions along each row run as vector lanes walking the row; loops no vector divides end in
a scalar tail of their own."""

import numpy as np
import pytest
import tvm
from tvm import te, topi

from korch_tvm.backend.cpu_schedule import default_schedule
from korch_tvm.backend.row_reductions import LANES, MIN_ROW, is_row_reduction, whole_vectors
from korch_tvm.costing.trace_policy import check_record

from test_cpu_schedule import TARGET, _te_kernel, loop_kinds
from test_trace_policy import _as_logged


def softmax(shape) -> tvm.IRModule:
    """Softmax over the last axis, as Korch's primitives write it (max, subtract, exp, sum,
    divide), with TOPI's vectorisable exp."""
    x = te.placeholder(shape, name="x")
    exp = topi.fast_exp(topi.subtract(x, topi.max(x, axis=-1, keepdims=True)))
    return _te_kernel(x, topi.divide(exp, topi.sum(exp, axis=-1, keepdims=True)))


def centred(shape) -> tvm.IRModule:
    """A layer norm's first piece: each row less its mean."""
    x = te.placeholder(shape, name="x")
    mean = topi.divide(topi.sum(x, axis=-1, keepdims=True), float(shape[-1]))
    return _te_kernel(x, topi.subtract(x, mean))


def matmul(transposed: bool) -> tvm.IRModule:
    """(64 x 96) @ (96 x 80), the second operand stored transposed (as attention's K) or not."""
    a = te.placeholder((64, 96), name="a")
    b = te.placeholder((80, 96) if transposed else (96, 80), name="b")
    k = te.reduce_axis((0, 96), name="k")
    return _te_kernel(a, b, te.compute(
        (64, 80), lambda i, j: te.sum(a[i, k] * (b[j, k] if transposed else b[k, j]), axis=k),
        name="c"))


def reduction_blocks(mod: tvm.IRModule) -> dict[str, bool]:
    """Each reduction block of `mod` (by name) and whether it is a row reduction."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    schedule = tvm.s_tir.Schedule(mod)
    return {schedule.get(block.block_rv).name_hint: is_row_reduction(schedule, block)
            for block in normalize_prim_func(schedule)
            if any(iterator.kind == "R" for iterator in block.iters)}


def run(mod: tvm.IRModule, shape) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).normal(0.0, 3.0, shape).astype("float32")
    out = tvm.runtime.tensor(np.zeros(shape, "float32"))
    tvm.compile(mod, target=TARGET)["main"](tvm.runtime.tensor(x), out)
    return x.astype(np.float64), out.numpy()


def instructions(schedule) -> list[str]:
    return [str(inst.kind.name) for inst in schedule.trace.insts]


def test_reductions_along_one_input_s_rows_are_row_reductions_contractions_are_not():
    assert reduction_blocks(softmax((1, 3, 197, 197))) == {"x_red": True, "T_fast_exp_red": True}
    assert reduction_blocks(centred((1, 128, 768))) == {"x_red": True}
    # a matmul reads two operands along its reduction, also with the second one transposed
    assert reduction_blocks(matmul(transposed=False)) == {"c": False}
    assert reduction_blocks(matmul(transposed=True)) == {"c": False}
    # rows shorter than MIN_ROW are a vector or two: the generic rule keeps them
    assert reduction_blocks(softmax((1, 4, 8, MIN_ROW - 1))) == {"x_red": False,
                                                                 "T_fast_exp_red": False}


def test_an_argmax_along_rows_keeps_the_generic_rule():
    """It writes an index and a value per row: not one value, not a row reduction here."""
    x = te.placeholder((4, 64), name="x")
    mod = _te_kernel(x, topi.argmax(x, axis=-1))
    assert list(reduction_blocks(mod).values()) == [False]
    scheduled = default_schedule(mod, TARGET)
    assert "RFactor" not in instructions(scheduled)


def test_a_column_reduction_is_not_a_row_reduction():
    x = te.placeholder((64, 48), name="x")
    k = te.reduce_axis((0, 64), name="k")
    mod = _te_kernel(x, te.compute((48,), lambda j: te.sum(x[k, j], axis=k), name="cols"))
    assert reduction_blocks(mod) == {"cols": False}


@pytest.mark.parametrize("shape,tail", [((1, 3, 197, 197), True), ((1, 4, 64, 128), False)])
def test_softmax_reduces_each_row_in_vector_lanes_and_matches_numpy(shape, tail):
    """197 tokens (a prime): 12 whole vectors and a tail of 5 in the max, the sum and the
    division; 128: whole vectors only."""
    mod = softmax(shape)
    scheduled = default_schedule(mod, TARGET)
    kinds = instructions(scheduled)
    assert kinds.count("RFactor") == 2  # the max and the sum, LANES partial results each
    assert kinds.count("LoopPartition") == (3 if tail else 0)
    assert {"parallel", "vectorized"} <= loop_kinds(scheduled.mod["main"])
    text = scheduled.mod["main"].script()
    assert f"T.vectorized({LANES})" in text
    assert ("range(192, 197)" in text) == tail  # the division's tail, scalar
    x, out = run(scheduled.mod, shape)
    expected = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out, expected / expected.sum(-1, keepdims=True),
                               rtol=1e-5, atol=1e-7)
    replayed = tvm.s_tir.Schedule(mod)  # the trace is the kernel's record in the log
    scheduled.trace.apply_to_schedule(replayed, remove_postproc=False)
    tvm.ir.assert_structural_equal(replayed.mod, scheduled.mod)
    check_record(_as_logged(scheduled, mod, TARGET))  # and the log's policy allows it


@pytest.mark.parametrize("shape", [(1, 197, 192), (1, 50, 200)])
def test_a_rows_mean_taken_away_matches_numpy(shape):
    scheduled = default_schedule(centred(shape), TARGET)
    assert instructions(scheduled).count("RFactor") == 1
    x, out = run(scheduled.mod, shape)
    np.testing.assert_allclose(out, x - x.mean(-1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_an_elementwise_loop_no_vector_divides_is_vectorized_up_to_its_tail():
    shape = (591, 197)
    x = te.placeholder(shape, name="x")
    scheduled = default_schedule(_te_kernel(x, topi.fast_exp(x)), TARGET)
    text = scheduled.mod["main"].script()
    assert f"T.vectorized({LANES})" in text and "range(192, 197)" in text
    assert "T.parallel(591)" in text
    data, out = run(scheduled.mod, shape)
    np.testing.assert_allclose(out, np.exp(data), rtol=1e-5)


@pytest.mark.parametrize("extent,covered", [(197, 192), (50, 48), (MIN_ROW - 1, None),
                                            (64, None), (13, None)])
def test_whole_vectors_cover_a_loop_up_to_its_tail(extent, covered):
    assert whole_vectors(extent) == covered
