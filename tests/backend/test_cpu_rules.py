"""The per-kind rules of the CPU default schedule (backend/cpu_rules.py) and the finer compute
kinds they are chosen by (kernels.kinds.compute_kind): same numbers as the kernel as written, a
trace that replays, and the loops the rule exists for."""

import re

import numpy as np
import pytest
import tvm
from tvm import te, topi

from korch_tvm.backend.cpu_schedule import default_schedule
from korch_tvm.backend.schedule_variants import default_schedules
from korch_tvm.kernels.kinds import compute_kind

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _kernel(*tensors) -> tvm.IRModule:
    return tvm.IRModule({"main": te.create_prim_func(list(tensors)).with_attr("global_symbol",
                                                                              "main")})


def _run(mod: tvm.IRModule) -> np.ndarray:
    library = tvm.compile(mod, target=TARGET)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype(
        str(p.ty.dtype)), tvm.cpu()) for p in mod["main"].params]
    library["main"](*args)
    return args[-1].numpy()


def _batch_matmul(batch, rows, depth, cols, transposed=False):
    a = te.placeholder((batch, rows, depth), name="a")
    b = te.placeholder((batch, cols, depth) if transposed else (batch, depth, cols), name="b")
    k = te.reduce_axis((0, depth), "k")
    read = (lambda n, j: b[n, j, k]) if transposed else (lambda n, j: b[n, k, j])
    return _kernel(a, b, te.compute((batch, rows, cols),
                                    lambda n, i, j: te.sum(a[n, i, k] * read(n, j), axis=k)))


def _matmul(rows, depth, cols):
    a, b = te.placeholder((rows, depth), name="a"), te.placeholder((depth, cols), name="b")
    k = te.reduce_axis((0, depth), "k")
    return _kernel(a, b, te.compute((rows, cols), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k)))


def _replays(mod, schedule) -> None:
    replayed = tvm.s_tir.Schedule(mod)
    schedule.trace.apply_to_schedule(replayed, remove_postproc=False)
    tvm.ir.assert_structural_equal(replayed.mod, schedule.mod)


def test_a_prime_token_count_gets_a_vector_and_a_register_tile():
    """Attention's scores over 197 tokens: 197 has no divisor to vectorize or tile by, so the
    generic rule alone leaves the loops scalar; padded to 208 columns and 200 rows, the kernel
    accumulates 8 x 16 tiles, and its numbers stay those of the kernel as written."""
    mod = _batch_matmul(3, 197, 64, 197)
    generic = default_schedule(mod, TARGET, kind_rules=False).mod["main"].script()
    assert "T.vectorized(" not in generic and "T.unroll(" not in generic
    schedule = default_schedule(mod, TARGET)
    text = schedule.mod["main"].script()
    assert re.search(r"T\.vectorized\((T\.int64\()?16\)", text)
    assert re.search(r"T\.unroll\((T\.int64\()?8\)", text)
    assert re.search(r"\b208\b", text) and re.search(r"\b200\b", text)  # the padded extents
    np.testing.assert_allclose(_run(schedule.mod), _run(mod), rtol=1e-5, atol=1e-5)
    _replays(mod, schedule)


@pytest.mark.parametrize("rows, depth, cols", [(197, 96, 128), (1, 64, 1000), (37, 48, 197)])
def test_every_default_schedule_of_a_padded_kernel_keeps_its_numbers(rows, depth, cols):
    """Rows only (197 x 128), nothing (a 1-row head: padding one row to eight would cost
    more than it gains) and columns only (197 = prime, 37 rows tiled as they are)."""
    mod = _matmul(rows, depth, cols)
    for schedule in default_schedules(mod, TARGET):
        np.testing.assert_allclose(_run(schedule.mod), _run(mod), rtol=1e-4, atol=1e-4)
        _replays(mod, schedule)
    padded = bool(re.search(r"\b200\b", default_schedule(mod, TARGET).mod["main"].script()))
    assert padded == (rows == 197)


def test_a_kernel_that_needs_no_padding_is_scheduled_as_before():
    mod = _matmul(128, 64, 256)
    tvm.ir.assert_structural_equal(default_schedule(mod, TARGET).mod,
                                   default_schedule(mod, TARGET, kind_rules=False).mod)


