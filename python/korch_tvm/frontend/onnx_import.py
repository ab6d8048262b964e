"""ONNX in, Relax out: validation, static input shapes, and folding of constant shape subgraphs.

Raw PyTorch exports compute shapes at run time (Shape -> Gather -> Concat -> Reshape, or pads
built from sizes). TVM 0.27's importer rejects those ("Dynamic pads are not supported",
"Reshape expects the input tensor to have known shape"), although every value involved is known
once the input shapes are. So before `from_onnx` we give every input a static shape and evaluate
the small constant subgraphs with ONNX's own reference evaluator, then rewrite the operators the
importer would make opaque (`onnx_rewrites`, `clamps`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import EnvironmentFault, KorchError
from .clamps import clamps_as_clip
from .onnx_facts import static_types
from .onnx_rewrites import rewrite_for_import

logger = logging.getLogger("korch_tvm.frontend")

# Constant inputs larger than this are weights, not shape arithmetic: folding them would only
# duplicate them in the model, so nodes that read them stay for TVM's own constant folding.
_MAX_FOLD_ELEMENTS = 4096
_NONDETERMINISTIC_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform",
                         "RandomUniformLike", "Multinomial", "Bernoulli"}


def load_onnx(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    """Read and check an ONNX model; every failure is a one-line `KorchError`."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    else:
        path = os.fspath(model)
        if not os.path.exists(path):
            raise KorchError(f"model file '{path}' does not exist")
        if os.path.isdir(path):
            raise KorchError(f"model path '{path}' is a directory, not an ONNX file")
        try:
            proto = onnx.load(path)
        except Exception as err:  # noqa: BLE001 - protobuf raises DecodeError, ValueError, ...
            raise KorchError(
                f"'{path}' is not a readable ONNX model (corrupt or truncated?): {_first_line(err)}"
            ) from None
        if not proto.graph.node and not proto.graph.output:
            raise KorchError(f"'{path}' is not an ONNX model: it holds no graph")
    try:
        onnx.checker.check_model(proto)
    except Exception as err:  # noqa: BLE001
        raise KorchError(f"the ONNX model is malformed: {_first_line(err)}") from None
    check_opset(proto)
    return proto


def check_opset(model: onnx.ModelProto) -> None:
    """Refuse an operator set newer than the installed onnx package defines.

    Shape inference and constant folding (onnx's reference evaluator) cannot run it, and TVM's
    importer would use the newest converter it has for each operator, which may not mean what
    the newer opset means.
    """
    newest = onnx.defs.onnx_opset_version()
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx") and not 1 <= entry.version <= newest:
            raise KorchError(
                f"the model uses ONNX opset {entry.version}; onnx {onnx.__version__} and TVM's "
                f"importer here support opsets 1 to {newest}: export it with opset {newest} "
                "or lower")


def input_shapes(model: onnx.ModelProto,
                 overrides: Mapping[str, Sequence[int]] | None = None) -> dict[str, list[int]]:
    """Static shape of every real graph input (initializers excluded); overrides win.

    A symbolic dimension without an override is an error naming the input and the fix.
    """
    overrides = dict(overrides or {})
    initializer_names = {init.name for init in model.graph.initializer}
    shapes = {}
    for value in model.graph.input:
        if value.name in initializer_names:
            continue
        if value.name in overrides:
            shapes[value.name] = [int(d) for d in overrides.pop(value.name)]
            continue
        dims = value.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims):
            shown = "x".join(d.dim_param or "?" if not d.HasField("dim_value") else str(d.dim_value)
                             for d in dims)
            raise KorchError(
                f"input '{value.name}' has a dynamic shape ({shown}); give it a static one with "
                f"--input-shape {value.name}:1x3x224x224 (your sizes)"
            )
        shapes[value.name] = [int(d.dim_value) for d in dims]
    if overrides:
        raise KorchError(f"--input-shape names unknown inputs: {', '.join(sorted(overrides))}")
    return shapes


def check_activations_fit(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
                          available: int | None = None) -> None:
    """Refuse, before anything is allocated, input shapes whose activations cannot fit in memory.

    The estimate is a floor: the inputs (verification makes them, then each runtime copies
    them) plus the largest tensor the graph declares with a static shape. A shape that is over
    it cannot run here whatever the schedule, so it is an `EnvironmentFault` (exit 1): the same
    model may run on a larger machine. `available` defaults to the memory free now.
    """
    dtypes = input_dtypes(model)
    inputs = sum(_tensor_bytes(shape, dtypes.get(name, "float32"))
                 for name, shape in shapes.items())
    values = {value.name for value in list(model.graph.value_info) + list(model.graph.output)}
    declared = [_tensor_bytes(shape, dtype.name)
                for name, (shape, dtype) in static_types(model.graph).items()
                if name in values and dtype is not None]
    needed = 2 * inputs + max(declared, default=0)
    available = available_memory_bytes() if available is None else available
    if available is not None and needed > available:
        shown = ", ".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in shapes.items())
        raise EnvironmentFault(
            f"the input shapes ({shown}) need at least {_gib(needed)} of memory for their "
            f"activations, and {_gib(available)} is available; give smaller --input-shape "
            "sizes")


