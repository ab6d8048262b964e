"""Which ONNX operator each primitive came from, so `korch-tvm explain` can name them.

TVM's ONNX importer keeps no spans, so the trace is taken during the import itself: the
importer's table from ONNX tensor names to the Relax expressions it built (`_nodes`) says which
Relax value each ONNX node produced. Relax passes keep a binding's `Var` object whenever its
type is unchanged (fission rebinds a composite op's result to the op's original var;
LegalizeOps turns the call into a `call_tir` on the same var), so the primitive graph's bindings
can be matched to ONNX nodes by var identity.

Limits, honestly: only a node's *result* is traced exactly. Primitives that fission or a
converter introduced in the middle of an operator (softmax's max/exp/sum, a Gemm's transpose)
are attributed to the first traced primitive downstream, which is the operator they were split
from in every rule we have, but is a guess in general (`exact=False`). Nodes whose result was
constant-folded or is an alias of their input (Identity, Dropout) own no primitive. Private
importer internals may change between TVM versions: if tracing fails, the plain import is used
and no operator is named.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from .onnx_facts import default_opset

logger = logging.getLogger("korch_tvm.onnx_trace")


@dataclass(frozen=True)
class OnnxOperator:
    index: int          # position in the (shape-folded) ONNX graph
    name: str
    op_type: str
    outputs: tuple[str, ...]

    @property
    def label(self) -> str:
        """`Softmax /attn/Softmax`, or the first output tensor when the node has no name."""
        name = self.name or (self.outputs[0] if self.outputs else f"#{self.index}")
        return f"{self.op_type} {name}"


@dataclass(frozen=True)
class PrimitiveOrigin:
    operator: OnnxOperator | None
    exact: bool         # the primitive is the operator's traced result (not inferred)


class OnnxTrace:
    """ONNX operators and the Relax vars of the imported `main` that hold their results."""

    def __init__(self, operators: Sequence[OnnxOperator], operator_of_var: Mapping):
        self.operators = tuple(operators)
        self.operator_of_var = dict(operator_of_var)

    def origins(self, graph) -> list[PrimitiveOrigin]:
        """One origin per primitive of `graph` (built from a module this trace's import made)."""
        bindings = list(graph.legalized[graph.func_name].body.blocks[0].bindings)
        exact = []
        for node in graph.nodes:
            found = [self.operator_of_var.get(bindings[p].var) for p in node.bindings]
            exact.append(next((op for op in found if op is not None), None))
        origins = []
        for node in graph.nodes:
            if exact[node.index] is not None:
                origins.append(PrimitiveOrigin(exact[node.index], True))
                continue
            inferred = _first_traced(graph, node.index, exact, "consumers") \
                or _first_traced(graph, node.index, exact, "inputs")
            origins.append(PrimitiveOrigin(inferred, False))
        return origins

    def through_rewrite(self, traced_main, rewritten_main) -> "OnnxTrace":
        """This trace for a function rewritten from the traced one by a pass that makes new
        vars but keeps the order of the bindings it rewrites and their operators (Relax's
        ConvertLayout: each binding becomes the same operator in another layout, perhaps after
        inserted transposes).

        The traced bindings are matched, in order, to the next rewritten binding of the same
        operator whose shape has the same dimensions in some order; what the pass inserted
        matches nothing and is inferred like any untraced primitive.
        """
        rewritten = _bindings(rewritten_main)
        added, position = {}, 0
        for binding in _bindings(traced_main):
            operator = self.operator_of_var.get(binding.var)
            if operator is None:
                continue
            want = (_operator_name(binding.value), _dims(binding.var))
            found = next((k for k in range(position, len(rewritten))
                          if (_operator_name(rewritten[k].value), _dims(rewritten[k].var))
                          == want), None)
            if found is not None:
                added[rewritten[found].var] = operator
                position = found + 1
        return OnnxTrace(self.operators, {**self.operator_of_var, **added})


def _dims(var) -> tuple:
    shape = getattr(var.ty, "shape", None)
    return tuple(sorted(str(d) for d in shape)) if shape is not None else ()


def _bindings(func) -> list:
    return [b for block in func.body.blocks for b in block.bindings]


def _operator_name(value) -> str:
    op = getattr(value, "op", None)
    return getattr(op, "name", type(value).__name__)


def _first_traced(graph, start: int, exact, direction: str):
    """The traced operator nearest to `start` along consumers (or producers), breadth first."""
    frontier, seen = list(getattr(graph.nodes[start], direction)), {start}
    while frontier:
        frontier = sorted(set(frontier) - seen)
        for index in frontier:
            if exact[index] is not None:
                return exact[index]
        seen.update(frontier)
        frontier = [n for index in frontier for n in getattr(graph.nodes[index], direction)]
    return None


def import_onnx_traced(model: onnx.ModelProto, shape_overrides=None):
    """(Relax module, OnnxTrace or None): `frontend.import_onnx`, plus the operator trace."""
    from .onnx_import import after_import, import_onnx, input_dtypes, onnx_for_import

    prepared, shapes = onnx_for_import(model, shape_overrides)
    try:
        from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter

        importer = ONNXGraphImporter(shapes, input_dtypes(prepared), keep_params_in_input=False,
                                     sanitize=True)
        module = after_import(importer.from_onnx(prepared.graph, default_opset(prepared)))
        trace = _trace(prepared, importer._nodes, module)  # noqa: SLF001 - see module docstring
    except Exception as err:  # noqa: BLE001 - the plain import names the error, or works
        logger.debug("ONNX operator tracing unavailable: %s", err)
        return import_onnx(model, shape_overrides), None
    return module, trace


def _trace(model: onnx.ModelProto, relax_of_tensor: Mapping, module) -> OnnxTrace:
    from tvm import relax

    operators = [OnnxOperator(i, node.name, node.op_type, tuple(node.output))
                 for i, node in enumerate(model.graph.node)]
    bindings = _bindings(module["main"])
    operator_of_var = {}
    pending = {}  # unbound results (calls the importer let the next node bind) -> operator
    for operator in operators:
        for tensor in operator.outputs:
            expr = relax_of_tensor.get(tensor)
            if isinstance(expr, relax.Var):
                operator_of_var.setdefault(expr, operator)
            elif isinstance(expr, relax.Call):
                pending[expr] = operator
    for binding in bindings:
        value = binding.value
        if isinstance(value, relax.Call):
            owner = pending.get(value)  # Relax objects hash and compare by identity
        elif isinstance(value, relax.Var):  # an alias, e.g. the output `gv = lv3`
            owner = operator_of_var.get(value)
        elif isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            owner = operator_of_var.get(value.tuple_value)
        else:
            owner = None
        if owner is not None:
            operator_of_var.setdefault(binding.var, owner)
    return OnnxTrace(operators, operator_of_var)
