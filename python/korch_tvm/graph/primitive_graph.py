"""The primitive graph: the DAG of primitive operators that candidate kernels are drawn from.

`PrimitiveGraph.from_module` reads a Relax module already lowered to primitive ops (one dataflow
block in ``main``). It records each binding's Relax op name and kind *before* legalization, then
runs LegalizeOps + AnnotateTIROpPattern and gives every ``call_tir`` binding its own PrimFunc, so
that a node is one ``call_tir`` binding of the kept ``legalized`` module and any set of nodes can
be turned into a fused kernel (`kernels.fused.build_partition_module`).

Bindings that are not ``call_tir`` after legalization are handled so:

* ``x = t[i]`` of a node's tuple result (e.g. ``split``) is folded into that node: the node owns
  both bindings, and consumers of ``x`` get an edge from the node.
* any other call (an op LegalizeOps leaves alone, ``call_dps_packed``, a call of a Relax
  function) is an *opaque node*: ``fusible=False``, kind ``"opaque"``, always a kernel of its own,
  and kept as a plain binding of ``main`` when a partition is built.
* the rest (tuples, aliases, constants bound to vars) is *glue*: not a node; it is re-emitted in
  ``main`` and edges run through it to the nodes it reads.

Edges are activations only: a weight (a parameter after ``num_input``) or a constant is an
attribute of the node that reads it. Nodes are numbered in binding order, a topological order.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import tvm
from tvm import relax

from ..errors import KorchError
from ..lowering.fast_math import legalize_ops
from ..lowering.primitive_kinds import op_kind
from .callees import CALL_TIR, NODE_ATTR, uniquify_callees
from .relax_exprs import leaves
from .alternatives import (AlternativeSite, alternative_nodes, sites_as_nodes,
                           without_alternatives)

KERNEL_PREFIX = "korch_k"

# Fallback kinds for call_tir bindings that no Relax op of the input accounts for (an op whose
# legalization emitted several call_tir bindings, or a module that already held call_tir).
_KIND_BY_OP_PATTERN = {0: "elementwise", 1: "broadcast", 2: "layout", 3: "reduce", 4: "linear"}


@dataclass(frozen=True)
class PrimitiveNode:
    """One primitive: a call_tir binding (with its folded tuple get-items) or an opaque binding."""

    index: int
    name: str
    op_name: str
    kind: str
    inputs: tuple[int, ...]  # producer node ids, activations only
    graph_inputs: tuple[str, ...]  # activation parameters of main read directly
    weights: tuple[str, ...] = ()  # weight parameters (after num_input) read
    num_constants: int = 0
    out_shapes: tuple[tuple, ...] = ()  # one shape per output tensor (ints, or str if symbolic)
    out_dtypes: tuple[str, ...] = ()
    consumers: tuple[int, ...] = ()
    bindings: tuple[int, ...] = ()  # binding positions in the legalized main's block
    fusible: bool = True

    @property
    def shape(self) -> tuple | None:
        return self.out_shapes[0] if len(self.out_shapes) == 1 else None

    @property
    def dtype(self) -> str | None:
        return self.out_dtypes[0] if len(self.out_dtypes) == 1 else None

    @property
    def out_bytes(self) -> int | None:
        """Bytes of all its output tensors (None without outputs or with a symbolic extent)."""
        if not self.out_shapes:
            return None
        total = 0
        for shape, dtype in zip(self.out_shapes, self.out_dtypes):
            if not all(isinstance(extent, int) for extent in shape):
                return None
            total += tensor_bytes(shape, dtype)
        return total


def tensor_bytes(shape, dtype: str) -> int:
    """Bytes of a tensor of static `shape` (ints) and `dtype` (a sub-byte element counts 1)."""
    element = tvm.DataType(dtype)
    return math.prod(shape) * max(1, element.bits * element.lanes // 8)


@dataclass(frozen=True)
class PrimitiveGraph:
    """Primitives, their edges and reachability bitsets; `legalized` is None for pure graphs."""

    nodes: tuple[PrimitiveNode, ...]
    inputs: tuple[str, ...]
    outputs: tuple[int, ...]
    ancestors: tuple[int, ...] = field(repr=False, default=())  # bit j of [i]: j reaches i
    descendants: tuple[int, ...] = field(repr=False, default=())
    legalized: tvm.IRModule | None = field(repr=False, default=None, compare=False)
    func_name: str = "main"
    # alternatives offered beside the originals (graph/alternatives.py); () without any
    alternatives: tuple[AlternativeSite, ...] = ()

    # ----------------------------------------------------------------- construction
    @staticmethod
    def from_edges(num_nodes: int, edges: Iterable[tuple[int, int]],
                   kinds: Sequence[str] | None = None,
                   outputs: Iterable[int] | None = None) -> "PrimitiveGraph":
        """A pure graph (no module) for tests and measurements.

        `edges` are (producer, consumer) ids and must go low -> high id; `kinds` gives each
        node's kind (default all "elementwise"); `outputs` defaults to the sinks.
        """
        producers = [set() for _ in range(num_nodes)]
        for src, dst in edges:
            assert 0 <= src < dst < num_nodes, f"edge {src}->{dst} is not in topological order"
            producers[dst].add(src)
        kinds = list(kinds) if kinds is not None else ["elementwise"] * num_nodes
        nodes = [PrimitiveNode(i, f"n{i}", f"relax.{kinds[i]}", kinds[i],
                               tuple(sorted(producers[i])), (), fusible=kinds[i] != "opaque")
                 for i in range(num_nodes)]
        return _finish(nodes, (), outputs, None, "main")

    @staticmethod
    def from_module(mod: tvm.IRModule, func_name: str = "main", *, fast_math: bool = True,
                    offered_sites: Sequence = ()) -> "PrimitiveGraph":
        """Build the graph of `func_name`, which must be one dataflow block of primitive ops;
        `fast_math` picks the legalization of exp/sigmoid/tanh/erf (see lowering/fast_math.py).
        `offered_sites` (substitutions/offer.py) name the bindings of alternatives inlined into
        `mod`: nothing reads them, yet they stay nodes, recorded as `alternatives`."""
        if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
            raise KorchError(f"the module has no function {func_name!r}; pass func_name=")
        func = mod[func_name]
        blocks = list(func.body.blocks) if isinstance(func.body, relax.SeqExpr) else []
        if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
            raise KorchError(f"{func_name} must be a single dataflow block (it has {len(blocks)} "
                             "blocks); run relax.transform.ConvertToDataflow() first")
        relax_ops = {b.var: b.value.op.name for b in blocks[0].bindings
                     if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}
        legal = tvm.transform.Sequential([legalize_ops(fast_math),
                                          relax.transform.AnnotateTIROpPattern()])(mod)
        legal = uniquify_callees(legal, func_name, keep_unread=bool(offered_sites))
        graph = _read_legalized(legal, func_name, relax_ops)
        if not offered_sites:
            return graph
        return dataclasses.replace(graph, alternatives=sites_as_nodes(graph, offered_sites))

    # ----------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.nodes)

    def mask(self, node_ids: Iterable[int]) -> int:
        """The bitset with bit i set for each node id i in `node_ids`."""
        bits = 0
        for i in node_ids:
            bits |= 1 << i
        return bits

    def is_convex(self, node_mask: int) -> bool:
        """No node outside the set `node_mask` (a bitset) lies on a path between two of its."""
        reach_down = reach_up = 0
        bits = node_mask
        while bits:
            low = bits & -bits
            i = low.bit_length() - 1
            reach_down |= self.descendants[i]
            reach_up |= self.ancestors[i]
            bits ^= low
        return reach_down & reach_up & ~node_mask == 0

    def convex_hull(self, node_mask: int) -> int:
        """The smallest convex superset: the set plus every node on a path between its nodes."""
        reach_down = reach_up = 0
        for i in _bits(node_mask):
            reach_down |= self.descendants[i]
            reach_up |= self.ancestors[i]
        return node_mask | (reach_down & reach_up)

    @functools.cached_property
    def neighbours(self) -> tuple[int, ...]:
        """Undirected adjacency bitsets (producers and consumers)."""
        return tuple(self.mask(n.inputs) | self.mask(n.consumers) for n in self.nodes)

    @functools.cached_property
    def output_mask(self) -> int:
        return self.mask(self.outputs)

    def stock_fusion_groups(self) -> tuple[frozenset[int], ...]:
        """The groups TVM's FuseOps forms on the legalized module, as node-id sets."""
        return self._stock_groups

    @functools.cached_property
    def _stock_groups(self) -> tuple[frozenset[int], ...]:
        if self.legalized is None:
            offered = alternative_nodes(self.alternatives)
            return tuple(frozenset([n.index]) for n in self.nodes if n.index not in offered)
        fused = relax.transform.FuseOps()(without_alternatives(self))
        node_at = {p: n.index for n in self.nodes for p in n.bindings}
        groups, seen = [], set()
        for binding in fused[self.func_name].body.blocks[0].bindings:
            value = binding.value
            if not isinstance(value, relax.Call):
                continue
            if value.op.same_as(CALL_TIR):
                group = _node_ids_of_calls(fused, [value], node_at)
            elif isinstance(value.op, relax.GlobalVar) \
                    and isinstance(fused[value.op], relax.Function):
                callee = fused[value.op]
                if callee.attrs is None or "Primitive" not in callee.attrs:
                    continue
                calls = [b.value for blk in callee.body.blocks for b in blk.bindings
                         if isinstance(b.value, relax.Call) and b.value.op.same_as(CALL_TIR)]
                group = _node_ids_of_calls(fused, calls, node_at)
            else:
                continue
            if group:
                groups.append(frozenset(group))
                seen |= group
        offered = alternative_nodes(self.alternatives)
        groups += [frozenset([n.index]) for n in self.nodes
                   if n.index not in seen and n.index not in offered]
        return tuple(sorted(groups, key=min))


