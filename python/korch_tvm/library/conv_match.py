"""Recognise a kernel that is a float32 2-D convolution (NCHW with OIHW weights, or NHWC with HWIO
weights; strided, dilated, grouped, zero-padded), with or without an elementwise epilogue, so the
extension's im2col + GEMM call (`korch_tvm.blas.sconv2d`) can replace it.

As for GEMMs (gemm_match.py), matching reads the kernel's PrimFunc. What must remain once the
elementwise blocks after the reduction are inlined into one output block: at most one padding
block `pad[i] = if_then_else(inside, X[i - pad], 0)`, one reduction block
`Y[n, ..] += D[..] * W[..]` whose indices are the layout's (each spatial index of D must be
provably `out * stride + window * dilation`, its channel index `in_channel` or, with groups,
`out_channel // (K / G) * (C / G) + in_channel`), and the output block, read as an epilogue with
the bias along the channel axis. Anything else is not a convolution here; the TVM kernel stays.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import tvm
from tvm import tirx
from tvm.sym import detect_linear_equation
from tvm.sym.analyzer import Analyzer

from ..support.tir_blocks import is_reduction
from .epilogue_match import EpilogueMatcher, EpilogueStep
from .gemm_match import (_as_int, _is_zero_init, _same_vars, accumulated_product, float32_main,
                         output_index_vars)

_INT32_MAX = 2**31 - 1
# The im2col matrix stays below this many floats (the extension refuses 2**30); a convolution
# that needs more keeps its TVM kernel.
MAX_COLUMN_FLOATS = 2**28
# Output channels per group that the extension's direct grouped kernel handles
# (conv_grouped.h's kDirectGroupWidths).
DIRECT_GROUP_WIDTHS = (4, 8, 16)


@dataclass(frozen=True)
class ConvSpec:
    """Y = conv(X, W): `nhwc` picks NHWC/HWIO over NCHW/OIHW; sizes by their usual letters (input
    N, C, H, W; K filters of R x S; output P x Q). `x_input`/`w_input` are X's and W's positions
    among the kernel's inputs; `epilogue` the steps applied to Y (the bias per channel)."""

    nhwc: bool
    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    p: int
    q: int
    stride: tuple[int, int]
    pad: tuple[int, int]  # top, left; the bottom and right padding follow from P and Q
    dilation: tuple[int, int]
    groups: int
    x_input: int
    w_input: int
    epilogue: tuple[EpilogueStep, ...] = ()

    @property
    def routine(self) -> str:
        """The direct kernel for an NHWC convolution of narrow groups, whose im2col + GEMM
        would be one GEMM a few columns wide per group; im2col + GEMM otherwise."""
        direct = (self.nhwc and self.groups >= 2
                  and self.k // self.groups in DIRECT_GROUP_WIDTHS)
        return "sgconv2d" if direct else "sconv2d"

    @property
    def main_inputs(self) -> tuple[int, int]:
        return self.x_input, self.w_input

    def scalar_arguments(self) -> tuple[int, ...]:
        return (int(self.nhwc), *self.stride, *self.pad, *self.dilation, self.groups)

    def input_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        x = (self.n, self.h, self.w, self.c) if self.nhwc else (self.n, self.c, self.h, self.w)
        cg = self.c // self.groups
        w = (self.r, self.s, cg, self.k) if self.nhwc else (self.k, cg, self.r, self.s)
        return x, w

    def output_shape(self) -> tuple[int, ...]:
        return (self.n, self.p, self.q, self.k) if self.nhwc else (self.n, self.k, self.p, self.q)

    def flops(self) -> float:
        return 2.0 * self.n * self.k * self.p * self.q * (self.c // self.groups) * self.r * self.s

    def key(self) -> str:
        """Every field the call's time depends on, for library_times.json."""
        return (f"layout={'nhwc' if self.nhwc else 'nchw'} n={self.n} c={self.c} h={self.h} "
                f"w={self.w} k={self.k} r={self.r} s={self.s} p={self.p} q={self.q} "
                f"stride={self.stride[0]},{self.stride[1]} pad={self.pad[0]},{self.pad[1]} "
                f"dilation={self.dilation[0]},{self.dilation[1]} groups={self.groups}")


def match_conv(kernel_mod: tvm.IRModule) -> ConvSpec | None:
    """The convolution (and epilogue) kernel_mod's `main` computes, or None when it is not one."""
    func = float32_main(kernel_mod)
    blocks = None if func is None else _blocks(kernel_mod)
    if blocks is None:
        return None
    pad_block, conv_block, output_block = blocks
    inputs, output = list(func.params[:-1]), func.params[-1]
    spec = _spec_of(conv_block, pad_block, inputs)
    if spec is None:
        return None
    y_buffer = conv_block.body.buffer
    if output_block is None:
        if not y_buffer.same_as(output):
            return None
    else:
        steps = _epilogue_of(output_block, y_buffer, inputs, output, spec)
        if steps is None:
            return None
        spec = replace(spec, epilogue=steps)
    used = {spec.x_input, spec.w_input} | {step.input for step in spec.epilogue
                                           if step.input is not None}
    if used != set(range(len(inputs))) or _shape(output) != spec.output_shape():
        return None
    return spec


def _blocks(kernel_mod: tvm.IRModule):
    """(padding block or None, the reduction block, output block or None) once the blocks after
    the reduction are inlined into the last; None when anything else is left."""
    try:
        schedule = tvm.s_tir.Schedule(kernel_mod, error_render_level="fast")
        root = schedule.get_sblock("root", func_name="main")
        blocks = list(schedule.get_child_blocks(root))
        kinds = [is_reduction(schedule.get(b)) for b in blocks]
        if kinds.count(True) != 1 or kinds.index(True) > 1:
            return None
        at = kinds.index(True)
        for block in blocks[at + 1:-1]:
            schedule.compute_inline(block)
        left = [schedule.get(block) for block in schedule.get_child_blocks(root)]
        if any(list(schedule.get_child_blocks(block)) for block in schedule.get_child_blocks(root)):
            return None
    except (RuntimeError, ValueError):  # ScheduleError is a RuntimeError
        return None
    if len(left) > at + 2 or not all(isinstance(b.body, tirx.BufferStore) for b in left):
        return None
    pad = left[0] if at == 1 else None
    return pad, left[at], (left[at + 1] if len(left) == at + 2 else None)


def _spec_of(block, pad_block, inputs) -> ConvSpec | None:
    """The convolution of the reduction `block` (reading `pad_block`'s output or an input)."""
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    store = block.body
    if (len(spatial) != 4 or len(reduce) != 3 or len(block.iter_vars) != 7
            or any(_as_int(iv.dom.min) != 0 for iv in block.iter_vars)
            or not _is_zero_init(block.init, store) or not _same_vars(store.indices, spatial)):
        return None
    loads = accumulated_product(store, spatial)
    for weight, data in [] if loads is None else (loads[::-1], loads):
        spec = _with_operands(weight, data, spatial, reduce, pad_block, inputs,
                              _shape(store.buffer))
        if spec is not None:
            return spec
    return None


def _with_operands(weight, data, spatial, reduce, pad_block, inputs, y_shape):
    w_input = _input_position(weight.source, inputs)
    if w_input is None or len(weight.indices) != 4 or len(data.indices) != 4:
        return None
    w_idx = list(weight.indices)
    if _same_vars([w_idx[0]], [spatial[1]]) and _are_vars(w_idx[1:], reduce):
        nhwc, (n_var, k_var, p_var, q_var), (c_var, r_var, s_var) = False, spatial, w_idx[1:]
        ch, hh, ww = data.indices[1], data.indices[2], data.indices[3]
    elif _same_vars([w_idx[3]], [spatial[3]]) and _are_vars(w_idx[:3], reduce):
        nhwc, (n_var, p_var, q_var, k_var), (r_var, s_var, c_var) = True, spatial, w_idx[:3]
        ch, hh, ww = data.indices[3], data.indices[1], data.indices[2]
    else:
        return None
    w_shape = _shape(weight.source)
    k, cg, r, s = (w_shape[3], w_shape[2], w_shape[0], w_shape[1]) if nhwc else w_shape
    source = _padded_source(pad_block, data.source, inputs, nhwc)
    if source is None or not _same_vars([data.indices[0]], [n_var]):
        return None
    x_input, pad_top, pad_left = source
    x_shape = _shape(inputs[x_input])
    batch, h, w, c = x_shape if nhwc else (x_shape[0], x_shape[2], x_shape[3], x_shape[1])
    y_n, p, q, y_k = y_shape if nhwc else (y_shape[0], y_shape[2], y_shape[3], y_shape[1])
    if None in (k, cg, r, s, batch, h, w, c, y_n, p, q, y_k) or cg < 1 or c % cg \
            or batch != y_n or k != y_k:
        return None
    groups = c // cg
    if k % groups:
        return None
    stride_h, dil_h = _axis_steps(hh, p_var, r_var, r)
    stride_w, dil_w = _axis_steps(ww, q_var, s_var, s)
    dtype = k_var.ty.dtype
    expected_channel = c_var if groups == 1 else (
        tirx.floordiv(k_var, tirx.IntImm(dtype, k // groups)) * tirx.IntImm(dtype, cg) + c_var)
    if None in (stride_h, dil_h, stride_w, dil_w) \
            or not Analyzer().can_prove_equal(ch, expected_channel):
        return None
    spec = ConvSpec(nhwc, batch, c, h, w, k, r, s, p, q, (stride_h, stride_w),
                    (pad_top, pad_left), (dil_h, dil_w), groups, x_input, w_input)
    if _shape(inputs[w_input]) != spec.input_shapes()[1] or not _fits(spec):
        return None
    return spec


def _axis_steps(index, out_var, window_var, window: int):
    """(stride, dilation) when `index` is out * stride + window * dilation; (None, None) else."""
    coefficients = detect_linear_equation(index, [out_var, window_var])
    if len(coefficients) != 3 or any(_as_int(x) is None for x in coefficients):
        return None, None
    stride, dilation, offset = (_as_int(x) for x in coefficients)
    if window == 1:
        dilation = 1  # no window to dilate (its index is the constant 0)
    return (stride, dilation) if stride >= 1 and dilation >= 1 and offset == 0 else (None, None)


def _padded_source(pad_block, buffer, inputs, nhwc: bool):
    """(X's input position, top padding, left padding) of what the convolution reads: an input
    itself, or the padding block's output; None when it is neither."""
    if pad_block is None or not pad_block.body.buffer.same_as(buffer):
        position = _input_position(buffer, inputs) if pad_block is None else None
        return None if position is None else (position, 0, 0)
    store, iters = pad_block.body, [iv.var for iv in pad_block.iter_vars]
    value = store.value
    if (len(iters) != 4 or any(iv.iter_type != tirx.IterVar.DataPar for iv in pad_block.iter_vars)
            or not _same_vars(store.indices, iters)):
        return None
    if isinstance(value, tvm.ir.TensorLoad):  # a padding of 0: a plain copy
        cond, inside, outside = tirx.IntImm("bool", 1), value, tirx.FloatImm("float32", 0.0)
    elif _is_call(value, "if_then_else"):
        cond, inside, outside = value.args
    else:
        return None
    if not (isinstance(outside, tirx.FloatImm) and float(outside.value) == 0.0
            and isinstance(inside, tvm.ir.TensorLoad)):
        return None
    position = _input_position(inside.source, inputs)
    if position is None or len(inside.indices) != 4:
        return None
    offsets = [detect_linear_equation(index, [var]) for index, var in zip(inside.indices, iters)]
    if any(len(o) != 2 or _as_int(o[0]) != 1 or _as_int(o[1]) is None for o in offsets):
        return None
    shifts = [-_as_int(o[1]) for o in offsets]
    spatial_axes = (1, 2) if nhwc else (2, 3)
    if any(shifts[axis] != 0 for axis in range(4) if axis not in spatial_axes) \
            or any(shifts[axis] < 0 for axis in spatial_axes):
        return None
    x_shape, padded_shape = _shape(inputs[position]), _shape(buffer)
    if None in x_shape or None in padded_shape:  # dynamic sizes: no fixed geometry to call
        return None
    for axis in spatial_axes:
        if not _is_window(cond, iters, axis, shifts[axis], x_shape[axis], padded_shape):
            return None
    return position, shifts[spatial_axes[0]], shifts[spatial_axes[1]]


def _is_window(cond, iters, axis: int, shift: int, size: int, padded_shape) -> bool:
    """Whether `cond` holds exactly for shift <= iters[axis] < shift + size along that axis:
    checked at its four edges, the other indices in the middle of their range."""
    middle = {var: (shift + size // 2 if n == axis else
                    padded_shape[n] // 2) for n, var in enumerate(iters)}
    for value, want in ((shift - 1, False), (shift, True), (shift + size - 1, True),
                        (shift + size, False)):
        if not 0 <= value < padded_shape[axis]:
            continue
        analyzer = Analyzer()
        for var, at in {**middle, iters[axis]: value}.items():
            analyzer.bind(var, tirx.IntImm(var.ty.dtype, at))
        result = analyzer.simplify(cond)
        if not isinstance(result, tirx.IntImm) or bool(result.value) != want:
            return False
    return True


def _epilogue_of(block, y_buffer, inputs, output, spec: ConvSpec):
    """The output block's epilogue steps over Y, the bias along the channel axis."""
    y_shape = spec.output_shape()
    index_vars = output_index_vars(block, output, y_shape)
    if index_vars is None:
        return None
    bias = (("bias_n", -1),) if spec.nhwc else (("bias_m", -3),)
    return EpilogueMatcher(y_buffer, index_vars, inputs, y_shape, bias).match(block.body.value)


def _fits(spec: ConvSpec) -> bool:
    """Sizes the extension takes (32-bit GEMM sizes, a bounded im2col buffer)."""
    cg = spec.c // spec.groups
    window, positions = cg * spec.r * spec.s, spec.p * spec.q
    return (all(0 < x <= _INT32_MAX for x in (window, positions, spec.k, spec.c))
            and window * positions <= MAX_COLUMN_FLOATS)


def _input_position(buffer, inputs) -> int | None:
    found = [n for n, p in enumerate(inputs) if p.same_as(buffer)]
    return found[0] if len(found) == 1 else None


def _are_vars(indices, variables) -> bool:
    """indices are the given variables, each once, in any order."""
    return (len(indices) == len(variables) and all(isinstance(i, tirx.Var) for i in indices)
            and all(sum(i.same_as(v) for i in indices) == 1 for v in variables))


def _is_call(expr, name: str) -> bool:
    """A call of the operator `name` (TVM 0.27 names it prim.NAME or tirx.NAME)."""
    return isinstance(expr, tvm.ir.expr.Call) and isinstance(expr.op, tvm.ir.Op) \
        and expr.op.name in (f"prim.{name}", f"tirx.{name}")


def _shape(buffer) -> tuple:
    return tuple(_as_int(s) for s in buffer.shape)
