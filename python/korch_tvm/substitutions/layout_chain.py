"""A chain of permute_dims / reshape that composes to one op, computed as that one op.

The ONNX importer leaves multi-step layout chains (SegFormer's reshape to [1, N, 1, C] and a
permute moving the unit axis; head splits and merges): each step is a kernel of its own or an
extra copy inside a fused kernel, while the composite is often a single reshape (a free view) or
a single permute (one copy). The chain is composed on an index array, so any mix of
reshapes and permutes is recognized exactly.

Not offered, because Relax cannot express it with primitive ops: a permute_dims swapping the
last two axes of a matmul operand computed as a transposed matmul. `R.matmul` has no transpose
flags (its only attribute is out_dtype), and `relax.transform.FuseTransposeMatmul` replaces the
pair by a call_tir of its own TIR, which the primitive graph treats as opaque. The candidate
kernels already fuse such a permute into the matmul that reads it, which is the same kernel.
"""

from __future__ import annotations

import itertools

import numpy as np

from .alternative import Alternative
from .program import R, Program, build_alternative, constant_array, static_shape

LAYOUT_OPS = ("relax.reshape", "relax.permute_dims")
MAX_PERMUTED_RANK = 6  # composites of higher rank are searched no further (6! = 720 tries)


def _step(program: Program, var):
    """(source, numpy function) of the layout op binding `var`; None for anything else."""
    call = program.call_of(var)
    if call is None or call.op.name not in LAYOUT_OPS or static_shape(var) is None:
        return None
    if call.op.name == "relax.reshape":
        shape = static_shape(var)
        return call.args[0], lambda array: array.reshape(shape)
    axes = None if call.attrs.axes is None else [int(axis) for axis in call.attrs.axes]
    return call.args[0], lambda array: np.transpose(array, axes)


def _chain(program: Program, var) -> list:
    """[(source, function), ...] from `var` back to the first value not made by a layout op."""
    steps = []
    step = _step(program, var)
    while step is not None:
        steps.append(step)
        step = _step(program, step[0])
    return steps


def _composite(source_shape: list[int], functions: list, target_shape: list[int]):
    """("reshape", shape) or ("permute", axes) equal to applying `functions` in order, or None."""
    size = int(np.prod(source_shape, dtype=np.int64))
    index = np.arange(size).reshape(source_shape)
    for function in functions:
        index = function(index)
    if np.array_equal(index.reshape(-1), np.arange(size)):
        return "reshape", target_shape
    if len(source_shape) != len(target_shape) or len(source_shape) > MAX_PERMUTED_RANK:
        return None
    base = np.arange(size).reshape(source_shape)
    for axes in itertools.permutations(range(len(source_shape))):
        if [source_shape[axis] for axis in axes] == target_shape and \
                np.array_equal(np.transpose(base, axes), index):
            return "permute", list(axes)
    return None


class FoldLayoutChain:
    """reshape / permute_dims chains of two or more ops -> the one reshape or permute_dims
    they compose to (the longest such chain ending at each value)."""

    name = "fold_layout_chain"

    def find(self, main) -> list[Alternative]:
        program, found = Program(main), []
        for binding in program.bindings:
            out = binding.var
            steps = _chain(program, out)
            for length in range(len(steps), 1, -1):
                source = steps[length - 1][0]
                if static_shape(source) is None or constant_array(source) is not None:
                    continue
                functions = [function for _, function in reversed(steps[:length])]
                composite = _composite(static_shape(source), functions, static_shape(out))
                if composite is not None:
                    found.append(build_alternative(
                        self.name, [source], [out],
                        lambda bb, x, composite=composite: [_emit(x, composite)]))
                    break
        return found


def _emit(x, composite):
    kind, value = composite
    return R.reshape(x, value) if kind == "reshape" else R.permute_dims(x, value)