def _conv(groups=1, stride=1, dilation=1, channels=16):
    x = te.placeholder((1, channels, 20, 20), name="x")
    w = te.placeholder((channels, channels // groups, 3, 3), name="w")
    if groups == 1:
        y = topi.nn.conv2d_nchw(x, w, stride, 1, dilation)
    elif groups == channels:
        y = topi.nn.depthwise_conv2d_nchw(x, te.placeholder((channels, 1, 3, 3), name="w"),
                                          stride, 1, dilation)
        return _kernel(x, y.op.input_tensors[1], y)
    else:
        y = topi.nn.group_conv2d_nchw(x, w, stride, 1, dilation, groups)
    return _kernel(x, w, y)


@pytest.mark.parametrize("make, kind", [
    (lambda: _batch_matmul(3, 197, 64, 197), "bmm"),
    (lambda: _batch_matmul(3, 197, 64, 197, transposed=True), "bmm_transposed"),
    (lambda: _matmul(1, 512, 1000), "matmul_few_rows"),
    (lambda: _matmul(128, 512, 1000), "matmul"),
    (lambda: _conv(), "conv"),
    (lambda: _conv(stride=2), "conv_strided"),
    (lambda: _conv(dilation=2), "conv_dilated"),
    (lambda: _conv(groups=4), "conv_grouped"),
    (lambda: _conv(groups=16), "conv_depthwise"),
])
def test_compute_kind_names_the_zoo_kinds(make, kind):
    assert compute_kind(make()["main"]) == kind


def test_an_embedding_lookup_is_a_gather():
    table = te.placeholder((1000, 64), name="table")
    ids = te.placeholder((8,), name="ids", dtype="int64")
    out = te.compute((8, 64), lambda i, j: table[ids[i], j], name="out")
    assert compute_kind(_kernel(table, ids, out)["main"]) == "gather"


def test_the_profiler_logs_a_padded_default_under_a_trace_that_rebuilds_it(tmp_path):
    """The log contract holds for padded kernels: the default measurement is recorded under
    the schedule's trace, and that trace rebuilds one of the measured schedules."""
    import tvm_ffi

    from korch_tvm.costing.measure import measure_kernels
    from korch_tvm.costing.tuning_log import TuningLog

    mod = _batch_matmul(2, 197, 32, 197)
    log = TuningLog(tmp_path, TARGET)
    cost = measure_kernels({"scores": mod}, TARGET, log)["scores"]
    assert cost.source == "measured" and 0 < cost.seconds < 1
    record = log.best_record(mod)
    applied = tvm.s_tir.Schedule(mod)
    record.trace.apply_to_schedule(applied, remove_postproc=False)
    assert any(tvm_ffi.structural_equal(applied.mod, schedule.mod)
               for schedule in default_schedules(mod, TARGET))
    assert re.search(r"\b208\b", applied.mod["main"].script())


def test_a_weight_is_never_padded_along_its_columns():
    """197 output columns read from a model constant (layout free): padding them would copy the
    whole weight on every call, so the columns stay as they are; as an activation they are
    padded."""
    mod = _matmul(64, 96, 197)
    as_weight = tvm.IRModule({"main": mod["main"].with_attr("layout_free_buffers", [1])})
    padded = [bool(re.search(r"\b208\b", default_schedule(m, TARGET, pack_weights=False)
                             .mod["main"].script())) for m in (mod, as_weight)]
    assert padded == [True, False]
    np.testing.assert_allclose(_run(default_schedule(as_weight, TARGET).mod), _run(mod),
                               rtol=1e-4, atol=1e-4)


def test_an_operand_read_at_a_fixed_slice_is_not_padded():
    """K read from a fused QKV tensor at slice 1, over 49 columns (7 x 7 windows): TVM's
    pad_einsum copied that operand wrong (NaN), so a block indexed by anything but block
    variables and 0 keeps the generic rule, and its numbers."""
    a = te.placeholder((49, 32), name="a")
    qkv = te.placeholder((3, 49, 32), name="qkv")
    k = te.reduce_axis((0, 32), "k")
    mod = _kernel(a, qkv, te.compute((49, 49), lambda i, j: te.sum(a[i, k] * qkv[1, j, k],
                                                                    axis=k)))
    schedule = default_schedule(mod, TARGET)
    assert "PadEinsum" not in [str(inst.kind.name) for inst in schedule.trace.insts]
    out = _run(schedule.mod)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _run(mod), rtol=1e-5, atol=1e-5)
    # the same contraction with the slice as an operand of its own is padded, as before
    plain = _batch_matmul(1, 49, 32, 49, transposed=True)
    assert "PadEinsum" in [str(inst.kind.name)
                           for inst in default_schedule(plain, TARGET).trace.insts]
