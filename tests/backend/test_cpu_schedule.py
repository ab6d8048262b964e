"""The CPU default schedule: same numbers as the kernel as written, parallel and vectorized
loops, a trace that replays, and the build and the profiler using it for untuned kernels."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te, topi
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.script import tirx as T

from conftest import make_tiny_onnx
from test_weight_packing import conv_block_onnx
from korch_tvm.backend.cpu_schedule import (DEFAULT_SCHEDULE_ATTR, PAIR_COLUMNS, WIDE_TILE_ROWS,
                                            _row_loop, default_schedule)
from korch_tvm.backend.schedule_variants import default_schedules
from korch_tvm.backend.tile_shape import tile_rows
from korch_tvm.backend.rewrite import apply_tuning_log, scheduled_kernel_count
from korch_tvm.costing.measure import measure_kernels
from korch_tvm.costing.tuning_log import TuningLog
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.kernels.fused import canonical_prim_func, kernel_module
from korch_tvm.pipeline.stock import stock_fusion

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def fused_kernels(model) -> dict[str, tvm.IRModule]:
    """Every PrimFunc TVM's fusion makes of `model`, as a standalone canonical kernel."""
    fused = stock_fusion(import_onnx(model), TARGET)
    return {gv.name_hint: kernel_module(canonical_prim_func(func))
            for gv, func in fused.functions_items() if isinstance(func, tvm.tirx.PrimFunc)}


def loop_kinds(func) -> set:
    """The kinds of the PrimFunc's loops, read from its TVMScript ("parallel", "vectorized")."""
    text = func.script()
    return {kind for kind in ("parallel", "vectorized", "unroll") if f"T.{kind}(" in text}


def run_kernel(mod: tvm.IRModule, seed: int = 0) -> np.ndarray:
    """Build `mod` and run it on seeded inputs; returns the last (output) buffer."""
    library = tvm.compile(mod, target=TARGET)
    rng = np.random.default_rng(seed)
    device = tvm.cpu()
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype(
        str(p.ty.dtype)), device) for p in mod["main"].params]
    library["main"](*args)
    return args[-1].numpy()


@pytest.fixture(scope="module")
def kernels():
    found = {**fused_kernels(make_tiny_onnx(rows=32, cols=64)), **fused_kernels(conv_block_onnx())}
    assert len(found) >= 6  # softmax parts, matmul + add, layer norm, three conv kernels
    return found


def test_every_kernel_scheduled_with_the_numbers_it_had(kernels):
    for name, mod in kernels.items():
        schedule = default_schedule(mod, TARGET)
        assert schedule is not None, name
        kinds = loop_kinds(schedule.mod["main"])
        assert "parallel" in kinds, name
        np.testing.assert_allclose(run_kernel(schedule.mod), run_kernel(mod), rtol=1e-5,
                                   atol=1e-5, err_msg=name)


def test_matmul_and_conv_accumulate_a_vector_of_outputs(kernels):
    vectorized = [name for name, mod in kernels.items()
                  if "vectorized" in loop_kinds(default_schedule(mod, TARGET)
                                                               .mod["main"])]
    assert any("matmul" in name for name in vectorized)
    assert sum("conv2d" in name for name in vectorized) == 3


def test_linear_kernels_accumulate_a_register_tile_stored_once_with_their_epilogue(kernels):
    """Matmul and convolutions keep a tile of (up to TILE_ROWS) x one vector of outputs in a local
    buffer; their bias add (and ReLU) is applied as the tile is stored, so no intermediate
    tensor of the whole output is left (a padded convolution's padded input aside)."""
    linear = {name: mod for name, mod in kernels.items() if "matmul" in name or "conv2d" in name}
    assert len(linear) == 4
    for name, mod in linear.items():
        text = default_schedule(mod, TARGET, pack_weights=False).mod["main"].script()
        assert 'scope="local"' in text and "T.unroll(" in text, name
        padded = text.count('T.sblock("pad_temp")')
        assert padded <= 1, name
        assert text.count("T.sblock_alloc_buffer(") == 1 + padded, name  # the accumulators