# --------------------------------------------------------------------- helpers
def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _node_ids_of_calls(mod: tvm.IRModule, calls, node_at: dict) -> set[int]:
    return {node_at[int(mod[call.args[0]].attrs[NODE_ATTR])] for call in calls}


def _tensor_types(ty) -> list:
    if isinstance(ty, relax.TensorType):
        return [ty]
    if isinstance(ty, relax.TupleType):
        return [t for f in ty.fields for t in _tensor_types(f)]
    return []


def _shape_of(ty) -> tuple:
    if ty.shape is None or not hasattr(ty.shape, "values"):
        return ()
    out = []
    for dim in ty.shape.values:
        try:
            out.append(int(dim))
        except (TypeError, ValueError):
            out.append(str(dim))
    return tuple(out)


class _Wiring:
    """Which node (or, through glue, which nodes and graph inputs) each var of main stands for."""

    def __init__(self, activation_params: dict):
        self.activation_params = activation_params
        self.node_of_var: dict = {}  # var -> node id, for node-bound vars (incl. folded get-items)
        self.glue_sources: dict = {}  # glue var -> (frozenset node ids, frozenset graph-input names)

    def trace(self, var, nodes: set, names: set) -> None:
        """Add the nodes / graph inputs that `var` stands for (through glue) to the two sets."""
        if var in self.node_of_var:
            nodes.add(self.node_of_var[var])
        elif var in self.glue_sources:
            nodes |= self.glue_sources[var][0]
            names |= self.glue_sources[var][1]
        elif var in self.activation_params:
            names.add(self.activation_params[var])


