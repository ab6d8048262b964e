"""The lowering rules: one function per composite Relax operator, emitting its primitives.

Kept apart from the pass (``fission.py``) so that adding an operator means adding one function
here and one entry in ``LOWERING_RULES``; the pass only walks the module and applies them.
"""

import math

import tvm
from tvm import relax

from .separable_resize import lower_resize2d
from .shapes import static_dims

R = relax.op


# ---------------------------------------------------------------- helpers shared by the rules


def _dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def _scalar(value: float, like: relax.Expr) -> relax.Expr:
    """A constant in the dtype of ``like``, so float16 graphs stay float16."""
    return relax.const(value, _dtype(like))


def _normalized_axes(axes, ndim: int) -> list[int]:
    if axes is None:
        return list(range(ndim))
    if isinstance(axes, (int, tvm.tirx.IntImm)):
        axes = [axes]
    return sorted(int(axis) % ndim for axis in axes)


def _aligned_to_axes(bb, param: relax.Expr, ndim: int, axes: list[int], name: str) -> relax.Expr:
    """Reshape a parameter that spans ``axes`` of an ``ndim`` tensor so that it broadcasts there.

    Trailing axes already line up under numpy broadcasting, so no reshape is emitted for them.
    """
    if axes == list(range(ndim - len(axes), ndim)) and param.ty.ndim == len(axes):
        return param
    param_dims = list(param.ty.shape.values)
    target = [1] * ndim
    for axis, dim in zip(axes, param_dims):
        target[axis] = dim
    return bb.emit(R.reshape(param, target), name)


def _scaled_and_shifted(bb, value: relax.Expr, scale: float, shift: float, like: relax.Expr,
                        names: tuple[str | None, str]) -> relax.Expr:
    """``value * scale + shift`` with scalars in the dtype of ``like``, both steps emitted.

    A scale of 1 emits no multiply (its name may then be None); ``names`` name the two steps.
    """
    if scale != 1.0:
        value = bb.emit(R.multiply(value, _scalar(scale, like)), names[0])
    return bb.emit(R.add(value, _scalar(shift, like)), names[1])


def _normalize_over(bb, x: relax.Expr, axes: list[int], epsilon: float, prefix: str):
    """(x - mean) * rsqrt(var + eps) over ``axes``: the core every norm shares."""
    mean = bb.emit(R.mean(x, axis=axes, keepdims=True), f"{prefix}_mean")
    centered = bb.emit(R.subtract(x, mean), f"{prefix}_centered")
    squared = bb.emit(R.multiply(centered, centered), f"{prefix}_squared")
    variance = bb.emit(R.mean(squared, axis=axes, keepdims=True), f"{prefix}_var")
    shifted = bb.emit(R.add(variance, _scalar(epsilon, x)), f"{prefix}_var_eps")
    inverse_std = bb.emit(R.rsqrt(shifted), f"{prefix}_rstd")
    return bb.emit(R.multiply(centered, inverse_std), f"{prefix}_normed")


def _scale_and_shift(bb, y, gamma, beta, attrs, param_axes: list[int], prefix: str):
    """Apply the norm's affine part as far as ``attrs.scale``/``attrs.center`` ask for it.

    ``gamma``/``beta`` span ``param_axes`` of ``y``. The last primitive is returned un-emitted
    so that it takes the call's variable.
    """
    ndim = y.ty.ndim
    if attrs.scale and attrs.center:
        gamma = _aligned_to_axes(bb, gamma, ndim, param_axes, f"{prefix}_gamma")
        y = bb.emit(R.multiply(y, gamma), f"{prefix}_scaled")
    elif attrs.scale:
        return R.multiply(y, _aligned_to_axes(bb, gamma, ndim, param_axes, f"{prefix}_gamma"))
    if attrs.center:
        return R.add(y, _aligned_to_axes(bb, beta, ndim, param_axes, f"{prefix}_beta"))
    return y


