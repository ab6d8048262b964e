"""A fused projection whose output is sliced apart, computed as separate projections on weight
slices (the inverse of merging matmuls that share an input).

timm ViTs compute q, k and v with one Linear (`x @ W[192, 576] + b`, reshaped to
[B, N, 3, H, D], permuted, sliced along the 3); EfficientViT does the same with one 1x1
convolution split along channels. Separate projections let each part fuse with its own
consumer (the scaling of q, the transpose of k) and drop the reshape/permute/slice chain, at
the price of reading the input three times. Weights and biases must be constants: their
slices are taken here, so the body holds no weight-only primitive.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .alternative import Alternative
from .program import (R, Program, build_alternative, constant_array, dtype_of, int_values,
                      static_shape)


class _Chain:
    """producer -> [bias add] -> [reshape] -> [permute_dims], found from the producer on."""

    def __init__(self, program: Program, out, call, channel_axis: int, weight_axis: int):
        self.out, self.call, self.weight_axis = out, call, weight_axis
        self.channel_axis = channel_axis % len(static_shape(out))
        self.bias = self.bias_first = self.tail = self.axes = None
        self.end = self._walk(program, out)

    def _walk(self, program: Program, var):
        shape = static_shape(self.out)
        while len(program.readers(var)) == 1 and var not in program.outputs:
            reader = program.readers(var)[0]
            call = program.call_of(reader)
            if call is None or static_shape(reader) is None:
                return var
            name = call.op.name
            if name == "relax.reshape" and static_shape(reader) == static_shape(var):
                var = reader
            elif name == "relax.add" and self.bias is None and self.tail is None \
                    and self.axes is None and self._take_bias(call, var):
                var = reader
            elif name == "relax.reshape" and self.tail is None and self.axes is None and \
                    self.channel_axis == len(shape) - 1 and \
                    static_shape(reader)[:len(shape) - 1] == shape[:-1]:
                self.tail, var = static_shape(reader)[len(shape) - 1:], reader
            elif name == "relax.permute_dims" and self.axes is None and call.attrs.axes is not None:
                self.axes, var = [int(axis) for axis in call.attrs.axes], reader
            else:
                return var
        return var

    def _take_bias(self, call, var) -> bool:
        first = call.args[1].same_as(var)
        bias = constant_array(call.args[0] if first else call.args[1])
        ndim = len(static_shape(self.out))
        if bias is None or bias.ndim > ndim:
            return False
        aligned = bias.reshape((1,) * (ndim - bias.ndim) + bias.shape)
        if any(dim != 1 for axis, dim in enumerate(aligned.shape) if axis != self.channel_axis):
            return False
        self.bias, self.bias_first = aligned, first
        return True

    def channel_block(self, slice_call) -> tuple[int, int] | None:
        """The producer's channels [lo, hi) that a strided_slice of the chain's end reads."""
        axes, begin, end = (int_values(arg) for arg in slice_call.args[1:4])
        strides = int_values(slice_call.args[4]) if len(slice_call.args) > 4 else [1]
        if axes is None or begin is None or end is None or len(axes) != 1 or strides != [1]:
            return None
        ndim = len(static_shape(self.end))
        axis = axes[0] % ndim
        axis = self.axes[axis] if self.axes is not None else axis
        extent = static_shape(slice_call.args[0])[axes[0]]
        lo, hi = max(begin[0], 0), min(end[0], extent)
        if self.tail is None:
            return (lo, hi) if axis == self.channel_axis and lo < hi else None
        inner = int(np.prod(self.tail[1:], dtype=np.int64))
        return (lo * inner, hi * inner) if axis == self.channel_axis and lo < hi else None

    def part(self, bb, x, weight: np.ndarray, lo: int, hi: int):
        """The chain computed for channels [lo, hi) only; its last call is not emitted."""
        index = [slice(None)] * weight.ndim
        index[self.weight_axis] = slice(lo, hi)
        value = relax.Call(self.call.op, [x, relax.const(weight[tuple(index)], dtype_of(x))],
                           self.call.attrs)
        if self.bias is not None:
            index = [slice(None)] * self.bias.ndim
            index[self.channel_axis] = slice(lo, hi)
            bias = relax.const(np.ascontiguousarray(self.bias[tuple(index)]), dtype_of(x))
            value = R.add(bias, bb.emit(value)) if self.bias_first else R.add(bb.emit(value), bias)
        if self.tail is not None:
            inner = int(np.prod(self.tail[1:], dtype=np.int64))
            shape = static_shape(self.out)[:-1] + [(hi - lo) // inner] + self.tail[1:]
            value = R.reshape(bb.emit(value), shape)
        if self.axes is not None:
            value = R.permute_dims(bb.emit(value), self.axes)
        return value


def _producers(program: Program):
    """(out, call, channel axis of out, output-channel axis of the weight) of each projection
    with a constant weight: matmuls with a 2-D weight, convolutions with groups 1."""
    for out, call in program.calls("relax.matmul"):
        weight = constant_array(call.args[1])
        if weight is not None and weight.ndim == 2 and static_shape(out) is not None:
            yield out, call, -1, 1
    for out, call in program.calls("relax.nn.conv2d"):
        attrs = call.attrs
        if constant_array(call.args[1]) is not None and int(attrs.groups) == 1:
            layout = str(attrs.out_layout) or str(attrs.data_layout)
            yield out, call, layout.index("C"), str(attrs.kernel_layout).index("O")


class SplitFusedProjection:
    """slices of (x @ W + b) reshaped/permuted -> (x @ W[:, part] + b[part]) reshaped/permuted,
    one per slice; the same for a convolution split along its output channels."""

    name = "split_fused_projection"

    def find(self, main) -> list[Alternative]:
        program, found = Program(main), []
        for out, call, channel_axis, weight_axis in _producers(program):
            chain = _Chain(program, out, call, channel_axis, weight_axis)
            slices = [(reader, program.call_of(reader, "relax.strided_slice"))
                      for reader in program.readers(chain.end)]
            blocks = [(reader, chain.channel_block(sliced)) for reader, sliced in slices
                      if sliced is not None]
            blocks = [(reader, block) for reader, block in blocks if block is not None]
            if len(blocks) < 2:
                continue
            weight = constant_array(call.args[1])
            found.append(build_alternative(
                self.name, [call.args[0]], [reader for reader, _ in blocks],
                lambda bb, x, chain=chain, weight=weight, blocks=blocks:
                    [chain.part(bb, x, weight, lo, hi) for _, (lo, hi) in blocks]))
        return found
