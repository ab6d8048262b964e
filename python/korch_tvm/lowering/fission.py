"""Primitive lowering (operator fission): rewrite composite Relax operators into primitive ones.

Korch searches over kernels made of primitives (see ``primitive_kinds``); a composite operator
such as softmax hides a reduce -> broadcast -> elementwise chain that the search should be free to
split and regroup. ``PrimitiveLowering`` rewrites every call of an operator in ``LOWERING_RULES``
(``rules.py``) into primitive Relax calls, one primitive per binding, in every Relax function of
the module.
Signatures are left alone, and operators without a rule (or a rule that declines an instance,
e.g. training-mode batch norm or a dynamic group norm) pass through untouched.

What TVM 0.27's ONNX importer emits for the operators of SegFormer, BERT, YOLOX, YOLOv4,
EfficientViT and Candy, and what happens to it here (``tests/lowering/test_fission.py`` re-checks
this):

=========================  ==================================================  ====================
ONNX operator              Relax ops after ``from_onnx``                       treatment
=========================  ==================================================  ====================
Softmax / LogSoftmax       nn.softmax / nn.log_softmax (opset < 13: reshapes)  lowered
LayerNormalization         nn.layer_norm                                       lowered
GroupNormalization         ones_like, zeros_like, nn.group_norm, mul, add      lowered
InstanceNormalization      mean, subtract, variance, add, sqrt, divide, ...    variance lowered
RMSNormalization           nn.rms_norm                                         lowered
BatchNormalization         nn.batch_norm (tuple) + TupleGetItem                lowered (inference)
Gelu (opset 20)            nn.gelu / nn.gelu_tanh                              lowered
Erf-based GELU             erf, mul, add (already primitive)                   kept
Split                      split (tuple) + TupleGetItem                        lowered to slices
Dropout                    nn.dropout (tuple)                                  lowered to identity
HardSwish / HardSigmoid    add, clip, divide, multiply (already primitive)     kept
Mish, Softplus, Elu, Selu  exp, log, tanh, relu, ... (already primitive)       kept
Sigmoid, Tanh, Relu, Clip  sigmoid, tanh, nn.relu, clip (primitive)            kept
Conv (+bias)               nn.conv2d, reshape, add (linear + elementwise)      kept; taps that read
                                                                               only padding cut
ConvTranspose (+bias)      nn.conv2d_transpose, reshape, add                   kept
Gemm / MatMul              permute_dims, matmul, (multiply), add               kept
Resize (linear, < 32 ch.)  image.resize2d (layout kind)                        lowered to a pass per
                                                                               axis (take, mul, add)
Resize (other)             image.resize2d (layout kind)                        kept
MaxPool / AveragePool      nn.max_pool2d / nn.avg_pool2d (reduce kind)         kept
GlobalAveragePool          mean                                                kept
Concat, Transpose          concat, permute_dims                                kept
Pad of zero widths         nothing (an Identity, ``frontend/onnx_rewrites``)   removed
Pad (constant, one axis)   concat with a constant block (``onnx_rewrites``)    kept
Pad (other)                call_tir (the importer's own TIR)                   kept, opaque
ReduceL2 / ReduceLogSumExp multiply/sum/sqrt, max/subtract/exp/sum/log/add     kept
Clip, constant bounds      maximum, minimum (Max, Min: ``onnx_rewrites``)      kept
Clip, run-time bounds      isnan, where, call_tir (the importer's own TIR)     kept, opaque
Einsum                     call_tir                                            kept, opaque
=========================  ==================================================  ====================

Composite Relax ops that a hand-written module may use are lowered too: ``nn.silu``,
``nn.selu``, ``nn.softplus``, ``nn.instance_norm``, ``variance`` and ``std``.
A linear ``image.resize2d`` of few channels becomes a pass along the width and one along the
height (``separable_resize.py``): one kernel gathers four scattered pixels per output lane, the
two passes read whole rows. Composite ops left opaque, and why: ``nn.attention`` is not
produced by the ONNX importer for these models (BERT arrives as MatMul/Softmax); ``call_tir``
is already TIR; ``topk``, ``sort``, ``cumsum`` and ``einsum`` have no primitive decomposition
worth searching. ``relax.op.linear`` is a Python helper that already
emits ``permute_dims`` + ``matmul`` + ``add``, so there is no ``relax.linear`` op to lower.
"""

from collections import Counter, defaultdict

import tvm
from tvm import relax

from .constant_folding import fold_constants
from .conv_tap_sum import SumLiveConvTaps, live_taps
from .dead_conv_taps import TrimDeadConvTaps, trimmed_conv2d
from .mutation import mutate_relax_functions
from .primitive_kinds import OPAQUE, op_kind
from .rules import LOWERING_RULES
from .shapes import shapes_known


# ---------------------------------------------------------------- the pass