# ---------------------------------------------------------------- one rule per composite operator
# A rule takes (block builder, call with already-rewritten arguments) and returns the replacement
# expression, or None to keep the call as it is. Intermediate primitives are emitted; the final
# one is returned un-emitted so that it keeps the original binding's variable.


def _softmax(bb, call):
    x, axes = call.args[0], [int(call.attrs.axis)]
    row_max = bb.emit(R.max(x, axis=axes, keepdims=True), "softmax_max")
    shifted = bb.emit(R.subtract(x, row_max), "softmax_shifted")  # exp never overflows
    exps = bb.emit(R.exp(shifted), "softmax_exp")
    total = bb.emit(R.sum(exps, axis=axes, keepdims=True), "softmax_sum")
    return R.divide(exps, total)


def _log_softmax(bb, call):
    x, axes = call.args[0], [int(call.attrs.axis)]
    row_max = bb.emit(R.max(x, axis=axes, keepdims=True), "log_softmax_max")
    shifted = bb.emit(R.subtract(x, row_max), "log_softmax_shifted")
    exps = bb.emit(R.exp(shifted), "log_softmax_exp")
    total = bb.emit(R.sum(exps, axis=axes, keepdims=True), "log_softmax_sum")
    log_total = bb.emit(R.log(total), "log_softmax_log_sum")
    return R.subtract(shifted, log_total)


def _layer_norm(bb, call):
    x, gamma, beta = call.args
    attrs, ndim = call.attrs, x.ty.ndim
    axes = _normalized_axes(attrs.axes, ndim)
    y = _normalize_over(bb, x, axes, float(attrs.epsilon), "layer_norm")
    return _scale_and_shift(bb, y, gamma, beta, attrs, axes, "layer_norm")


def _rms_norm(bb, call):
    x, weight = call.args
    ndim = x.ty.ndim
    axes = _normalized_axes(call.attrs.axes, ndim)
    squared = bb.emit(R.multiply(x, x), "rms_norm_squared")
    mean_square = bb.emit(R.mean(squared, axis=axes, keepdims=True), "rms_norm_mean_square")
    shifted = bb.emit(R.add(mean_square, _scalar(float(call.attrs.epsilon), x)), "rms_norm_eps")
    inverse_rms = bb.emit(R.rsqrt(shifted), "rms_norm_rrms")
    y = bb.emit(R.multiply(x, inverse_rms), "rms_norm_normed")
    return R.multiply(y, _aligned_to_axes(bb, weight, ndim, axes, "rms_norm_weight"))


def _instance_norm(bb, call):
    x, gamma, beta = call.args
    attrs, ndim = call.attrs, x.ty.ndim
    axes = _normalized_axes(attrs.axes, ndim)
    y = _normalize_over(bb, x, axes, float(attrs.epsilon), "instance_norm")
    channel = [int(attrs.channel_axis) % ndim]
    return _scale_and_shift(bb, y, gamma, beta, attrs, channel, "instance_norm")


