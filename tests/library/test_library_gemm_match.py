"""match_gemm: which kernels are exactly one (batched) GEMM, with which operand roles."""

import tvm
from tvm import relax, te

from korch_tvm.library import GemmSpec, match_gemm


def legalized_kernels(shapes, body, dtype="float32"):
    """The PrimFuncs LegalizeOps + FuseOps + FuseTIR make of `body(*inputs)`, each as `main`."""
    bb = relax.BlockBuilder()
    inputs = [relax.Var(f"x{i}", relax.TensorType(s, dtype)) for i, s in enumerate(shapes)]
    with bb.function("main", inputs):
        with bb.dataflow():
            out = bb.emit_output(body(*inputs))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FuseOps(), relax.transform.FuseTIR()])(bb.get())
    return [tvm.IRModule({"main": f}) for _, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc)]


def te_kernel(*tensors):
    return tvm.IRModule({"main": te.create_prim_func(list(tensors))})


def test_plain_batched_and_shared_operand_matmuls_match():
    [plain] = legalized_kernels([(5, 7), (7, 3)], relax.op.matmul)
    assert match_gemm(plain) == GemmSpec((), 5, 3, 7, False, False, False, False, 0, 1)
    [batched] = legalized_kernels([(2, 5, 7), (2, 7, 3)], relax.op.matmul)
    assert match_gemm(batched) == GemmSpec((2,), 5, 3, 7, False, False, True, True, 0, 1)
    [shared_b] = legalized_kernels([(4, 2, 5, 7), (7, 3)], relax.op.matmul)
    spec = match_gemm(shared_b)
    assert (spec.batch_shape, spec.a_batched, spec.b_batched) == ((4, 2), True, False)
    assert (spec.a_shape(), spec.b_shape(), spec.c_shape()) == ((4, 2, 5, 7), (7, 3), (4, 2, 5, 3))
    assert spec.flops() == 2 * 8 * 5 * 3 * 7


def test_transposed_operands_and_swapped_inputs():
    a, b = te.placeholder((2, 5, 7), name="A"), te.placeholder((2, 3, 7), name="B")
    k = te.reduce_axis((0, 7), "k")
    qk = te.compute((2, 5, 3), lambda n, i, j: te.sum(a[n, i, k] * b[n, j, k], axis=k))
    spec = match_gemm(te_kernel(a, b, qk))
    assert (spec.transpose_a, spec.transpose_b, spec.m, spec.n, spec.k) == (False, True, 5, 3, 7)
    # operands multiplied B*A and passed (B, A): roles come from the indices, not the order
    swapped = te.compute((2, 5, 3), lambda n, i, j: te.sum(b[n, j, k] * a[n, i, k], axis=k))
    spec = match_gemm(te_kernel(b, a, swapped))
    assert (spec.a_input, spec.b_input, spec.transpose_b) == (1, 0, True)
    at = te.placeholder((7, 5), name="At")
    w = te.placeholder((7, 3), name="W")
    k2 = te.reduce_axis((0, 7), "k2")
    ta = te.compute((5, 3), lambda i, j: te.sum(at[k2, i] * w[k2, j], axis=k2))
    assert match_gemm(te_kernel(at, w, ta)).transpose_a is True


def test_a_fused_transpose_block_is_inlined_into_the_gemm():
    a, b = te.placeholder((2, 5, 7), name="A"), te.placeholder((2, 3, 7), name="B")
    k = te.reduce_axis((0, 7), "k")
    bt = te.compute((2, 7, 3), lambda n, kk, j: b[n, j, kk], name="T")
    out = te.compute((2, 5, 3), lambda n, i, j: te.sum(a[n, i, k] * bt[n, k, j], axis=k))
    spec = match_gemm(te_kernel(a, b, out))
    assert spec is not None and spec.transpose_b and spec.b_input == 1