def test_weights_are_packed_in_the_order_the_tile_reads_them(kernels):
    """A matmul's [K, N] weight becomes [N / 16, K, 16]: the vector of 16 columns a tile loads
    per reduction step is contiguous, and the strip it streams is one block. The repacking is
    a separate block marked for SplitLayoutRewritePreproc, so the kernel still takes the
    model's layout and computes the same numbers."""
    (name,) = [name for name in kernels if "matmul" in name]
    mod = kernels[name]
    weight = mod["main"].params[1]
    assert list(mod["main"].attrs["layout_free_buffers"]) == [1, 2]  # weight and bias
    k, n = [int(dim) for dim in weight.ty.shape]
    packed = default_schedule(mod, TARGET)
    text = packed.mod["main"].script()
    assert text.count('"meta_schedule.layout_rewrite_preproc": True') == 2, text
    assert f"T.sblock_alloc_buffer((T.int64({n // 16}), T.int64({k}), T.int64(16)))" in text
    np.testing.assert_allclose(run_kernel(packed.mod), run_kernel(mod), rtol=1e-5, atol=1e-5)
    replayed = tvm.s_tir.Schedule(mod)
    packed.trace.apply_to_schedule(replayed, remove_postproc=False)
    assert tvm_ffi.structural_equal(replayed.mod, packed.mod)
    # a small kernel is measured in its packed form alone (see default_schedules)
    (form,) = default_schedules(mod, TARGET)
    assert tvm_ffi.structural_equal(form.mod, packed.mod)


def test_a_large_kernel_is_measured_with_its_weights_packed_and_as_the_model_has_them():
    """Packing slows a few large kernels down, so the profiler measures both and keeps the
    faster; under VARIANT_MIN_FLOPS the two differ by noise and only the packed one is run."""
    from korch_tvm.backend.schedule_variants import VARIANT_MIN_FLOPS
    from korch_tvm.kernels.fused import kernel_flops
    from korch_tvm.kernels.weight_packing import with_layout_free

    def matmul(rows):
        x = te.placeholder((rows, 256), name="x")
        weight = te.placeholder((256, 256), name="weight")
        k = te.reduce_axis((0, 256), name="k")
        out = te.compute((rows, 256), lambda i, j: te.sum(x[i, k] * weight[k, j], axis=k))
        func = te.create_prim_func([x, weight, out]).with_attr("global_symbol", "main")
        return tvm.IRModule({"main": with_layout_free(func, [1])})

    large, small = matmul(256), matmul(16)
    assert kernel_flops(small) < VARIANT_MIN_FLOPS <= kernel_flops(large)
    forms = default_schedules(large, TARGET)
    assert tvm_ffi.structural_equal(forms[0].mod, default_schedule(large, TARGET).mod)
    assert tvm_ffi.structural_equal(
        forms[1].mod, default_schedule(large, TARGET, pack_weights=False).mod)
    assert len(forms) >= 3  # and the tile variants
    (form,) = default_schedules(small, TARGET)
    assert tvm_ffi.structural_equal(form.mod, default_schedule(small, TARGET).mod)


def _te_kernel(*tensors) -> tvm.IRModule:
    return tvm.IRModule({"main": te.create_prim_func(list(tensors)).with_attr("global_symbol",
                                                                              "main")})


