"""Primitive lowering keeps numerics, leaves no composite op behind, and counts what it did.

Every rule case is one Relax function of a single module, so the original and the lowered module
are each compiled once (compile time dominates this file).
"""

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from korch_tvm.lowering.fission import (LOWERING_RULES, PrimitiveLowering, count_operators,
                                        lowering_stats)
from korch_tvm.lowering.primitive_kinds import ALL_KINDS, OPAQUE, PRIMITIVE_KIND_BY_OP, op_kind

R = relax.op
F32_RTOL, F32_ATOL = 1e-5, 1e-6  # atol only matters for outputs within ~1e-1 of zero
F16_RTOL, F16_ATOL = 1e-2, 1e-2


def _tensor(name, shape, dtype="float32"):
    return relax.Var(name, relax.TensorType(shape, dtype))


# name -> (input shapes, dtype, builder of the call from the params)
RULE_CASES = {
    "softmax_last": ([(3, 7)], "float32", lambda x: R.nn.softmax(x, axis=-1)),
    "softmax_axis1": ([(2, 5, 4)], "float32", lambda x: R.nn.softmax(x, axis=1)),
    "softmax_axis0": ([(4, 3)], "float32", lambda x: R.nn.softmax(x, axis=0)),
    "softmax_f16": ([(3, 7)], "float16", lambda x: R.nn.softmax(x, axis=-1)),
    "log_softmax_last": ([(3, 7)], "float32", lambda x: R.nn.log_softmax(x, axis=-1)),
    "log_softmax_axis0": ([(2, 5, 4)], "float32", lambda x: R.nn.log_softmax(x, axis=0)),
    "layer_norm_last": ([(2, 3, 8), (8,), (8,)], "float32",
                        lambda x, g, b: R.nn.layer_norm(x, g, b, axes=[-1])),
    "layer_norm_two_axes": ([(2, 3, 4), (3, 4), (3, 4)], "float32",
                            lambda x, g, b: R.nn.layer_norm(x, g, b, axes=[1, 2], epsilon=1e-3)),
    "layer_norm_middle_axis": ([(2, 3, 4), (3,), (3,)], "float32",
                               lambda x, g, b: R.nn.layer_norm(x, g, b, axes=[1])),
    "layer_norm_no_affine": ([(2, 8), (8,), (8,)], "float32",
                             lambda x, g, b: R.nn.layer_norm(x, g, b, axes=[-1], center=False,
                                                             scale=False)),
    "layer_norm_f16": ([(2, 8), (8,), (8,)], "float16",
                       lambda x, g, b: R.nn.layer_norm(x, g, b, axes=[-1])),
    "rms_norm_last": ([(2, 3, 8), (8,)], "float32", lambda x, w: R.nn.rms_norm(x, w, axes=[-1])),
    "rms_norm_two_axes": ([(2, 3, 4), (3, 4)], "float32",
                          lambda x, w: R.nn.rms_norm(x, w, axes=[1, 2], epsilon=1e-2)),
    "group_norm_nchw": ([(2, 6, 3, 3), (6,), (6,)], "float32",
                        lambda x, g, b: R.nn.group_norm(x, g, b, num_groups=3, channel_axis=1,
                                                        axes=[2, 3])),
    "group_norm_ncw": ([(2, 4, 5), (4,), (4,)], "float32",
                       lambda x, g, b: R.nn.group_norm(x, g, b, num_groups=2, channel_axis=1,
                                                       axes=[2], epsilon=1e-3)),
    "instance_norm": ([(2, 3, 4, 4), (3,), (3,)], "float32",
                      lambda x, g, b: R.nn.instance_norm(x, g, b, channel_axis=1, axes=[2, 3])),
    "batch_norm_nchw": ([(2, 3, 4, 4), (3,), (3,), (3,), (3,)], "float32",
                        lambda x, g, b, m, v: R.nn.batch_norm(x, g, b, m, v, axis=1,
                                                              training=False)),
    "batch_norm_nc_f16": ([(4, 3), (3,), (3,), (3,), (3,)], "float16",
                          lambda x, g, b, m, v: R.nn.batch_norm(x, g, b, m, v, axis=1,
                                                                epsilon=1e-3, training=False)),
    "variance": ([(3, 4, 5)], "float32", lambda x: R.variance(x, axis=[1])),
    "std_keepdims": ([(3, 4, 5)], "float32", lambda x: R.std(x, axis=[0, 2], keepdims=True)),
    "gelu": ([(4, 5)], "float32", lambda x: R.nn.gelu(x)),
    "gelu_f16": ([(4, 5)], "float16", lambda x: R.nn.gelu(x)),
    "gelu_tanh": ([(4, 5)], "float32", lambda x: R.nn.gelu_tanh(x)),
    "gelu_tanh_f16": ([(4, 5)], "float16", lambda x: R.nn.gelu_tanh(x)),
    "silu": ([(4, 5)], "float32", lambda x: R.nn.silu(x)),
    "silu_f16": ([(4, 5)], "float16", lambda x: R.nn.silu(x)),
    "selu": ([(4, 5)], "float32", lambda x: R.nn.selu(x)),
    "softplus": ([(4, 5)], "float32", lambda x: R.nn.softplus(x)),
    "softplus_beta": ([(4, 5)], "float32", lambda x: R.nn.softplus(x, beta=2.0, threshold=3.0)),
    "split_sections": ([(2, 6)], "float32", lambda x: R.split(x, 3, axis=1)),
    "split_indices": ([(7, 3)], "float32", lambda x: R.split(x, [1, 4], axis=0)),
    "split_uneven": ([(3, 7)], "float32", lambda x: R.split(x, 4, axis=-1)),
    "dropout": ([(4, 5)], "float32", lambda x: R.nn.dropout(x, rate=0.3)),
    "resize_linear": ([(1, 3, 6, 5)], "float32",
                      lambda x: R.image.resize2d(x, (12, 9), method="linear",
                                                 coordinate_transformation_mode="half_pixel")),
}


