"""ONNX nodes the importer would make opaque, rewritten as nodes it maps to Relax ops.

TVM 0.27 imports some operators as a `call_tir` of a TOPI function: lowering, kernel fusion
and the substitution rules see an opaque function. Forms with a plain spelling are rewritten
before import; ONNX Runtime verifies the compile against the model as given, not this one.
- Pad of width zero on every side: an Identity (timm's Swin pads each window partition that
  already divides evenly: 15 opaque copies of whole activations in Swin-T).
- Constant Pad of one axis: a Concat with a constant block (MIT EfficientViT's linear
  attention appends a ones column to V so that its value matmul also sums the keys; as a
  Concat, the substitution rules can take that sum apart again).
- Clip with constant bounds (ReLU6 in MobileNetV2 and SSDlite): comparisons and Wheres. The
  importer emits TOPI's maximum and minimum as opaque call_tir, plus an `isnan` of each bound
  that constant folding builds with LLVM in every layout variant (96 builds per fold in
  SSDlite).
Everything else (Pads of several axes, negative widths, edge or reflect modes, bounds or
shapes known only at run time) is left to the importer. Runs after the shape arithmetic is
folded, so pads and bounds are constants by then.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .onnx_facts import default_opset, static_types

_MODES_WHERE_ZERO_IS_IDENTITY = ("constant", "edge", "reflect", "wrap")


class _Graph:
    """What a rewrite reads of the graph (constants, static types, opset), and the constants
    and names it adds."""

    def __init__(self, model: onnx.ModelProto):
        graph = model.graph
        self.constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        # typed values only: a rewrite builds constants of its input's dtype
        self.types = {name: (shape, dtype) for name, (shape, dtype) in
                      static_types(onnx.shape_inference.infer_shapes(model).graph).items()
                      if dtype is not None}
        self.opset = default_opset(model)
        self.added: list[onnx.TensorProto] = []
        self._taken = set(self.constants) | {value.name for value in graph.input} \
            | {name for node in graph.node for name in node.output}

    def constant_input(self, node, index: int):
        """The constant value of `node`'s input `index`; None where absent or not constant."""
        if len(node.input) <= index or not node.input[index]:
            return None
        return self.constants.get(node.input[index])

    def new_name(self, stem: str) -> str:
        name, count = stem, 0
        while name in self._taken:
            count += 1
            name = f"{stem}_{count}"
        self._taken.add(name)
        return name

    def new_constant(self, stem: str, array: np.ndarray) -> str:
        name = self.new_name(stem)
        self.added.append(numpy_helper.from_array(array, name))
        return name