def _read_legalized(legal: tvm.IRModule, func_name: str, relax_ops: dict) -> PrimitiveGraph:
    func = legal[func_name]
    bindings = list(func.body.blocks[0].bindings)
    num_input = int(func.attrs["num_input"]) if func.attrs and "num_input" in func.attrs \
        else len(func.params)
    wiring = _Wiring({p: p.name for p in func.params[:num_input]})
    weight_params = {p: p.name for p in func.params[num_input:]}
    node_bindings = _node_bindings(bindings, wiring)
    nodes = [_primitive_node(index, positions, binding, legal, relax_ops, weight_params, wiring)
             for index, (positions, binding) in enumerate(node_bindings)]
    escaping_nodes: set = set()
    for binding in bindings:
        if not isinstance(binding.var, relax.DataflowVar):
            wiring.trace(binding.var, escaping_nodes, set())
    for leaf in leaves(func.body.body):
        wiring.trace(leaf, escaping_nodes, set())
    return _finish(nodes, tuple(wiring.activation_params.values()), escaping_nodes, legal,
                   func_name)


def _node_bindings(bindings: list, wiring: _Wiring) -> list:
    """Per node, [its binding positions, its first binding]; records every var in `wiring`."""
    node_bindings = []
    for position, binding in enumerate(bindings):
        if isinstance(binding, relax.MatchCast):
            raise KorchError(f"match_cast binding {binding.var.name} is not supported; "
                             "give the model static shapes")
        value = binding.value
        if isinstance(value, relax.Call):
            wiring.node_of_var[binding.var] = len(node_bindings)
            node_bindings.append([[position], binding])
        elif isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var) \
                and value.tuple_value in wiring.node_of_var:
            node = wiring.node_of_var[value.tuple_value]
            wiring.node_of_var[binding.var] = node
            node_bindings[node][0].append(position)
        else:
            nodes, names = set(), set()
            for leaf in leaves(value):
                wiring.trace(leaf, nodes, names)
            wiring.glue_sources[binding.var] = (frozenset(nodes), frozenset(names))
    return node_bindings