def _build_rule_module():
    """One Relax function per case; tuple results are unpacked into an output tuple."""
    builder = relax.BlockBuilder()
    for name, (shapes, dtype, make_call) in RULE_CASES.items():
        params = [_tensor(f"p{i}", shape, dtype) for i, shape in enumerate(shapes)]
        with builder.function(name, params):
            with builder.dataflow():
                result = builder.emit(make_call(*params))
                if isinstance(result.ty, relax.TupleType):
                    items = [builder.emit(relax.TupleGetItem(result, i))
                             for i in range(len(result.ty.fields))]
                    result = builder.emit(relax.Tuple(items))
                output = builder.emit_output(result)
            builder.emit_func_output(output)
    return builder.get()


def _random_inputs(case_name, seed, scale=3.0):
    shapes, dtype, _ = RULE_CASES[case_name]
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-scale, scale, shape) for shape in shapes]
    if case_name.startswith("batch_norm"):  # moving variance must be positive
        arrays[4] = np.abs(arrays[4]) + 0.1
    return [a.astype(dtype) for a in arrays]


def _layer_norm_without_affine(x, *_):
    """TVM's own layer_norm applies gamma and beta even with scale/center off; numpy does not."""
    centered = x - x.mean(axis=-1, keepdims=True)
    return [centered / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + 1e-5)]


NUMPY_REFERENCES = {"layer_norm_no_affine": _layer_norm_without_affine}


def _flatten(result):
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    return [array for item in result for array in _flatten(item)]


def _run(vm, function_name, arrays):
    return _flatten(vm[function_name](*[tvm.runtime.tensor(a) for a in arrays]))


@pytest.fixture(scope="module")
def rule_module():
    return _build_rule_module()


@pytest.fixture(scope="module")
def lowered_rule_module(rule_module):
    return PrimitiveLowering()(rule_module)


@pytest.fixture(scope="module")
def rule_vms(rule_module, lowered_rule_module):
    device = tvm.cpu()
    return tuple(relax.VirtualMachine(tvm.compile(m, target="llvm"), device)
                 for m in (rule_module, lowered_rule_module))


