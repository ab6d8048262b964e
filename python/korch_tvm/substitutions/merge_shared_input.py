"""MatMuls (and convolutions) that read the same input merged into one, parts taken by slices.

Q/K/V projections (BERT, SegFormer's K/V) and sibling convolutions each read the activation
once and each are a small GEMM; one GEMM on the concatenated weights reads the activation once,
keeps a wider tile busy and is one kernel launch, at the price of slices (which fuse into the
consumers). The weights are constants in the primitive program, so their concatenation is done
here once (no weight-only primitive in the body); where a weight is a parameter the body
concatenates it with its own `concat` binding, which reads weights only.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from tvm import relax

from .alternative import Alternative
from .program import R, Program, build_alternative, constant_array, dtype_of, static_shape


def _merged_weight(bb, weights: list, axis: int):
    arrays = [constant_array(weight) for weight in weights]
    if all(array is not None for array in arrays):
        return relax.const(np.concatenate(arrays, axis=axis), dtype_of(weights[0]))
    return bb.emit(R.concat(weights, axis=axis))


def _merged_alternative(name: str, source, members, weight_axis: int, out_axis: int):
    """One call of `members[0]`'s op and attrs on the concatenated weights, sliced apart."""
    outs = [out for out, _ in members]
    widths = [static_shape(out)[out_axis] for out in outs]
    template = members[0][1]

    def emit(bb, x, *weights):
        merged = bb.emit(relax.Call(template.op, [x, _merged_weight(bb, list(weights),
                                                                    weight_axis)], template.attrs))
        offsets = np.cumsum([0] + widths)
        return [R.strided_slice(merged, axes=[out_axis], begin=[int(offsets[i])],
                                end=[int(offsets[i + 1])]) for i in range(len(outs))]

    return build_alternative(name, [source] + [call.args[1] for _, call in members], outs, emit)


def _is_weight(program: Program, value) -> bool:
    return constant_array(value) is not None or any(value.same_as(p) for p in program.params)


def _matmul_key(program: Program, call):
    """What matmuls must share to merge: the input and a 2-D weight's row count and dtype.
    The weight must be a constant or a parameter, so that concatenating it is weight-only."""
    source, weight = call.args
    shape = static_shape(weight)
    if shape is None or len(shape) != 2 or static_shape(source) is None:
        return None
    if not _is_weight(program, weight):
        return None
    return source, shape[0], dtype_of(weight), str(call.attrs.out_dtype)


def _conv_key(program: Program, call):
    """What convolutions must share to merge: input, attrs, and the kernel but for its 'O'."""
    attrs, kernel = call.attrs, call.args[1]
    shape = static_shape(kernel)
    if int(attrs.groups) != 1 or shape is None or not _is_weight(program, kernel):
        return None
    o_axis = str(attrs.kernel_layout).index("O")
    rest = tuple(dim for axis, dim in enumerate(shape) if axis != o_axis)
    return (call.args[0], rest, dtype_of(kernel), tuple(attrs.strides), tuple(attrs.padding),
            tuple(attrs.dilation), str(attrs.data_layout), str(attrs.kernel_layout),
            str(attrs.out_layout), str(attrs.out_dtype))


def _groups(program: Program, op_name: str, key_of) -> list[list]:
    groups = defaultdict(list)
    for out, call in program.calls(op_name):
        key = key_of(program, call)
        if key is not None:
            groups[key].append((out, call))
    return [members for members in groups.values() if len(members) >= 2]


class MergeMatmulsSharingInput:
    """matmul(X, W1), matmul(X, W2), ... -> slices of matmul(X, concat(W1, W2, ...))."""

    name = "merge_matmuls_sharing_input"

    def find(self, main) -> list[Alternative]:
        return [_merged_alternative(self.name, members[0][1].args[0], members, 1, -1)
                for members in _groups(Program(main), "relax.matmul", _matmul_key)]


class MergeConvolutionsSharingInput:
    """conv2d(X, K1), conv2d(X, K2), ... (same attrs, groups 1) -> channel slices of one conv2d
    on the kernels concatenated along their output-channel axis."""

    name = "merge_convolutions_sharing_input"

    def find(self, main) -> list[Alternative]:
        found = []
        for members in _groups(Program(main), "relax.nn.conv2d", _conv_key):
            attrs = members[0][1].attrs
            out_layout = str(attrs.out_layout) or str(attrs.data_layout)
            found.append(_merged_alternative(
                self.name, members[0][1].args[0], members, str(attrs.kernel_layout).index("O"),
                out_layout.index("C")))
        return found

