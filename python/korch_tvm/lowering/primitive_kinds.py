"""The six primitive kinds of Korch, and which Relax operators belong to each.

Korch's kernel rules (at most one linear primitive per kernel, how reductions and broadcasts may
be grouped) are stated over these kinds, so every primitive operator the lowering leaves behind
needs one. The table is keyed by Relax op name; anything not listed is opaque: kept whole, never
split, and never an error.

Decisions a reader might question:

* Implicitly broadcasting binary ops (``relax.add`` of a tensor and a bias vector) are
  elementwise: every output element reads one element of each operand, and splitting out an
  explicit ``broadcast_to`` would only add a primitive that every kernel fuses back.
* Pooling (``max_pool*``, ``avg_pool*``, ``adaptive_avg_pool*``) is a *reduce*: each output
  element combines a window of input elements, the compute has reduction axes, and a kernel
  containing it has the same fusion constraints as one containing ``relax.sum``. A layout
  primitive, by contrast, only moves values and never combines them.
* ``relax.image.resize2d``/``resize3d`` are layout: every output element reads a fixed small set
  of input elements chosen by index arithmetic (TVM marks them injective); for nearest
  resizing it is exactly a gather.
* Composite ops that are pure per-element maps (``gelu``, ``silu``, ``softplus``...) are
  elementwise even before lowering; composite ops that mix reductions with per-element work
  (``softmax``, the norms) are opaque until lowered.
* Ops that create a tensor from a scalar (``zeros``, ``full_like``...) and ops that replicate
  (``tile``, ``repeat``) are broadcasts.
"""

ELEMENTWISE = "elementwise"
BROADCAST = "broadcast"
REDUCE = "reduce"
LAYOUT = "layout"
LINEAR = "linear"
OPAQUE = "opaque"

ALL_KINDS = (ELEMENTWISE, BROADCAST, REDUCE, LAYOUT, LINEAR, OPAQUE)

_OPS_BY_KIND = {
    ELEMENTWISE: [
        # unary math
        "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh",
        "erf", "exp", "floor", "log", "negative", "round", "rsqrt", "sigmoid", "sign",
        "sin", "sinh", "sqrt", "square", "tan", "tanh", "trunc", "clip", "astype",
        "isfinite", "isinf", "isnan", "logical_not", "bitwise_not",
        # binary and ternary, numpy-style broadcasting allowed
        "add", "subtract", "multiply", "divide", "floor_divide", "floor_mod", "mod", "power",
        "maximum", "minimum", "atan2", "log_add_exp", "ewise_fma", "where",
        "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
        "logical_and", "logical_or", "logical_xor",
        "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
        "tril", "triu",
        # activations (the composite ones are lowered by fission, but are per-element anyway)
        "nn.relu", "nn.leakyrelu", "nn.prelu", "nn.gelu", "nn.gelu_tanh", "nn.silu",
        "nn.selu", "nn.softplus",
    ],
    BROADCAST: [
        "broadcast_to", "tile", "repeat",
        "full", "full_like", "ones", "ones_like", "zeros", "zeros_like",
    ],
    REDUCE: [
        "sum", "mean", "max", "min", "prod", "argmax", "argmin",
        "collapse_sum_like", "collapse_sum_to",
        "nn.max_pool1d", "nn.max_pool2d", "nn.max_pool3d",
        "nn.avg_pool1d", "nn.avg_pool2d", "nn.avg_pool3d",
        "nn.adaptive_avg_pool1d", "nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool3d",
    ],
    LAYOUT: [
        "permute_dims", "reshape", "flatten", "nn.batch_flatten", "expand_dims", "squeeze",
        "strided_slice", "dynamic_strided_slice", "concat", "stack", "flip",
        "nn.pad", "take", "gather_elements", "gather_nd", "index_tensor",
        "layout_transform", "nn.pixel_shuffle", "image.resize2d", "image.resize3d",
    ],
    LINEAR: [
        # depthwise and grouped convolutions are conv*d with groups > 1: same op, same kind
        "matmul",
        "nn.conv1d", "nn.conv2d", "nn.conv3d",
        "nn.conv1d_transpose", "nn.conv2d_transpose", "nn.conv3d_transpose",
    ],
}

# Reductions over sliding windows: their work grows with the window, not with the bytes moved.
POOLING_OPS = frozenset(f"relax.{name}" for name in _OPS_BY_KIND[REDUCE] if "pool" in name)

PRIMITIVE_KIND_BY_OP = {
    f"relax.{short_name}": kind
    for kind, short_names in _OPS_BY_KIND.items()
    for short_name in short_names
}


def op_kind(op_name: str) -> str:
    """The primitive kind of a Relax op given its name (e.g. "relax.add"); unknown ops: opaque."""
    return PRIMITIVE_KIND_BY_OP.get(op_name, OPAQUE)