@pytest.mark.parametrize("case_name", sorted(RULE_CASES))
def test_lowered_rule_matches_original_op(case_name, rule_vms):
    original_vm, lowered_vm = rule_vms
    dtype = RULE_CASES[case_name][1]
    rtol, atol = (F16_RTOL, F16_ATOL) if dtype == "float16" else (F32_RTOL, F32_ATOL)
    for seed in (0, 1):
        arrays = _random_inputs(case_name, seed)
        reference = NUMPY_REFERENCES.get(case_name)
        expected = reference(*arrays) if reference else _run(original_vm, case_name, arrays)
        actual = _run(lowered_vm, case_name, arrays)
        assert len(expected) == len(actual)
        for want, got in zip(expected, actual):
            # TVM's own float16 batch_norm returns float32 despite its declared type; the
            # lowered one keeps the declared dtype, so dtypes are checked against the case.
            assert got.dtype == dtype and got.shape == want.shape
            np.testing.assert_allclose(got.astype("float32"), want.astype("float32"),
                                       rtol=rtol, atol=atol)


@pytest.mark.parametrize("case_name", ["softmax_last", "log_softmax_last", "softmax_axis1"])
def test_softmax_stays_finite_at_plus_minus_80(case_name, rule_vms):
    _, lowered_vm = rule_vms
    shape = RULE_CASES[case_name][0][0]
    x = np.where(np.random.default_rng(3).random(shape) < 0.5, -80.0, 80.0).astype("float32")
    x.flat[0] = 80.0
    got = _run(lowered_vm, case_name, [x])[0]
    assert np.isfinite(got).all()
    axis = -1 if case_name != "softmax_axis1" else 1
    shifted = x - x.max(axis=axis, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    want = shifted - log_sum if case_name.startswith("log") else np.exp(shifted - log_sum)
    np.testing.assert_allclose(got, want, rtol=F32_RTOL, atol=F32_ATOL)


def test_every_rule_has_a_case_and_no_rule_op_remains(rule_module, lowered_rule_module):
    covered = set(count_operators(rule_module))
    assert set(LOWERING_RULES) <= covered, set(LOWERING_RULES) - covered
    assert not set(count_operators(lowered_rule_module)) & set(LOWERING_RULES)


def test_signatures_kept(rule_module, lowered_rule_module):
    for global_var, func in rule_module.functions_items():
        lowered = lowered_rule_module[global_var.name_hint]
        assert [p.name for p in lowered.params] == [p.name for p in func.params]
        tvm.ir.assert_structural_equal(lowered.ret_ty, func.ret_ty)


def test_declined_and_unknown_ops_pass_through_untouched():
    x, c = _tensor("x", [2, 3, 4]), _tensor("c", [3])
    unknown_rank = relax.Var("u", relax.TensorType(None, "float32", ndim=-1))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, c, unknown_rank]):
        with builder.dataflow():
            norm = builder.emit(R.nn.batch_norm(x, c, c, c, c, axis=1, training=True))
            y = builder.emit(relax.TupleGetItem(norm, 0))
            y = builder.emit(R.cumsum(R.nn.relu(y), axis=2))
            kept = builder.emit(R.nn.layer_norm(unknown_rank, c, c, axes=[-1]))
            output = builder.emit_output(relax.Tuple([y, kept]))
        builder.emit_func_output(output)
    mod = builder.get()
    tvm.ir.assert_structural_equal(PrimitiveLowering()(mod), mod)


