"""Bilinear resize lowered to two one-axis passes: along the width, then along the height.

TOPI's resize computes every output element from four input pixels whose positions it derives
from the element's coordinates; on `llvm` the vector lanes of a row then read scattered
addresses, which LLVM emits as one scalar load and insert per lane. Split by axis, the pass
along the height reads whole rows (one row index per output row, the same for every lane) and
the pass along the width runs at the input's height, where there are far fewer elements:
upsampling a 21-channel 16x16 map to 256x256 took 2.0 ms as one kernel and 0.16 ms as the two
passes in NCHW, 1.5 and 0.42 ms in NHWC with the transpose to NCHW after it
(bench/results/separable-resize.txt). Each pass is `take` of the two neighbouring
rows or columns and a weighted sum, with index and weight tables computed here as TOPI computes
them, in the same float32 steps and in the same order (width blends first), so the values match
the one-kernel resize.

A resize of many channels stays one primitive: fused with the layout changes around it, its
kernel can run the vector along the channels, where each neighbour is one contiguous load, and
it reads its input once. SegFormer-b0's head (256 channels, four maps into one concat) ran 1.18x
slower lowered, its passes writing four 64x64x256 maps that the concat then read again. The
lowering pays where the vector must run along the columns: a segmentation head's 21 classes.

Only what TOPI's linear resize defines this way is lowered: float32, 4-D NCHW or NHWC, static
shapes, fewer than `MANY_CHANNELS` channels, coordinate modes half_pixel, pytorch_half_pixel,
align_corners and asymmetric. Other calls stay one `image.resize2d` primitive.
"""

from __future__ import annotations

import numpy as np
from tvm import relax

from .shapes import static_dims

R = relax.op
MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
MANY_CHANNELS = 32  # two AVX-512 vectors of float32: enough to vectorize along
FLOAT32 = "float32"


def source_coordinates(size_in: int, size_out: int, mode: str) -> np.ndarray:
    """Where each output position samples the input, in TOPI's float32 arithmetic."""
    position = np.arange(size_out, dtype=np.float32)
    half = np.float32(0.5)
    scale = np.float32(size_in) / np.float32(size_out)
    if mode == "half_pixel" or (mode == "pytorch_half_pixel" and size_out > 1):
        return (position + half) * scale - half
    if mode == "pytorch_half_pixel":
        return np.zeros(size_out, np.float32)
    if mode == "align_corners":
        return np.float32(size_in - 1) / np.float32(size_out - 1) * position
    return scale * position


def interpolation_tables(size_in: int, size_out: int, mode: str):
    """(first index, second index, first weight, second weight) per output position: the two
    clamped neighbours and their linear weights."""
    coordinate = source_coordinates(size_in, size_out, mode)
    lower = np.floor(coordinate).astype(np.int32)
    fraction = coordinate - lower.astype(np.float32)
    first = np.clip(lower, 0, size_in - 1).astype(np.int32)
    second = np.clip(lower + 1, 0, size_in - 1).astype(np.int32)
    return first, second, np.float32(1.0) - fraction, fraction


def _is_identity(first: np.ndarray, second_weight: np.ndarray) -> bool:
    return bool(np.array_equal(first, np.arange(len(first))) and not second_weight.any())


def _along_axis(bb, x: relax.Expr, axis: int, size_in: int, size_out: int, mode: str,
                name: str) -> relax.Expr | None:
    """`x` resized along `axis` (the other axes untouched): the weighted sum, not yet emitted,
    after the takes and products it adds; None where the resize leaves the axis as it is."""
    first, second, first_weight, second_weight = interpolation_tables(size_in, size_out, mode)
    if _is_identity(first, second_weight):
        return None
    shape = [1] * x.ty.ndim
    shape[axis] = size_out
    terms = []
    for index, weight, part in ((first, first_weight, "lo"), (second, second_weight, "hi")):
        taken = bb.emit(R.take(x, relax.const(index), axis=axis, mode="clip"), f"{name}_{part}")
        weights = relax.const(weight.reshape(shape))
        terms.append(bb.emit(R.multiply(taken, weights), f"{name}_{part}_weighted"))
    return R.add(*terms)


def lower_resize2d(bb, call):
    """The rule for `relax.image.resize2d` (see the module docstring), or None to keep it."""
    attrs, x = call.attrs, call.args[0]
    layout, mode = str(attrs.layout), str(attrs.coordinate_transformation_mode)
    dims = static_dims(x)
    if (str(attrs.method) != "linear" or mode not in MODES or layout not in ("NCHW", "NHWC")
            or dims is None or dims[layout.index("C")] >= MANY_CHANNELS
            or str(x.ty.dtype) != FLOAT32 or attrs.out_dtype not in (None, "", FLOAT32)):
        return None
    size = [int(value) for value in call.args[1].values]
    if mode == "align_corners" and min(size) < 2:
        return None  # TOPI divides by (size - 1)
    height, width = layout.index("H"), layout.index("W")
    wide = _along_axis(bb, x, width, dims[width], size[1], mode, "resize_width")
    if wide is not None:
        wide = bb.emit(wide, "resize_width")
    tall = _along_axis(bb, x if wide is None else wide, height, dims[height], size[0], mode,
                       "resize_height")
    return tall if tall is not None else wide if wide is not None else x