def rewrite_for_import(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with the rewritable Pads and Clips replaced; `model` itself where
    nothing changes."""
    if not any(node.op_type in _REWRITES and node.domain in ("", "ai.onnx")
               for node in model.graph.node):
        return model
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    graph = _Graph(rewritten)
    nodes, changed = [], False
    for node in rewritten.graph.node:
        rewrite = _REWRITES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        replacement = rewrite(node, graph) if rewrite is not None else None
        changed |= replacement is not None
        nodes += [node] if replacement is None else replacement
    if not changed:
        return model
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    rewritten.graph.initializer.extend(graph.added)
    return rewritten


def _pad(node, graph: _Graph):
    """[Identity] or [Concat] for a Pad; None to keep it."""
    spec = _pad_spec(node, graph)
    if spec is None:
        return None
    mode, before, after, value = spec
    if not any(before) and not any(after) and mode in _MODES_WHERE_ZERO_IS_IDENTITY:
        return [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)]
    padded = [axis for axis in range(len(before)) if before[axis] or after[axis]]
    if mode != "constant" or len(padded) != 1 or min(before + after) < 0 \
            or node.input[0] not in graph.types:
        return None
    axis = padded[0]
    shape, dtype = graph.types[node.input[0]]
    inputs = []
    for side, width in (("before", before[axis]), ("data", None), ("after", after[axis])):
        if side == "data":
            inputs.append(node.input[0])
        elif width:
            block = list(shape)
            block[axis] = width
            inputs.append(graph.new_constant(f"{node.output[0]}_pad_{side}",
                                             np.full(block, value, dtype=dtype)))
    return [helper.make_node("Concat", inputs, [node.output[0]], name=node.name, axis=axis)]


def _pad_spec(node, graph: _Graph):
    """(mode, pads before, pads after, constant value) with pads over every axis, or None where
    any of it is only known at run time."""
    attrs = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
    mode = attrs.get("mode", b"constant").decode("utf-8")
    if graph.opset < 11:
        pads, value = attrs.get("pads"), float(attrs.get("value", 0.0))
    else:
        pads, value = graph.constant_input(node, 1), graph.constant_input(node, 2)
        if pads is None or (len(node.input) > 2 and node.input[2] and value is None):
            return None
        value = 0.0 if value is None else value.reshape(-1)[0].item()
    if pads is None:
        return None
    pads = [int(width) for width in np.asarray(pads).reshape(-1)]
    before, after = pads[:len(pads) // 2], pads[len(pads) // 2:]
    if len(node.input) > 3 and node.input[3]:
        axes = graph.constant_input(node, 3)
        if axes is None or node.input[0] not in graph.types:
            return None
        rank = len(graph.types[node.input[0]][0])
        full_before, full_after = [0] * rank, [0] * rank
        for index, axis in enumerate(int(axis) % rank for axis in axes.reshape(-1)):
            full_before[axis], full_after[axis] = before[index], after[index]
        before, after = full_before, full_after
    return mode, before, after, value


def _clip(node, graph: _Graph):
    """Where(x < lo, lo, x), then Where(y > hi, hi, y), for a Clip with constant bounds (only
    the bounds it has; an Identity for none); None to keep it. Exact, and a NaN input stays NaN
    as in ONNX Runtime. (The importer turns Max and Min into a stack and a reduction.)"""
    bounds = _clip_bounds(node, graph) if graph.opset >= 9 else None  # Where is opset 9
    if bounds is None:
        return None
    data, output, nodes = node.input[0], node.output[0], []
    steps = [(test, bound) for test, bound in (("Less", bounds[0]), ("Greater", bounds[1]))
             if bound is not None]
    if not steps:
        return [helper.make_node("Identity", [data], [output], name=node.name)]
    stem = node.name or output
    for position, (test, bound) in enumerate(steps):
        outside = graph.new_name(f"{output}_{test.lower()}")
        result = output if position == len(steps) - 1 else graph.new_name(f"{output}_low")
        nodes += [helper.make_node(test, [data, bound], [outside],
                                   name=graph.new_name(f"{stem}_{test}")),
                  helper.make_node("Where", [outside, bound, data], [result],
                                   name=graph.new_name(f"{stem}_Where"))]
        data = result
    return nodes


def _clip_bounds(node, graph: _Graph):
    """(lower, upper) constant-input names (None: unbounded) of a Clip; None where a bound is
    not a known scalar or the data's type is unknown (needed for attribute bounds)."""
    if graph.opset < 11:
        attrs = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
        if node.input[0] not in graph.types:
            return None
        dtype = graph.types[node.input[0]][1]
        return tuple(None if name not in attrs or math.isnan(attrs[name]) else
                     graph.new_constant(f"{node.output[0]}_{name}",
                                        np.array(attrs[name], dtype=dtype))
                     for name in ("min", "max"))
    names = []
    for index in (1, 2):
        if len(node.input) <= index or not node.input[index]:
            names.append(None)
            continue
        bound = graph.constant_input(node, index)
        if bound is None or bound.size != 1:
            return None
        names.append(None if np.isnan(bound).any() else node.input[index])
    return tuple(names)


_REWRITES = {"Pad": _pad, "Clip": _clip}