def test_symbolic_shapes_lower_or_pass_through():
    """Rules that need static extents (group norm, split into sections) decline; others lower."""
    n = tvm.tirx.Var("n", "int64")
    x, c = _tensor("x", [n, 4, 6]), _tensor("c", [4])
    builder = relax.BlockBuilder()
    with builder.function("main", [x, c]):
        with builder.dataflow():
            y = builder.emit(R.nn.layer_norm(x, R.ones([6], "float32"), R.zeros([6], "float32"),
                                             axes=[-1]))
            y = builder.emit(R.nn.softmax(y, axis=1))
            norm = builder.emit(R.nn.batch_norm(y, c, c, c, R.add(R.abs(c), relax.const(1.0)),
                                                axis=1, training=False))
            y = builder.emit(relax.TupleGetItem(norm, 0))
            y = builder.emit(R.nn.group_norm(y, c, c, num_groups=2, channel_axis=1, axes=[2]))
            parts = builder.emit(R.split(y, 2, axis=0))
            output = builder.emit_output(relax.TupleGetItem(parts, 0))
        builder.emit_func_output(output)
    mod = builder.get()
    lowered = PrimitiveLowering()(mod)
    remaining = set(count_operators(lowered)) & set(LOWERING_RULES)
    assert remaining == {"relax.nn.group_norm", "relax.split"}
    vms = [relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu()) for m in (mod, lowered)]
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(shape).astype("float32") for shape in ((2, 4, 6), (4,))]
    expected, actual = (_flatten(vm["main"](*map(tvm.runtime.tensor, inputs))) for vm in vms)
    for want, got in zip(expected, actual, strict=True):  # four chained norms: errors compound
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_counts_by_kind_on_a_small_graph():
    x, w = _tensor("x", [4, 8]), _tensor("w", [8, 8])
    gamma, beta = _tensor("g", [8]), _tensor("b", [8])
    builder = relax.BlockBuilder()
    with builder.function("main", [x, w, gamma, beta]):
        with builder.dataflow():
            y = builder.emit(R.nn.layer_norm(x, gamma, beta, axes=[-1]))  # 9 primitives
            y = builder.emit(R.add(R.matmul(y, w), beta))                # linear + elementwise
            y = builder.emit(R.nn.gelu(y))                               # 5 elementwise
            y = builder.emit(R.nn.softmax(y, axis=-1))                   # 2 reduce, 3 elementwise
            y = builder.emit(R.cumsum(y, axis=1))                        # opaque
            output = builder.emit_output(y)
        builder.emit_func_output(output)
    before = builder.get()
    stats = lowering_stats(before, PrimitiveLowering()(before))
    assert stats == {
        "operators_seen": {"relax.add": 1, "relax.cumsum": 1, "relax.matmul": 1,
                           "relax.nn.gelu": 1, "relax.nn.layer_norm": 1, "relax.nn.softmax": 1},
        "composite_lowered": {"relax.nn.gelu": 1, "relax.nn.layer_norm": 1, "relax.nn.softmax": 1},
        "primitives_by_kind": {"elementwise": 16, "linear": 1, "opaque": 1, "reduce": 4},
        "opaque_ops": {"relax.cumsum": 1},
        "convolutions": {"dead_taps_cut": 0, "summed_over_live_taps": 0},
    }


def test_kind_table():
    assert op_kind("relax.add") == "elementwise"
    assert op_kind("relax.broadcast_to") == "broadcast"
    assert op_kind("relax.mean") == "reduce"
    assert op_kind("relax.nn.max_pool2d") == "reduce"
    assert op_kind("relax.permute_dims") == "layout"
    assert op_kind("relax.nn.conv2d") == "linear"
    assert op_kind("relax.nn.softmax") == OPAQUE
    assert op_kind("relax.no_such_op") == OPAQUE
    registered = set(tvm.ir.Op.list_op_names())
    assert set(PRIMITIVE_KIND_BY_OP) <= registered, set(PRIMITIVE_KIND_BY_OP) - registered
    assert set(PRIMITIVE_KIND_BY_OP.values()) <= set(ALL_KINDS)


# ---------------------------------------------------------------- what the ONNX importer emits