def _group_norm(bb, call):
    """Split the channel axis into (groups, channels per group), normalise each group, undo."""
    x, gamma, beta = call.args
    attrs, dims = call.attrs, static_dims(call.args[0])
    if dims is None:
        return None
    ndim, groups = len(dims), int(attrs.num_groups)
    channel_axis = int(attrs.channel_axis) % ndim
    group_dims = [groups, dims[channel_axis] // groups]
    grouped_dims = dims[:channel_axis] + group_dims + dims[channel_axis + 1:]
    # in the grouped tensor, axes after the channel axis move one to the right
    reduce_axes = [channel_axis + 1] + [
        axis + 1 if axis > channel_axis else axis for axis in _normalized_axes(attrs.axes, ndim)
    ]
    grouped = bb.emit(R.reshape(x, grouped_dims), "group_norm_grouped")
    normed = _normalize_over(bb, grouped, sorted(reduce_axes), float(attrs.epsilon), "group_norm")
    y = bb.emit(R.reshape(normed, dims), "group_norm_ungrouped")
    return _scale_and_shift(bb, y, gamma, beta, attrs, [channel_axis], "group_norm")


def _batch_norm(bb, call):
    """Inference form: y = (x - mean) * (gamma * rsqrt(var + eps)) + beta, per channel.

    The per-channel factor is computed on the small parameter vectors, not the activation.
    Returns the (y, moving_mean, moving_var) tuple the op promises; training mode is kept.
    """
    x, gamma, beta, moving_mean, moving_var = call.args
    attrs, ndim = call.attrs, x.ty.ndim
    if attrs.training:
        return None
    channel = [int(attrs.axis) % ndim]
    shifted_var = bb.emit(R.add(moving_var, _scalar(float(attrs.epsilon), x)), "batch_norm_var_eps")
    factor = bb.emit(R.rsqrt(shifted_var), "batch_norm_rstd")
    if attrs.scale:
        factor = bb.emit(R.multiply(factor, gamma), "batch_norm_factor")
    mean = _aligned_to_axes(bb, moving_mean, ndim, channel, "batch_norm_mean")
    factor = _aligned_to_axes(bb, factor, ndim, channel, "batch_norm_factor_aligned")
    centered = bb.emit(R.subtract(x, mean), "batch_norm_centered")
    y = bb.emit(R.multiply(centered, factor), "batch_norm_scaled")
    if attrs.center:
        y = bb.emit(R.add(y, _aligned_to_axes(bb, beta, ndim, channel, "batch_norm_beta")),
                    "batch_norm_out")
    return relax.Tuple([y, moving_mean, moving_var])


def _variance(bb, call):
    x = call.args[0]
    axes = _normalized_axes(call.attrs.axis, x.ty.ndim)
    mean = bb.emit(R.mean(x, axis=axes, keepdims=True), "variance_mean")
    centered = bb.emit(R.subtract(x, mean), "variance_centered")
    squared = bb.emit(R.multiply(centered, centered), "variance_squared")
    return R.mean(squared, axis=axes, keepdims=bool(call.attrs.keepdims))


def _std(bb, call):
    variance = bb.emit(_variance(bb, call), "std_variance")
    return R.sqrt(variance)


def _gelu(bb, call):
    """x * (0.5 + 0.5 * erf(x / sqrt 2)); erf runs in float32 for float16 inputs, as TVM's does."""
    x = call.args[0]
    scaled = bb.emit(R.multiply(x, _scalar(0.5**0.5, x)), "gelu_scaled")
    if _dtype(x) == "float16":
        wide = bb.emit(R.astype(scaled, "float32"), "gelu_widened")
        erf = bb.emit(R.astype(bb.emit(R.erf(wide), "gelu_erf_wide"), "float16"), "gelu_erf")
    else:
        erf = bb.emit(R.erf(scaled), "gelu_erf")
    gate = _scaled_and_shifted(bb, erf, 0.5, 0.5, x, ("gelu_half_erf", "gelu_gate"))
    return R.multiply(x, gate)


def _gelu_tanh(bb, call):
    """0.5 * x * (1 + tanh(sqrt(2/pi) * x * (1 + 0.044715 * x^2)))."""
    x = call.args[0]
    squared = bb.emit(R.multiply(x, x), "gelu_tanh_squared")
    inner = _scaled_and_shifted(bb, squared, 0.044715, 1.0, x, ("gelu_tanh_cubic", "gelu_tanh_inner"))
    inner = bb.emit(R.multiply(x, inner), "gelu_tanh_poly")
    inner = bb.emit(R.multiply(inner, _scalar(math.sqrt(2.0 / math.pi), x)), "gelu_tanh_arg")
    tanh = bb.emit(R.tanh(inner), "gelu_tanh_tanh")
    gate = _scaled_and_shifted(bb, tanh, 1.0, 1.0, x, (None, "gelu_tanh_gate"))
    half_x = bb.emit(R.multiply(x, _scalar(0.5, x)), "gelu_tanh_half_x")
    return R.multiply(half_x, gate)


def _silu(bb, call):
    x = call.args[0]
    return R.multiply(x, bb.emit(R.sigmoid(x), "silu_sigmoid"))


def _selu(bb, call):
    """scale * (max(x, 0) + min(0, alpha * (exp(x) - 1))), the constants of the SELU paper."""
    x = call.args[0]
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    positive = bb.emit(R.maximum(x, _scalar(0.0, x)), "selu_positive")
    exps = bb.emit(R.exp(x), "selu_exp")
    exp_minus_one = bb.emit(R.subtract(exps, _scalar(1.0, x)), "selu_expm1")
    scaled = bb.emit(R.multiply(exp_minus_one, _scalar(alpha, x)), "selu_alpha")
    negative = bb.emit(R.minimum(scaled, _scalar(0.0, x)), "selu_negative")
    total = bb.emit(R.add(positive, negative), "selu_sum")
    return R.multiply(total, _scalar(scale, x))


def _softplus(bb, call):
    """log(1 + exp(beta x)) / beta, switching to x above the threshold where exp would overflow."""
    x, beta, threshold = call.args[0], float(call.attrs.beta), float(call.attrs.threshold)
    scaled = x if beta == 1.0 else bb.emit(R.multiply(x, _scalar(beta, x)), "softplus_scaled")
    exps = bb.emit(R.exp(scaled), "softplus_exp")
    one_plus = bb.emit(R.add(exps, _scalar(1.0, x)), "softplus_one_plus")
    smooth = bb.emit(R.log(one_plus), "softplus_log")
    if beta != 1.0:
        smooth = bb.emit(R.divide(smooth, _scalar(beta, x)), "softplus_unscaled")
    linear_region = bb.emit(R.greater(scaled, _scalar(threshold, x)), "softplus_linear_region")
    return R.where(linear_region, x, smooth)


def _split(bb, call):
    """One strided slice per output, so every output is its own primitive."""
    x = call.args[0]
    ndim = x.ty.ndim
    axis = int(call.attrs.axis) % ndim
    axis_extent = x.ty.shape.values[axis]
    split = call.attrs.indices_or_sections
    if isinstance(split, (int, tvm.tirx.IntImm)):
        if not isinstance(axis_extent, tvm.tirx.IntImm):
            return None
        # Relax (like ONNX) makes every part ceil(extent / sections) long but the last
        sections, extent = int(split), int(axis_extent)
        part_length = -(-extent // sections)
        boundaries = [min(i * part_length, extent) for i in range(sections + 1)]
    else:
        boundaries = [0] + [int(index) for index in split] + [axis_extent]
    parts = [
        bb.emit(R.strided_slice(x, axes=[axis], begin=[begin], end=[end]), "split_part")
        for begin, end in zip(boundaries[:-1], boundaries[1:])
    ]
    return relax.Tuple(parts)


def _dropout(bb, call):
    """Inference: dropout is the identity; the mask output is all ones."""
    x = call.args[0]
    return relax.Tuple([x, bb.emit(R.ones_like(x), "dropout_mask")])


LOWERING_RULES = {
    "relax.nn.softmax": _softmax,
    "relax.nn.log_softmax": _log_softmax,
    "relax.nn.layer_norm": _layer_norm,
    "relax.nn.rms_norm": _rms_norm,
    "relax.nn.group_norm": _group_norm,
    "relax.nn.instance_norm": _instance_norm,
    "relax.nn.batch_norm": _batch_norm,
    "relax.variance": _variance,
    "relax.std": _std,
    "relax.nn.gelu": _gelu,
    "relax.nn.gelu_tanh": _gelu_tanh,
    "relax.nn.silu": _silu,
    "relax.nn.selu": _selu,
    "relax.nn.softplus": _softplus,
    "relax.split": _split,
    "relax.nn.dropout": _dropout,
    "relax.image.resize2d": lower_resize2d,
}
