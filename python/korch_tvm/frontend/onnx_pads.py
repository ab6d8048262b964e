"""Pads the importer would make opaque, rewritten as ONNX operators it maps to Relax ops.

TVM 0.27 imports every ONNX Pad as a `call_tir` of TOPI's pad: lowering, kernel fusion and the
substitution rules see an opaque function. Two forms have a plain spelling:
- a Pad of width zero on every side is an Identity (timm's Swin pads each window partition
  that already divides evenly: 15 opaque copies of whole activations in Swin-T);
- a constant Pad of one axis is a Concat with a constant block (MIT EfficientViT's linear
  attention appends a ones column to V so that its value matmul also sums the keys; as a
  Concat, the substitution rules can take that sum apart again).
Every other Pad (several axes, negative widths, edge or reflect modes, unknown shapes) is left
to the importer. Runs after the shape arithmetic is folded, so pads are constants by then.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

_MODES_WHERE_ZERO_IS_IDENTITY = ("constant", "edge", "reflect", "wrap")


def rewrite_pads(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose identity and one-axis constant Pads are Identity / Concat nodes;
    `model` itself where no Pad changes."""
    if not any(node.op_type == "Pad" and node.domain in ("", "ai.onnx")
               for node in model.graph.node):
        return model
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    graph = rewritten.graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    types = _static_types(onnx.shape_inference.infer_shapes(rewritten).graph)
    opset = next((entry.version for entry in rewritten.opset_import
                  if entry.domain in ("", "ai.onnx")), 1)
    taken = set(constants) | {name for node in graph.node for name in node.output} \
        | {value.name for value in graph.input}
    nodes, blocks, changed = [], [], False
    for node in graph.node:
        replacement = _replacement(node, constants, types, opset, blocks, taken)
        changed |= replacement is not None
        nodes.append(node if replacement is None else replacement)
    if not changed:
        return model
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(blocks)
    return rewritten


def _replacement(node, constants, types, opset, blocks, taken):
    """The Identity or Concat node standing for a Pad (appending any constant block it reads
    to `blocks`, its name to `taken`), or None to keep the node."""
    if node.op_type != "Pad" or node.domain not in ("", "ai.onnx"):
        return None
    spec = _pad_spec(node, constants, types, opset)
    if spec is None:
        return None
    mode, before, after, value = spec
    if not any(before) and not any(after) and mode in _MODES_WHERE_ZERO_IS_IDENTITY:
        return helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)
    padded = [axis for axis in range(len(before)) if before[axis] or after[axis]]
    if mode != "constant" or len(padded) != 1 or min(before + after) < 0 \
            or node.input[0] not in types:
        return None
    axis = padded[0]
    shape, dtype = types[node.input[0]]
    inputs = []
    for side, width in (("before", before[axis]), ("data", None), ("after", after[axis])):
        if side == "data":
            inputs.append(node.input[0])
        elif width:
            block_shape = list(shape)
            block_shape[axis] = width
            name = _unused_name(f"{node.output[0]}_pad_{side}", taken)
            blocks.append(numpy_helper.from_array(
                np.full(block_shape, value, dtype=dtype), name))
            inputs.append(name)
    return helper.make_node("Concat", inputs, [node.output[0]], name=node.name, axis=axis)


def _pad_spec(node, constants, types, opset):
    """(mode, pads before, pads after, constant value) with pads over every axis, or None where
    any of it is only known at run time."""
    attrs = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
    mode = attrs.get("mode", b"constant").decode("utf-8")
    if opset < 11:
        pads, value = attrs.get("pads"), float(attrs.get("value", 0.0))
    else:
        pads = _constant(node, 1, constants)
        value = _constant(node, 2, constants)
        if pads is None or (len(node.input) > 2 and node.input[2] and value is None):
            return None
        value = 0.0 if value is None else value.reshape(-1)[0].item()
    if pads is None:
        return None
    pads = [int(width) for width in np.asarray(pads).reshape(-1)]
    half = len(pads) // 2
    before, after = pads[:half], pads[half:]
    if len(node.input) > 3 and node.input[3]:
        axes = _constant(node, 3, constants)
        if axes is None or node.input[0] not in types:
            return None
        rank = len(types[node.input[0]][0])
        full_before, full_after = [0] * rank, [0] * rank
        for index, axis in enumerate(int(axis) % rank for axis in axes.reshape(-1)):
            full_before[axis], full_after[axis] = before[index], after[index]
        before, after = full_before, full_after
    return mode, before, after, value


def _constant(node, index, constants):
    if len(node.input) <= index or not node.input[index]:
        return None
    return constants.get(node.input[index])


def _static_types(graph) -> dict[str, tuple[list[int], np.dtype]]:
    """Name -> (static shape, numpy dtype) of every value whose shape inference fixed both."""
    types = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor_type = value.type.tensor_type
        dims = tensor_type.shape.dim if tensor_type.HasField("shape") else None
        if not tensor_type.elem_type or dims is None \
                or not all(dim.HasField("dim_value") for dim in dims):
            continue
        types[value.name] = ([int(dim.dim_value) for dim in dims],
                             helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    for init in graph.initializer:
        types[init.name] = (list(init.dims), helper.tensor_dtype_to_np_dtype(init.data_type))
    return types


def _unused_name(stem: str, taken: set) -> str:
    name, count = stem, 0
    while name in taken:
        count += 1
        name = f"{stem}_{count}"
    taken.add(name)
    return name