def _one_node_model(op_type, input_shape, attributes=None, initializers=(), opset=17, outputs=1):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_shape)]
    output_names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op_type, ["x"] + [name for name, _ in initializers], output_names,
                            **(attributes or {}))
    graph = helper.make_graph(
        [node], op_type, inputs,
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in output_names],
        initializer=[numpy_helper.from_array(value, name) for name, value in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _channel_params(*names, channels=4):
    return [(name, np.linspace(0.5, 1.5, channels).astype("float32")) for name in names]


IMPORTED_MODELS = {  # ONNX op of the benchmark models -> (model, composite ops the import yields)
    "Conv": (_one_node_model("Conv", [1, 4, 6, 6], {"kernel_shape": [3, 3]},
                             [("w", np.ones((8, 4, 3, 3), "float32")),
                              ("b", np.ones(8, "float32"))]),
             set()),
    "BatchNormalization": (_one_node_model("BatchNormalization", [1, 4, 6, 6], {},
                                           _channel_params("s", "b", "m", "v")),
                           {"relax.nn.batch_norm"}),
    "InstanceNormalization": (_one_node_model("InstanceNormalization", [1, 4, 6, 6], {},
                                              _channel_params("s", "b")), {"relax.variance"}),
    "LayerNormalization": (_one_node_model("LayerNormalization", [2, 3, 4], {"axis": -1},
                                           _channel_params("s", "b")), {"relax.nn.layer_norm"}),
    "GroupNormalization": (_one_node_model("GroupNormalization", [1, 4, 6, 6], {"num_groups": 2},
                                           _channel_params("s", "b"), opset=21),
                           {"relax.nn.group_norm"}),
    "Softmax": (_one_node_model("Softmax", [2, 3, 4], {"axis": 1}), {"relax.nn.softmax"}),
    "Gelu": (_one_node_model("Gelu", [2, 3], {}, opset=20), {"relax.nn.gelu"}),
    "Erf": (_one_node_model("Erf", [2, 3]), set()),
    "Resize": (_one_node_model("Resize", [1, 4, 6, 6], {"mode": "nearest"},
                               [("roi", np.zeros(0, "float32")),
                                ("scales", np.array([1, 1, 2, 2], "float32"))]),
               {"relax.image.resize2d"}),
    "Resize_linear": (_one_node_model("Resize", [1, 4, 6, 6], {"mode": "linear"},
                                      [("roi", np.zeros(0, "float32")),
                                       ("scales", np.array([1, 1, 2, 2], "float32"))]),
                      {"relax.image.resize2d"}),
    "HardSwish": (_one_node_model("HardSwish", [2, 3]), set()),
    "HardSigmoid": (_one_node_model("HardSigmoid", [2, 3]), set()),
    "Mish": (_one_node_model("Mish", [2, 3], opset=18), set()),
    "Softplus": (_one_node_model("Softplus", [2, 3]), set()),
    "Sigmoid": (_one_node_model("Sigmoid", [2, 3]), set()),
    "Split": (_one_node_model("Split", [2, 6], {"axis": 1}, outputs=2, opset=18), {"relax.split"}),
    "MaxPool": (_one_node_model("MaxPool", [1, 4, 6, 6], {"kernel_shape": [2, 2]}), set()),
    "Pad": (_one_node_model("Pad", [1, 4, 6, 6], {"mode": "reflect"},
                            [("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], "int64"))]), set()),
    "Pad_constant": (_one_node_model("Pad", [1, 4, 6, 6], {"mode": "constant"},
                                     [("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], "int64"))]),
                     set()),
    "Gemm": (_one_node_model("Gemm", [3, 5], {"transB": 1},
                             [("w", np.ones((4, 5), "float32")), ("c", np.ones(4, "float32"))]),
             set()),
}


@pytest.mark.filterwarnings("ignore:Field 'shape' of 'type' is required")  # untyped outputs
@pytest.mark.parametrize("onnx_op", sorted(IMPORTED_MODELS))
def test_onnx_import_composites_are_lowered(onnx_op):
    model, expected_composites = IMPORTED_MODELS[onnx_op]
    imported = from_onnx(model)
    seen = set(count_operators(imported))
    assert seen & set(LOWERING_RULES) == expected_composites
    lowered_ops = set(count_operators(PrimitiveLowering()(imported)))
    assert lowered_ops & set(LOWERING_RULES) == DECLINED.get(onnx_op, set())
    opaque = {name for name in lowered_ops if op_kind(name) == OPAQUE}
    assert opaque == IMPORTED_AS_TIR.get(onnx_op, set()), opaque


# Calls their rule keeps as they are: a nearest-neighbour resize has no passes to split into.
DECLINED = {"Resize": {"relax.image.resize2d"}}
# The importer emits its own TIR (call_tir, opaque) for these; nothing to lower.
IMPORTED_AS_TIR = {"Pad": {"relax.call_tir"}, "Pad_constant": {"relax.call_tir"}}