@pytest.mark.parametrize("form, reused", [("matmul", "i"), ("nchw", "co"), ("nhwc", "w")])
def test_register_tile_rows_run_along_what_the_vector_loads_do_not_depend_on(form, reused):
    """The rows share each loaded vector: a matmul's rows (B is loaded along j), an NCHW
    convolution's output channels (the input is loaded along w), an NHWC one's output pixels
    (the weight is loaded along output channels)."""
    if form == "matmul":
        a, b = te.placeholder((32, 48), name="a"), te.placeholder((48, 64), name="b")
        k = te.reduce_axis((0, 48), "k")
        out = te.compute((32, 64), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="out")
        mod, spatial = _te_kernel(a, b, out), ["i", "j"]
    elif form == "nchw":
        x, w = te.placeholder((1, 8, 16, 16), name="x"), te.placeholder((16, 8, 3, 3), name="w")
        out = topi.nn.conv2d_nchw(x, w, 1, 1, 1)
        mod, spatial = _te_kernel(x, w, out), ["co", "h", "w"]
    else:
        x, w = te.placeholder((1, 16, 16, 8), name="x"), te.placeholder((3, 3, 8, 16), name="w")
        out = topi.nn.conv2d_nhwc(x, w, 1, 1, 1)
        mod, spatial = _te_kernel(x, w, out), ["h", "w", "co"]
    schedule = tvm.s_tir.Schedule(mod)
    normalize_prim_func(schedule)
    schedule.compute_inline(schedule.get_sblock("pad_temp")) if form != "matmul" else None
    block = next(b for b in normalize_prim_func(schedule) if any(i.kind == "R" for i in b.iters))
    assert spatial[_row_loop(schedule, block)] == reused
    np.testing.assert_allclose(run_kernel(default_schedule(mod, TARGET).mod), run_kernel(mod),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("extent, rows", [(104, 8), (52, 4), (24, 8), (26, 13), (13, 13),
                                          (28, 7), (17, 1), (1, 1)])
def test_tile_rows_divide_the_extent_and_reach_past_eight_only_when_little_divides(extent, rows):
    assert tile_rows(extent) == rows


def test_a_13x13_map_gets_13_tile_rows():
    """YOLOX-nano's 13x13 1x1 convolutions: no divisor from 4 to 8, so one row per pixel of a
    map row (not an untiled kernel); same numbers."""
    x, w = te.placeholder((1, 13, 13, 32), name="x"), te.placeholder((1, 1, 32, 16), name="w")
    mod = _te_kernel(x, w, topi.nn.conv2d_nhwc(x, w, 1, 0, 1))
    scheduled = default_schedule(mod, TARGET).mod
    assert "T.unroll(13)" in scheduled["main"].script()
    np.testing.assert_allclose(run_kernel(scheduled), run_kernel(mod), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, depth, width, expected", [
    (64, 512, 1024, ["rule", "wide", "vector outer", "pair", "vector outer pair"]),
    (26, 512, 1024, ["rule", "vector outer", "pair", "vector outer pair"]),  # 13 rows: no wide
    (64, 32, 48, ["rule"]),                      # under VARIANT_MIN_FLOPS
])
def test_large_kernels_get_the_variants_that_differ_from_the_rule(rows, depth, width, expected):
    """Each variant computes the same numbers, and its trace replays to what it built."""
    a, b = te.placeholder((rows, depth), name="a"), te.placeholder((depth, width), name="b")
    r = te.reduce_axis((0, depth), "r")
    mod = _te_kernel(a, b, te.compute((rows, width),
                                      lambda i, j: te.sum(a[i, r] * b[r, j], axis=r)))
    forms = {"rule": default_schedule(mod, TARGET),
             "wide": default_schedule(mod, TARGET, tile_rows=WIDE_TILE_ROWS),
             "vector outer": default_schedule(mod, TARGET, vector_outer=True),
             "pair": default_schedule(mod, TARGET, columns=PAIR_COLUMNS),
             "vector outer pair": default_schedule(mod, TARGET, vector_outer=True,
                                                   columns=PAIR_COLUMNS)}
    schedules = default_schedules(mod, TARGET)
    assert [next(name for name, form in forms.items()
                 if tvm_ffi.structural_equal(form.mod, schedule.mod))
            for schedule in schedules] == expected
    for schedule in schedules:
        np.testing.assert_allclose(run_kernel(schedule.mod), run_kernel(mod), rtol=1e-4, atol=1e-4)
        replayed = tvm.s_tir.Schedule(mod)
        schedule.trace.apply_to_schedule(replayed, remove_postproc=False)
        tvm.ir.assert_structural_equal(replayed.mod, schedule.mod)


def test_trace_replays_to_the_same_kernel(kernels):
    for name, mod in kernels.items():
        schedule = default_schedule(mod, TARGET)
        replayed = tvm.s_tir.Schedule(mod)
        schedule.trace.apply_to_schedule(replayed, remove_postproc=False)
        tvm.ir.assert_structural_equal(replayed.mod, schedule.mod)


@T.prim_func(private=True, s_tir=True)
def _dynamic_rows(a: T.handle, b: T.handle):
    n = T.int64()
    A = T.match_buffer(a, (n, T.int64(16)), "float32")
    B = T.match_buffer(b, (n, T.int64(16)), "float32")
    for i, j in T.grid(n, T.int64(16)):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SS", [i, j])
            B[vi, vj] = A[vi, vj] * T.float32(2)


def test_dynamic_extent_is_never_parallelized():
    schedule = default_schedule(tvm.IRModule({"main": _dynamic_rows}), TARGET)
    assert schedule is None or "parallel" not in loop_kinds(schedule.mod["main"])


