"""Recognise the epilogue a GEMM kernel applies to its output, as steps the library call runs.

The kernel's elementwise blocks after the GEMM are inlined into one expression over C's indices
(gemm_match.py); this module reads that expression as a chain of steps, innermost first: a bias
add along N or along M, a residual add of a tensor of C's shape, and the activations models use
after matmuls and 1x1 convolutions (relu, clip, gelu in its erf and tanh forms, sigmoid, silu,
hardswish). Anything else is no epilogue here, so the kernel keeps its TVM implementation.

relu and clip are matched by their structure (max / min with constants). The other activations
reach TVM in several algebraic arrangements and through the fast-math polynomials
(lowering/fast_math.py), so they are matched by value: the expression, with the activation's
argument replaced by a variable, is evaluated in float32 at many points over [-30, 30] and must
equal the activation there within 1e-5 (relative to max(1, |value|)). That checks every constant
(the 0.5 and 1/sqrt(2) of gelu, the 0.044715 of its tanh form, the 3 and 6 of hardswish): gelu's
erf and tanh forms differ by up to 2e-4, a wrong constant by far more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

OPERAND_STEPS = ("bias_n", "bias_m", "residual")
# Steps one call runs at most (a tuning log's library entry names each): a longer chain, such
# as a convolution that fused the padded adds of eight others (lowering/conv_tap_sum.py),
# keeps its TVM kernel.
MAX_STEPS = 8
VALUE_MATCHED = ("gelu_erf", "gelu_tanh", "sigmoid", "silu", "hardswish")
_SAMPLES = np.concatenate([np.linspace(-30.0, 30.0, 241), np.linspace(-4.0, 4.0, 161),
                           [-1e-3, -1e-6, 0.0, 1e-6, 1e-3]]).astype("float32")
_TOLERANCE = 1e-5


@dataclass(frozen=True)
class EpilogueStep:
    """One step applied to C: `kind` one of OPERAND_STEPS (with `input`, the operand's position
    among the kernel's inputs, and its `shape`), "relu", "clip" (with `low`, `high`) or one of
    VALUE_MATCHED."""

    kind: str
    input: int | None = None
    shape: tuple[int, ...] = ()
    low: float = 0.0
    high: float = 0.0

    def token(self) -> str:
        """The step as the extension's epilogue text names it (gemm_epilogue.h)."""
        return f"clip:{self.low!r}:{self.high!r}" if self.kind == "clip" else self.kind


def _reference(kind: str, x: np.ndarray) -> np.ndarray:
    x = x.astype("float64")
    if kind == "gelu_erf":
        return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if kind == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if kind == "silu":
        return x / (1.0 + np.exp(-x))
    assert kind == "hardswish", kind
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


_REFERENCES = {kind: _reference(kind, _SAMPLES) for kind in VALUE_MATCHED}


class EpilogueMatcher:
    """Reads an output block's expression as steps over the load of the GEMM's result
    (`acc_buffer`) at the block's own iteration variables `index_vars` (..., i, j). `inputs`
    are the kernel's input buffers by position (bias and residual operands are among them);
    `c_shape` the GEMM's output shape; `bias_axes` which bias steps may occur and the axis of
    C each runs along (a convolution's per-channel bias: bias_m along NCHW's channel axis, -3)."""

    def __init__(self, acc_buffer, index_vars, inputs, c_shape,
                 bias_axes: tuple[tuple[str, int], ...] = (("bias_n", -1), ("bias_m", -2))):
        self.acc_buffer, self.index_vars = acc_buffer, list(index_vars)
        self.inputs, self.c_shape = list(inputs), tuple(c_shape)
        self.bias_axes = bias_axes
        self._contains: dict[int, bool] = {}

    def match(self, value) -> tuple[EpilogueStep, ...] | None:
        """`steps`, or None when there are more than MAX_STEPS."""
        steps = self.steps(value)
        return None if steps is None or len(steps) > MAX_STEPS else steps

    def steps(self, value) -> tuple[EpilogueStep, ...] | None:
        """The steps, innermost first; () for the bare accumulator; None when not an epilogue."""
        if self._is_acc(value):
            return ()
        if isinstance(value, tirx.Add):
            for inner, other in ((value.a, value.b), (value.b, value.a)):
                step = None if self.contains_acc(other) else self._operand_step(other)
                rest = None if step is None else self.steps(inner)
                if rest is not None:
                    return rest + (step,)
        for argument in self._arguments(value):
            step = self._activation(value, argument)
            rest = None if step is None else self.steps(argument)
            if rest is not None:
                return rest + (step,)
        return None

    def _is_acc(self, expr) -> bool:
        return (isinstance(expr, tvm.ir.TensorLoad) and expr.source.same_as(self.acc_buffer)
                and len(expr.indices) == len(self.index_vars)
                and all(i.same_as(v) for i, v in zip(expr.indices, self.index_vars)))

    def contains_acc(self, expr) -> bool:
        key = expr.__chandle__()
        if key not in self._contains:
            self._contains[key] = (
                isinstance(expr, tvm.ir.TensorLoad) and expr.source.same_as(self.acc_buffer)
            ) or any(self.contains_acc(child) for child in _children(expr))
        return self._contains[key]

    def _operand_step(self, expr) -> EpilogueStep | None:
        """A bias or residual load: an input buffer read at a broadcast of C's indices."""
        if not isinstance(expr, tvm.ir.TensorLoad):
            return None
        found = [n for n, buffer in enumerate(self.inputs) if buffer.same_as(expr.source)]
        if len(found) != 1:
            return None
        shape = tuple(_as_int(s) for s in expr.source.shape)
        indices = list(expr.indices)
        if (len(indices) == len(self.index_vars) and shape == self.c_shape
                and all(a.same_as(b) for a, b in zip(indices, self.index_vars))):
            return EpilogueStep("residual", found[0], shape)
        for kind, axis in self.bias_axes:
            var = self.index_vars[axis]
            if len(indices) < -axis or len(indices) > len(self.index_vars):
                continue
            others = [index for k, index in enumerate(indices) if k != len(indices) + axis]
            along = self.c_shape[axis]
            if (indices[axis].same_as(var) and shape[axis] == along
                    and all(self._is_zero(index) for index in others)
                    and math.prod(shape) == along):
                return EpilogueStep(kind, found[0], shape)
        return None

    def _is_zero(self, index) -> bool:
        """0, or one of C's indices whose extent is 1 (a batch of one: `b[v_n, v_k, 0, 0]`)."""
        return _as_int(index) == 0 or any(
            index.same_as(var) and size == 1 for var, size in zip(self.index_vars, self.c_shape))

    def _arguments(self, value):
        """Subexpressions of `value` an activation could be applied to: those holding the
        accumulator, largest first, each distinct one once."""
        seen, found, visited = set(), [], set()
        pending = [child for child in _children(value)]
        while pending:                              # breadth first: outer ones first
            expr = pending.pop(0)
            if expr.__chandle__() in visited or not self.contains_acc(expr):
                continue
            visited.add(expr.__chandle__())
            key = _hash(expr)
            if key not in seen:
                seen.add(key)
                found.append(expr)
            pending.extend(_children(expr))
        return found

    def _activation(self, value, argument) -> EpilogueStep | None:
        clipped = _clip_of(value, argument)
        if clipped is not None:
            return clipped
        sampled = _evaluate_with(value, argument)
        if sampled is None:
            return None
        for kind in VALUE_MATCHED:
            want = _REFERENCES[kind]
            if np.all(np.abs(sampled - want) <= _TOLERANCE * np.maximum(1.0, np.abs(want))):
                return EpilogueStep(kind)
        return None


def _children(expr) -> list:
    """The operands of an arithmetic node, a cast, a call or a load (its indices)."""
    if isinstance(expr, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Max, tirx.Min,
                         tirx.LShift)):
        return [expr.a, expr.b]
    if isinstance(expr, tirx.Cast):
        return [expr.value]
    if isinstance(expr, tvm.ir.expr.Call):
        return list(expr.args)
    if isinstance(expr, tvm.ir.TensorLoad):
        return list(expr.indices)
    return []