def _primitive_node(index: int, positions: list, binding, legal: tvm.IRModule, relax_ops: dict,
                    weight_params: dict, wiring: _Wiring) -> PrimitiveNode:
    """The node bound first by `binding`: what it reads (activations, weights, constants)."""
    value = binding.value
    producers, names, weights, num_constants = set(), set(), set(), 0
    for leaf in leaves(value):
        if isinstance(leaf, tvm.ir.expr.Constant):
            num_constants += 1
        elif leaf in weight_params:
            weights.add(weight_params[leaf])
        else:
            wiring.trace(leaf, producers, names)
    op_name, kind = _op_name_and_kind(binding, legal, relax_ops)
    types = _tensor_types(binding.var.ty)
    return PrimitiveNode(
        index, binding.var.name, op_name, kind, tuple(sorted(producers)),
        tuple(sorted(names)), tuple(sorted(weights)), num_constants,
        tuple(_shape_of(t) for t in types), tuple(str(t.dtype) for t in types),
        bindings=tuple(positions), fusible=value.op.same_as(CALL_TIR))


def _op_name_and_kind(binding, legal: tvm.IRModule, relax_ops: dict) -> tuple[str, str]:
    """The Relax op the binding came from and its kind; opaque calls and bare call_tir fall back."""
    value = binding.value
    if not value.op.same_as(CALL_TIR):
        return (value.op.name if isinstance(value.op, tvm.ir.Op) else str(value.op)), "opaque"
    if binding.var in relax_ops and relax_ops[binding.var] != "relax.call_tir":
        op_name = relax_ops[binding.var]
        return op_name, op_kind(op_name)
    callee = legal[value.args[0]]
    op_name = "tir." + value.args[0].name_hint.split("_", 1)[-1]
    return op_name, _KIND_BY_OP_PATTERN.get(int(callee.attrs.get("op_pattern", 8)), "opaque")


def _finish(nodes: list, inputs: tuple, outputs, legal, func_name: str) -> PrimitiveGraph:
    """Add consumers, outputs (default: sinks) and the reachability bitsets."""
    consumers = [[] for _ in nodes]
    for node in nodes:
        for producer in node.inputs:
            consumers[producer].append(node.index)
    nodes = [PrimitiveNode(**{**node.__dict__, "consumers": tuple(consumers[node.index])})
             for node in nodes]
    if outputs is None:
        outputs = [n.index for n in nodes if not n.consumers]
    ancestors = [0] * len(nodes)
    for node in nodes:  # binding order is topological
        for producer in node.inputs:
            ancestors[node.index] |= ancestors[producer] | (1 << producer)
    descendants = [0] * len(nodes)
    for node in reversed(nodes):
        for consumer in node.consumers:
            descendants[node.index] |= descendants[consumer] | (1 << consumer)
    return PrimitiveGraph(tuple(nodes), inputs, tuple(sorted(set(outputs))), tuple(ancestors),
                          tuple(descendants), legal, func_name)