def test_build_gives_untuned_kernels_the_default_schedule(tmp_path):
    fused = stock_fusion(import_onnx(conv_block_onnx()), TARGET)
    built = apply_tuning_log(fused, TuningLog(tmp_path, TARGET).database, TARGET)
    funcs = [f for _, f in built.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 3
    assert all(f.attrs[DEFAULT_SCHEDULE_ATTR] for f in funcs)
    assert all("parallel" in loop_kinds(f) for f in funcs)
    assert scheduled_kernel_count(built) == (0, 3)  # a default schedule is not a tuned one


def test_profiler_records_the_default_measurement_under_its_schedule(tmp_path, kernels):
    name = next(n for n in kernels if "matmul" in n)
    log = TuningLog(tmp_path, TARGET)
    cost = measure_kernels({name: kernels[name]}, TARGET, log)[name]
    assert cost.source == "measured" and cost.seconds > 0
    record = log.best_record(kernels[name])
    assert np.median([float(s) for s in record.run_secs]) == pytest.approx(cost.seconds, rel=1e-5)
    applied = tvm.s_tir.Schedule(kernels[name])
    record.trace.apply_to_schedule(applied, remove_postproc=False)
    schedules = default_schedules(kernels[name], TARGET)
    # every variant logged (a busy machine may time one twice: an implausible time is measured
    # again, costing/measure.py, and logged beside the first)
    logged = {str(record.trace) for record in log.database.get_all_tuning_records()}
    assert len(logged) == len(schedules)
    assert any(tvm_ffi.structural_equal(applied.mod, s.mod) for s in schedules)


def test_a_logged_as_written_record_is_built_with_the_default_schedule(tmp_path):
    """A log from before the default schedule existed holds as-written measurements; the build
    schedules those kernels all the same (their logged cost stays)."""
    fused = stock_fusion(import_onnx(conv_block_onnx()), TARGET)
    log = TuningLog(tmp_path, TARGET)
    for _, func in fused.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc):
            log.commit_run(kernel_module(canonical_prim_func(func)), [1e-3], trace=None)
    assert log.database.get_all_tuning_records() and len(log.kernels()) == 3
    built = apply_tuning_log(fused, log.database, TARGET)
    funcs = [f for _, f in built.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert all(f.attrs.get(DEFAULT_SCHEDULE_ATTR, False) for f in funcs)
    assert all("parallel" in loop_kinds(f) for f in funcs)


def test_a_bias_read_by_several_blocks_is_not_packed_for_one_of_them():
    """A bias add inlined into three slices (Swin-T's QKV projection): MetaSchedule's layout
    rewrite packed the bias for one slice's reads, and the other two read the wrong thirds."""
    from korch_tvm.kernels.weight_packing import read_by_one_block, with_layout_free

    bias = te.placeholder((48,), name="bias")
    x = te.placeholder((4, 7, 48), name="x")
    added = te.compute((4, 7, 48), lambda b, t, j: x[b, t, j] + bias[j], name="added")

    def third(i):
        return te.compute((4, 7, 16), lambda b, t, j: added[b, t, i * 16 + j], name=f"third{i}")

    func = te.create_prim_func([bias, x, *(third(i) for i in range(3))])
    mod = tvm.IRModule({"main": with_layout_free(func.with_attr("global_symbol", "main"), [0])})
    assert read_by_one_block(mod)  # as written, only the add reads the bias
    forms = default_schedules(mod, TARGET)
    assert forms and not any(read_by_one_block(form.mod) for form in forms)  # once inlined
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype("float32") for shape in [(48,), (4, 7, 48)]]

    def run(kernel):
        args = [tvm.runtime.tensor(a) for a in inputs] + [
            tvm.runtime.tensor(np.zeros((4, 7, 16), "float32")) for _ in range(3)]
        tvm.compile(kernel, target=TARGET)["main"](*args)
        return [a.numpy() for a in args[2:]]

    expected = run(mod)
    for form in forms:
        for got, want in zip(run(form.mod), expected):
            np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("readers", ["slices", "views"])
def test_a_matmul_read_by_several_outputs_keeps_its_result_for_each(readers):
    """A projection whose biased result several outputs read: the three slices of Swin-T's QKV
    projection, or two views of the whole result (SegFormer's reshape beside an offered
    alternative's reshape of it). The register tile's write-back took the first whole-result
    reader in and left the other reading a buffer nothing wrote any more, a kernel TVM refuses
    to build (ill-formed TIR)."""
    x = te.placeholder((64, 32), name="x")
    weight = te.placeholder((32, 48), name="weight")
    bias = te.placeholder((48,), name="bias")
    k = te.reduce_axis((0, 32), name="k")
    product = te.compute((64, 48), lambda i, j: te.sum(x[i, k] * weight[k, j], axis=k),
                         name="product")
    added = te.compute(product.shape, lambda i, j: product[i, j] + bias[j], name="added")

    def part(p):
        return te.compute((64, 16), lambda i, j: added[i, p * 16 + j], name=f"part{p}")

    if readers == "slices":
        outputs = [part(p) for p in range(3)]
    else:
        outputs = [te.compute((1, 64, 48), lambda o, i, j: added[i, j], name="view0"),
                   te.compute((64, 1, 48), lambda i, o, j: added[i, j], name="view1")]
    func = te.create_prim_func([x, weight, bias, *outputs]).with_attr("global_symbol", "main")
    forms = default_schedules(tvm.IRModule({"main": func}), TARGET)
    assert forms
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype("float32") for shape in [(64, 32), (32, 48), (48,)]]
    result = inputs[0] @ inputs[1] + inputs[2]
    expected = ([result[:, p * 16:(p + 1) * 16] for p in range(3)] if readers == "slices"
                else [result[None], result[:, None]])
    for form in forms:
        args = [tvm.runtime.tensor(a) for a in inputs] + [
            tvm.runtime.tensor(np.zeros(want.shape, "float32")) for want in expected]
        tvm.compile(form.mod, target=TARGET)["main"](*args)
        for got, want in zip(args[3:], expected):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