def test_non_gemm_kernels_do_not_match():
    [epilogue] = legalized_kernels([(5, 7), (7, 3)],
                                   lambda x, y: relax.op.add(relax.op.matmul(x, y), relax.const(1.0)))
    assert match_gemm(epilogue) is None
    [half] = legalized_kernels([(5, 7), (7, 3)], relax.op.matmul, dtype="float16")
    assert match_gemm(half) is None
    [softmax] = legalized_kernels([(5, 7)], lambda x: relax.op.sum(x, axis=[1]))
    assert match_gemm(softmax) is None
    # a batch axis broadcast from size 1 on C's side is not a plain GEMM operand
    a, b = te.placeholder((2, 5, 7), name="A"), te.placeholder((2, 7, 3), name="B")
    k = te.reduce_axis((0, 7), "k")
    out = te.compute((2, 5, 3), lambda n, i, j: te.sum(a[0, i, k] * b[n, k, j], axis=k))
    assert match_gemm(te_kernel(a, b, out)) is None
    # a reduction over a slice of a larger buffer
    big = te.placeholder((5, 9), name="Big")
    w = te.placeholder((7, 3), name="W")
    k2 = te.reduce_axis((0, 7), "k2")
    sliced = te.compute((5, 3), lambda i, j: te.sum(big[i, k2] * w[k2, j], axis=k2))
    assert match_gemm(te_kernel(big, w, sliced)) is None


def conv_nhwc(**options):
    return lambda x, w: relax.op.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="HWIO",
                                           **options)


def test_a_one_by_one_nhwc_convolution_is_a_gemm_with_a_shared_weight():
    [conv] = legalized_kernels([(2, 14, 14, 32), (1, 1, 32, 64)], conv_nhwc())
    assert match_gemm(conv) == GemmSpec((2, 14), 14, 64, 32, False, False, True, False, 0, 1)
    for shapes, options in [(((2, 14, 14, 32), (1, 1, 32, 64)), {"strides": 2}),
                            (((2, 14, 14, 32), (1, 1, 32, 64)), {"padding": 1}),
                            (((2, 14, 14, 32), (3, 3, 32, 64)), {"padding": 1})]:
        [kernel] = legalized_kernels(list(shapes), conv_nhwc(**options))
        assert match_gemm(kernel) is None, options
    # a size-1 leading axis indexed by 0 is a shared operand too
    a, b = te.placeholder((1, 5, 7), name="A"), te.placeholder((2, 7, 3), name="B")
    k = te.reduce_axis((0, 7), "k")
    out = te.compute((2, 5, 3), lambda n, i, j: te.sum(a[0, i, k] * b[n, k, j], axis=k))
    spec = match_gemm(te_kernel(a, b, out))
    assert (spec.a_batched, spec.b_batched, spec.a_shape()) == (False, True, (5, 7))


def test_kernels_without_exactly_one_reduction_are_refused_before_a_schedule_is_made(
        monkeypatch):
    """Most candidates are elementwise or data movement: `float32_main` counts their
    reduction blocks on the statement tree and refuses them without a Schedule."""
    from korch_tvm.library import conv_match, gemm_match
    from korch_tvm.library.implementations import library_spec

    [elementwise] = legalized_kernels([(5, 7), (5, 7)],
                                      lambda x, y: relax.op.nn.relu(relax.op.add(x, y)))
    [matmul_relu] = legalized_kernels([(5, 7), (7, 3)],
                                      lambda x, y: relax.op.nn.relu(relax.op.matmul(x, y)))
    a, w = te.placeholder((5, 7), name="A"), te.placeholder((7, 3), name="W")
    k, k2 = te.reduce_axis((0, 7), "k"), te.reduce_axis((0, 7), "k2")
    row_sum = te.compute((5,), lambda i: te.sum(a[i, k], axis=k), name="S")
    normalized = te.compute((5, 3), lambda i, j: te.sum(a[i, k2] / row_sum[i] * w[k2, j],
                                                        axis=k2))
    normalized_matmul = te_kernel(a, w, normalized)  # a row sum, then the matmul
    counts = [gemm_match.reduction_blocks(kernel["main"].body)
              for kernel in (elementwise, matmul_relu, normalized_matmul)]
    assert counts == [0, 1, 2]
    made = []
    original = tvm.s_tir.Schedule
    monkeypatch.setattr(tvm.s_tir, "Schedule", lambda *args, **kw: made.append(1) or
                        original(*args, **kw))
    assert library_spec(elementwise) is None and library_spec(normalized_matmul) is None
    assert made == []
    assert library_spec(matmul_relu) == GemmSpec((), 5, 3, 7, False, False, False, False, 0, 1,
                                                 epilogue=library_spec(matmul_relu).epilogue)
    assert made and [step.token() for step in library_spec(matmul_relu).epilogue] == ["relu"]