def available_memory_bytes() -> int | None:
    """Memory the kernel can hand out now without swapping (MemAvailable), or None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _tensor_bytes(shape: Sequence[int], dtype: str) -> int:
    size = 1
    for dim in shape:
        size *= int(dim)
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # bfloat16 and friends without ml_dtypes: two bytes is a floor
        itemsize = 2
    return size * itemsize


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def input_dtypes(model: onnx.ModelProto) -> dict[str, str]:
    """numpy dtype name of every real graph input."""
    initializer_names = {init.name for init in model.graph.initializer}
    return {
        value.name: onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
        for value in model.graph.input if value.name not in initializer_names
    }


def fold_constant_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
                         max_rounds: int = 8) -> onnx.ModelProto:
    """Return a copy of `model` whose inputs have `shapes` and whose shape arithmetic is folded."""
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    for value in folded.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in shapes[value.name]:
                dims.add().dim_value = int(size)
    for _ in range(max_rounds):
        folded, changed = _fold_once(folded)
        if not changed:
            break
    return folded


def _fold_once(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as err:  # noqa: BLE001 - inference is best effort; importer reports real errors
        logger.debug("ONNX shape inference failed: %s", _first_line(err))
    graph = model.graph
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    static = {name: shape for name, (shape, _) in static_types(graph).items()}
    opsets = {o.domain: o.version for o in model.opset_import}
    kept, changed = [], False
    for node in graph.node:
        values = _evaluate(node, constants, static, opsets)
        if values is None:
            kept.append(node)
            continue
        constants.update(zip(node.output, values))
        changed = True
    if not changed:
        return model, False
    used = {name for node in kept for name in node.input} | {o.name for o in graph.output}
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend(numpy_helper.from_array(np.asarray(value), name)
                             for name, value in constants.items() if name in used)
    # Stale value_info would pin tensors to shapes inferred before folding.
    del graph.value_info[:]
    return model, True


def _evaluate(node, constants, static, opsets):
    """Values of `node`'s outputs if they are known before run time, else None."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC_OPS:
        return None
    if any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for attr in node.attribute):
        return None
    if node.op_type == "Shape" and node.input[0] in static:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        shape = np.array(static[node.input[0]], dtype=np.int64)
        return [shape[attrs.get("start", 0):attrs.get("end", len(shape))]]
    if node.op_type == "Size" and node.input[0] in static:
        return [np.array(int(np.prod(static[node.input[0]])), dtype=np.int64)]
    inputs = [name for name in node.input if name]
    if not all(name in constants for name in inputs):
        return None
    if any(constants[name].size > _MAX_FOLD_ELEMENTS for name in inputs):
        return None
    if node.op_type != "Constant" and not inputs:
        return None  # ConstantOfShape-like generators without inputs are left alone
    try:
        return _run_single_node(node, {name: constants[name] for name in inputs}, opsets)
    except Exception as err:  # noqa: BLE001 - leave anything the evaluator cannot do to TVM
        logger.debug("not folding %s (%s): %s", node.name, node.op_type, _first_line(err))
        return None


def _run_single_node(node, feeds, opsets):
    from onnx.reference import ReferenceEvaluator

    graph = onnx.helper.make_graph(
        [node], "fold",
        [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype),
                                            v.shape) for name, v in feeds.items()],
        [onnx.helper.make_empty_tensor_value_info(name) for name in node.output],
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    outputs = ReferenceEvaluator(model).run(None, feeds)
    return [np.asarray(value) for value in outputs]


def onnx_for_import(model: onnx.ModelProto,
                    shape_overrides: Mapping[str, Sequence[int]] | None = None
                    ) -> tuple[onnx.ModelProto, dict[str, list[int]]]:
    """(The model TVM's importer reads: static input shapes, shape arithmetic folded, the
    operators it would make opaque rewritten (`onnx_rewrites`); those input shapes)."""
    shapes = input_shapes(model, shape_overrides)
    return rewrite_for_import(fold_constant_shapes(model, shapes)), shapes


def after_import(module):
    """What the import of `onnx_for_import`'s model still needs: clamps as one `clip`."""
    return clamps_as_clip(module)


def import_onnx(model: onnx.ModelProto,
                shape_overrides: Mapping[str, Sequence[int]] | None = None):
    """ONNX -> Relax `IRModule` with weights bound as constants and static input shapes."""
    from tvm.relax.frontend.onnx import from_onnx

    prepared, shapes = onnx_for_import(model, shape_overrides)
    try:
        imported = from_onnx(prepared, shape_dict=shapes, dtype_dict=input_dtypes(prepared))
    except Exception as err:  # noqa: BLE001 - the importer raises many kinds
        message = _first_line(err)
        if type(err).__name__ == "OpNotImplemented":
            raise KorchError(f"{message} (TVM's ONNX importer has no converter for them)") from None
        raise KorchError(f"TVM could not import the ONNX model: {message}") from None
    return after_import(imported)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
