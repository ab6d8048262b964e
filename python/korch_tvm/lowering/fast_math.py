"""Legalization with vectorisable exp, sigmoid, tanh, erf and small powers (float32), both paths.

TVM's default legalization of these functions becomes one libm call per element on `llvm`,
which LLVM cannot vectorise; TOPI's polynomial versions (`fast_exp`, `fast_tanh`, `fast_erf`)
vectorise, and then run close to the speed of a plain multiply (`bench/fast_math.py`).
Largest relative error against float64 over each function's range: 3.4e-7 (TVM's own tanh: up
to 1.3e-3); without FMA (a target with no mcpu) exp loses up to 4e-6 near its overflow. These
functions sit in the epilogues of most convolutions (SiLU) and in every transformer's softmax
and GELU, so they decide whether a memory-bound kernel runs at memory speed.

Every operator whose default legalization evaluates one of the four functions is covered, the
composite ones too (softmax, GELU, SiLU, ...): the stock path legalizes those whole while Korch
lowers them to primitives first, and both must get the same arithmetic or the comparison between
them would be about the maths rather than the orchestration. Edge cases: exp flushes to 0 below
about -88 and overflows to inf above 88.7 (as float32 does anyway), and erf(NaN) is 1, not NaN.
Other dtypes keep TVM's default legalization. `power` by a constant 2, 3 or 4 becomes
multiplications (at most 1.5 ulp from powf); any other exponent keeps powf.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, topi

FLOAT32 = "float32"


def fast_sigmoid(x: te.Tensor) -> te.Tensor:
    """1 / (1 + fast_exp(-x)): the sigmoid every fast rule here uses (bench/ too)."""
    return topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x))))


def _fast_log_softmax(x: te.Tensor, axis: int) -> te.Tensor:
    shifted = topi.subtract(x, topi.max(x, axis=axis, keepdims=True))
    return topi.subtract(shifted, topi.log(topi.sum(topi.fast_exp(shifted), axis=axis,
                                                    keepdims=True)))


def _fast_gelu(x: te.Tensor) -> te.Tensor:
    return topi.multiply(x, topi.add(0.5, topi.multiply(topi.fast_erf(
        topi.multiply(x, math.sqrt(0.5))), 0.5)))


def _fast_gelu_tanh(x: te.Tensor) -> te.Tensor:
    inner = topi.multiply(topi.multiply(x, math.sqrt(2.0 / math.pi)),
                          topi.add(1.0, topi.multiply(topi.multiply(x, x), 0.044715)))
    return topi.multiply(topi.multiply(x, 0.5), topi.add(1.0, topi.fast_tanh(inner)))


def _fast_selu(x: te.Tensor) -> te.Tensor:
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    negative = topi.minimum(0.0, topi.multiply(topi.subtract(topi.fast_exp(x), 1.0), alpha))
    return topi.multiply(topi.add(topi.maximum(x, 0.0), negative), scale)


def _fast_softplus(x: te.Tensor, beta: float, threshold: float) -> te.Tensor:
    scaled = topi.multiply(x, beta)
    smooth = topi.divide(topi.log(topi.add(1.0, topi.fast_exp(scaled))), beta)
    return topi.where(topi.greater(scaled, threshold), x, smooth)


def _attrs(*names):
    """Read the named attributes of the call, in order, as plain Python numbers."""
    return lambda call: [_plain(getattr(call.attrs, name)) for name in names]


def _plain(value):
    return value.value if hasattr(value, "value") else value


# op name -> (TE compute on float32 tensors, the op's attributes it needs, PrimFunc name)
_FAST_RULES = {
    "relax.exp": (topi.fast_exp, _attrs(), "tir_exp"),
    "relax.sigmoid": (fast_sigmoid, _attrs(), "tir_sigmoid"),
    "relax.tanh": (topi.fast_tanh, _attrs(), "tir_tanh"),
    "relax.erf": (topi.fast_erf, _attrs(), "erf"),
    "relax.nn.softmax": (topi.nn.fast_softmax, _attrs("axis"), "softmax"),
    "relax.nn.log_softmax": (_fast_log_softmax, _attrs("axis"), "log_softmax"),
    "relax.nn.gelu": (_fast_gelu, _attrs(), "gelu"),
    "relax.nn.gelu_tanh": (_fast_gelu_tanh, _attrs(), "gelu_tanh"),
    "relax.nn.silu": (lambda x: topi.multiply(x, fast_sigmoid(x)), _attrs(), "silu"),
    "relax.nn.selu": (_fast_selu, _attrs(), "selu"),
    "relax.nn.softplus": (_fast_softplus, _attrs("beta", "threshold"), "softplus"),
}


def _legalize_fast(op_name: str):
    compute, attributes, name = _FAST_RULES[op_name]
    default = tvm.ir.Op.get(op_name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if str(call.args[0].ty.dtype) != FLOAT32:
            return default(bb, call)
        return bb.call_te(compute, call.args[0], *attributes(call), primfunc_name_hint=name)

    return legalize


FAST_OPS = tuple(_FAST_RULES)

# Whole exponents written out as multiplications; GELU's tanh form as exported by transformers
# (`torch.pow(x, 3.0)`) would otherwise call libm's powf once per element of a wide matmul.
SMALL_POWERS = (2, 3, 4)


def _small_power(call: relax.Call) -> int | None:
    """The exponent of power(x, c) when c is a float32 constant holding 2, 3 or 4 that cannot
    broadcast x to a larger shape; None otherwise."""
    x, exponent = call.args
    if not isinstance(exponent, tvm.ir.expr.Constant) or str(x.ty.dtype) != FLOAT32:
        return None
    value = exponent.value.numpy()
    if value.size != 1 or value.ndim > len(x.ty.shape) or str(value.dtype) != FLOAT32:
        return None
    whole = float(value.reshape(()))
    return int(whole) if whole in SMALL_POWERS else None


def _power_by_multiplication(x: te.Tensor, exponent: int) -> te.Tensor:
    return te.compute(x.shape, lambda *i: _product(x(*i), exponent), name="T_power")


def _product(value, exponent: int):
    squared = value * value
    return {2: squared, 3: squared * value, 4: squared * squared}[exponent]


def _legalize_power(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    exponent = _small_power(call)
    if exponent is None:
        return tvm.ir.Op.get("relax.power").get_attr("FLegalize")(bb, call)
    return bb.call_te(_power_by_multiplication, call.args[0], exponent,
                      primfunc_name_hint="power")


def legalize_ops(fast_math: bool = True) -> tvm.transform.Pass:
    """LegalizeOps, with the vectorisable functions above when `fast_math` is on."""
    if not fast_math:
        return relax.transform.LegalizeOps()
    rules = {op: _legalize_fast(op) for op in FAST_OPS}
    rules["relax.power"] = _legalize_power
    return relax.transform.LegalizeOps(rules)