def _hash(expr) -> int:
    return tvm_ffi.structural_hash(expr)


def _same(a, b) -> bool:
    return tvm_ffi.structural_equal(a, b)


def _clip_of(value, argument) -> EpilogueStep | None:
    """relu: max(x, 0); clip: max(min(x, high), low) or min(max(x, low), high)."""
    def bound(expr):
        return float(expr.value) if isinstance(expr, tirx.FloatImm) else None

    if isinstance(value, (tirx.Max, tirx.Min)):
        for inner, limit in ((value.a, value.b), (value.b, value.a)):
            if bound(limit) is None:
                continue
            if isinstance(value, tirx.Max) and _same(inner, argument) and bound(limit) == 0.0:
                return EpilogueStep("relu")
            kind = tirx.Min if isinstance(value, tirx.Max) else tirx.Max
            if isinstance(inner, kind):
                for x, other in ((inner.a, inner.b), (inner.b, inner.a)):
                    if _same(x, argument) and bound(other) is not None:
                        low, high = sorted((bound(limit), bound(other)))
                        ordered = (bound(limit) == low) == isinstance(value, tirx.Max)
                        if ordered and math.isfinite(low) and math.isfinite(high):
                            return EpilogueStep("clip", low=low, high=high)
    return None


_UNARY_CALLS = {"tirx.exp": np.exp, "tirx.tanh": np.tanh, "tirx.sqrt": np.sqrt,
                "tirx.floor": np.floor, "tirx.fabs": np.abs,
                "tirx.erf": np.vectorize(math.erf, otypes=["float64"]),
                "tirx.sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}


def _evaluate_with(value, argument):
    """`value` at _SAMPLES for `argument` (float32 arithmetic), or None when it holds anything
    but arithmetic, constants and the calls above, or reaches the accumulator outside
    `argument`."""
    memo: dict[int, np.ndarray] = {}
    argument_hash = _hash(argument)

    def evaluate(expr):
        key = expr.__chandle__()
        if key not in memo:
            memo[key] = _evaluate_node(expr, evaluate, argument, argument_hash)
        return memo[key]

    try:
        with np.errstate(all="ignore"):
            result = evaluate(value)
    except _NotElementwise:
        return None
    return None if result is None else np.broadcast_to(result, _SAMPLES.shape).astype("float64")


class _NotElementwise(Exception):
    pass


def _evaluate_node(expr, evaluate, argument, argument_hash):
    if _hash(expr) == argument_hash and _same(expr, argument):
        return _SAMPLES
    if isinstance(expr, tirx.FloatImm):
        return np.float32(expr.value) if _dtype(expr) == "float32" else _fail()
    if isinstance(expr, tirx.IntImm):
        return np.int32(expr.value) if _dtype(expr) == "int32" else _fail()
    binary = {tirx.Add: np.add, tirx.Sub: np.subtract, tirx.Mul: np.multiply,
              tirx.Div: np.divide, tirx.Max: np.maximum, tirx.Min: np.minimum,
              tirx.LShift: _shift_left}
    for node_type, function in binary.items():
        if isinstance(expr, node_type):
            return function(evaluate(expr.a), evaluate(expr.b))
    if isinstance(expr, tirx.Cast):
        dtype = _dtype(expr)
        return np.asarray(evaluate(expr.value)).astype(dtype) if dtype in ("float32", "int32") \
            else _fail()
    if isinstance(expr, tvm.ir.expr.Call) and isinstance(expr.op, tvm.ir.Op):
        return _evaluate_call(expr, evaluate)
    return _fail()


def _evaluate_call(expr, evaluate):
    name, args = expr.op.name, [evaluate(arg) for arg in expr.args]
    if name in _UNARY_CALLS and len(args) == 1:
        return _UNARY_CALLS[name](np.asarray(args[0], "float64")).astype("float32")
    if name == "tirx.shift_left" and len(args) == 2:
        return _shift_left(*args)
    if name == "tirx.reinterpret" and len(args) == 1 and _dtype(expr) == "float32":
        return np.ascontiguousarray(np.broadcast_to(np.asarray(args[0], "int32"),
                                                    _SAMPLES.shape)).view("float32")
    return _fail()


def _shift_left(value, bits):
    return np.left_shift(np.asarray(value, "int32"), np.asarray(bits, "int32"))


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _fail():
    raise _NotElementwise()


def _as_int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None