@relax.expr_functor.mutator
class _PrimitiveRewriter(relax.PyExprMutator):
    """Applies LOWERING_RULES to every call; resolves item reads of the tuples rules return."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.lowered_tuple_fields = []  # field lists of the tuples rules returned

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        rule = LOWERING_RULES.get(call.op.name)
        if rule is None or not shapes_known(call):
            return call
        lowered = rule(self.builder_, call)
        if lowered is None:
            return call
        if isinstance(lowered, relax.Tuple):
            self.lowered_tuple_fields.append(list(lowered.fields))
        return lowered

    def visit_tuple_getitem_(self, item: relax.TupleGetItem) -> relax.Expr:
        item = self.visit_expr_post_order(item)
        if not isinstance(item.tuple_value, relax.Var):
            return item
        bound = self.lookup_binding(item.tuple_value)
        if not isinstance(bound, relax.Tuple) or not self._was_lowered(bound):
            return item
        return bound.fields[item.index]

    def _was_lowered(self, bound: relax.Tuple) -> bool:
        fields = list(bound.fields)
        return any(
            len(fields) == len(known) and all(a.same_as(b) for a, b in zip(fields, known))
            for known in self.lowered_tuple_fields
        )


@tvm.transform.module_pass(opt_level=0, name="PrimitiveLowering")
class PrimitiveLowering:
    """Rewrite composite Relax operators into primitive ones (rules: ``LOWERING_RULES``)."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return mutate_relax_functions(_PrimitiveRewriter(mod), mod)


# ---------------------------------------------------------------- statistics for the report


@relax.expr_functor.visitor
class _OperatorCalls(relax.PyExprVisitor):
    def __init__(self):
        super().__init__()
        self.calls = defaultdict(list)

    def visit_call_(self, call: relax.Call) -> None:
        if isinstance(call.op, tvm.ir.Op):
            self.calls[call.op.name].append(call)
        for arg in call.args:
            self.visit_expr(arg)


def operator_calls(mod: tvm.IRModule) -> dict[str, list[relax.Call]]:
    """The calls of each Relax operator, over every Relax function of the module."""
    visitor = _OperatorCalls()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            visitor.visit_expr(func)
    return visitor.calls


def count_operators(mod: tvm.IRModule) -> Counter:
    """Calls of each Relax operator, over every Relax function of the module."""
    return Counter({name: len(calls) for name, calls in operator_calls(mod).items()})


def lowering_stats(before: tvm.IRModule, after: tvm.IRModule) -> dict:
    """JSON-friendly counts for the compile report: what was seen, lowered, and what remains.

    `before` is the module given to `lower_to_primitives`, `after` what it returned.
    """
    seen, remaining = count_operators(before), count_operators(after)
    lowered = {
        op_name: seen[op_name] - remaining.get(op_name, 0)
        for op_name in sorted(LOWERING_RULES)
        if seen[op_name] - remaining.get(op_name, 0) > 0
    }
    by_kind = Counter()
    for op_name, count in remaining.items():
        by_kind[op_kind(op_name)] += count
    return {
        "operators_seen": dict(sorted(seen.items())),
        "composite_lowered": lowered,
        "primitives_by_kind": dict(sorted(by_kind.items())),
        "opaque_ops": {name: n for name, n in sorted(remaining.items()) if op_kind(name) == OPAQUE},
        "convolutions": convolution_rewrites(before),
    }


def convolution_rewrites(mod: tvm.IRModule) -> dict:
    """How many of `mod`'s conv2d calls lowering gives fewer taps: dead ones cut
    (`dead_conv_taps`), or the convolution summed over its live ones (`conv_tap_sum`)."""
    convs = operator_calls(mod)["relax.nn.conv2d"]
    trimmed = sum(trimmed_conv2d(call) is not None for call in convs)
    summed = sum(live_taps(call) is not None
                 for call in operator_calls(TrimDeadConvTaps()(mod))["relax.nn.conv2d"])
    return {"dead_taps_cut": trimmed, "summed_over_live_taps": summed}


def lower_to_primitives(mod: tvm.IRModule) -> tvm.IRModule:
    """PrimitiveLowering plus the clean-up the primitive graph expects.

    Convolution taps that read only padding are cut first (`dead_conv_taps`), and those that
    read it on most outputs are summed tap by tap (`conv_tap_sum`). The rules
    leave alias and unused tuple bindings behind, and constant-only subexpressions (e.g.
    batch-norm factors computed from parameters) are folded so that they do not become
    primitives of their own (in numpy where it is exact: `constant_folding`).
    """
    lowered = tvm.transform.Sequential([
        TrimDeadConvTaps(),
        SumLiveConvTaps(),
        PrimitiveLowering(),
        relax.transform.CanonicalizeBindings(),
    ])(mod)
    return fold_constants(lowered)
