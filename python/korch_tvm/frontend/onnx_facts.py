"""What the frontend reads off an ONNX model before importing it: its default-domain opset and
the values whose shapes are static. Shared by the folding, the rewrites, the activation-size
check and the tracing import, so that all of them read the model the same way."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper


def default_opset(model: onnx.ModelProto) -> int:
    """The opset of the default ONNX domain (1 where the model names none, as ONNX reads it)."""
    return next((entry.version for entry in model.opset_import
                 if entry.domain in ("", "ai.onnx")), 1)


def static_types(graph: onnx.GraphProto) -> dict[str, tuple[list[int], np.dtype | None]]:
    """Name -> (static shape, numpy dtype or None where untyped) of every graph input, inferred
    value, output and initializer whose dimensions are all known."""
    types = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            continue
        dims = tensor_type.shape.dim
        if all(dim.HasField("dim_value") for dim in dims):
            dtype = (helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
                     if tensor_type.elem_type else None)
            types[value.name] = ([int(dim.dim_value) for dim in dims], dtype)
    for init in graph.initializer:
        types[init.name] = (list(init.dims), helper.tensor_dtype_to_np_dtype(init.data_type))
    return types
