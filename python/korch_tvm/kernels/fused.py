"""Node groups -> fused PrimFuncs: whole partition modules, standalone kernels, structural keys.

A group of primitive nodes becomes a private ``{"Primitive": True}`` Relax function (the form
FuseOps makes) and FuseTIR turns it into one PrimFunc. The same construction serves two uses:

* `build_partition_module(graph, groups)`: all of ``main`` rebuilt as a sequence of kernels
  ``korch_k<g>`` (g = position in ``groups``); groups may overlap (recomputation).
* `candidate_kernel(graph, nodes)`: one candidate alone, as ``IRModule({"main": PrimFunc})``,
  the unit MetaSchedule tunes and the tuning database is keyed by.

A group exports every value read outside it (its candidate outputs), so a kernel inside a
partition module is the same PrimFunc as the standalone candidate kernel. Constants read by a
group are lifted to parameters, so layers that differ only in weights give identical kernels.

Keys: MetaSchedule's database hashes ``_normalize_mod(func)``, which adds ``global_symbol="main"``
(if absent) and ``tirx.noalias``, and counts every attribute. A kernel is therefore kept in one
canonical form (`canonical_prim_func`: only ``s_tir`` and ``tirx.noalias`` attributes, no
``global_symbol``), and `kernel_module` is exactly what MetaSchedule normalises it to. Whoever
puts a tuned kernel into the final model must insert the canonical PrimFunc itself. The one
attribute that says something about the call site, ``layout_free_buffers`` (the parameters fed
by constant weights, which tuning may pre-pack), is kept; it is set by the same rule here and in
the model (`layout.mark_layout_free_weights`).
"""

from __future__ import annotations

from typing import Iterable, Mapping, NamedTuple, Sequence

import tvm
import tvm_ffi
from tvm import relax

from ..graph.primitive_graph import KERNEL_PREFIX, PrimitiveGraph, leaves
from ..support.toposort import ordered_topologically
from .weight_packing import LAYOUT_FREE_ATTR, mark_layout_free_weights

# layout_free_buffers (set from the call sites, see kernels/weight_packing.py) lets MetaSchedule
# pre-pack weights; it is part of the key, so the standalone kernel and the model's kernel must
# both carry it.
_KEPT_ATTRS = ("s_tir", "tirx.noalias", LAYOUT_FREE_ATTR)


# --------------------------------------------------------------------- canonical form and keys
def canonical_prim_func(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """Strip attributes that vary between otherwise identical kernels (names, op_pattern...)."""
    for key in list(func.attrs.keys()) if func.attrs is not None else []:
        if key not in _KEPT_ATTRS or (key == LAYOUT_FREE_ATTR and len(func.attrs[key]) == 0):
            func = func.without_attr(key)
    return func.with_attr("tirx.noalias", True)


def kernel_flops(kernel_mod: tvm.IRModule) -> float:
    """TVM's FLOP estimate of a standalone kernel; 0 where it has none (opaque calls)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(kernel_mod))
    except Exception:  # noqa: BLE001 - TVM raises a generic error for what it cannot count
        return 0.0


def kernel_blocks(kernel_mod: tvm.IRModule) -> list:
    """Every block of the kernel's `main`, nested ones included (the root left out)."""
    schedule = tvm.s_tir.Schedule(kernel_mod)
    blocks, pending = [], [schedule.get_sblock("root", func_name="main")]
    while pending:
        children = schedule.get_child_blocks(pending.pop())
        blocks += [schedule.get(child) for child in children]
        pending += list(children)
    return blocks


def written_params(kernel_mod: tvm.IRModule, blocks: Sequence | None = None) -> list[bool]:
    """For each parameter of `main`, whether some block writes it (an output)."""
    written = [region.source for block in (blocks if blocks is not None
                                           else kernel_blocks(kernel_mod))
               for region in block.writes]
    return [any(param.same_as(source) for source in written)
            for param in kernel_mod["main"].params]


def structurally_equal_groups(items: Mapping) -> dict:
    """{first key: [keys whose values are structurally equal to its value]}, in `items`' order
    (a module or PrimFunc per key): what is measured once, or compiled once."""
    groups: dict = {}
    by_hash: dict[int, list] = {}
    for key, value in items.items():
        bucket = by_hash.setdefault(tvm_ffi.structural_hash(value), [])
        first = next((kept for kept in bucket if tvm_ffi.structural_equal(items[kept], value)),
                     None)
        if first is None:
            bucket.append(key)
            groups[key] = [key]
        else:
            groups[first].append(key)
    return groups


def is_scheduled(func: tvm.tirx.PrimFunc) -> bool:
    """Whether a PrimFunc carries a schedule (from a tuning record or a default rule)."""
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def schedule_unscheduled(mod: tvm.IRModule, schedule_of, marks: Sequence[str] = ()
                         ) -> tvm.IRModule:
    """`mod` with every unscheduled PrimFunc replaced by `schedule_of(func)` (an s_tir Schedule
    of `{"main": func}`, or None to leave the function as it is), marked as scheduled and with
    each attribute of `marks` set: the one loop of the CPU and the GPU default schedules."""
    updated = {}
    for global_var, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and not is_scheduled(func):
            schedule = schedule_of(func)
            if schedule is not None:
                scheduled = schedule.mod["main"]
                for attr in ("tirx.is_scheduled", *marks):
                    scheduled = scheduled.with_attr(attr, True)
                updated[global_var] = scheduled
    for global_var, func in updated.items():
        mod[global_var] = func
    return mod


def kernel_module(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """The standalone module of a kernel, as MetaSchedule normalises it (tune and look up this)."""
    return tvm.IRModule({"main": canonical_prim_func(func).with_attr("global_symbol", "main")})


def structural_key(kernel_mod: tvm.IRModule) -> str:
    """Hex structural hash of a `kernel_module`: equal kernels (any names) share a key."""
    return format(tvm_ffi.structural_hash(kernel_mod) & (2**64 - 1), "016x")


# --------------------------------------------------------------------- group analysis
class _Block:
    """Binding-level facts of the legalized main that every group construction needs."""

    def __init__(self, graph: PrimitiveGraph):
        assert graph.legalized is not None, "a graph built with from_edges has no module"
        self.graph = graph
        self.func = graph.legalized[graph.func_name]
        self.bindings = list(self.func.body.blocks[0].bindings)
        self.position_of = {b.var: p for p, b in enumerate(self.bindings)}
        self.readers = [set() for _ in self.bindings]
        for position, binding in enumerate(self.bindings):
            for leaf in leaves(binding.value):
                if isinstance(leaf, relax.Var) and leaf in self.position_of:
                    self.readers[self.position_of[leaf]].add(position)
        returned = {x for x in leaves(self.func.body.body) if isinstance(x, relax.Var)}
        self.escapes = [not isinstance(b.var, relax.DataflowVar) or b.var in returned
                        for b in self.bindings]
        self.node_positions = {p for n in graph.nodes for p in n.bindings}

    def members(self, nodes: Iterable[int]) -> list[int]:
        return sorted(p for i in set(nodes) for p in self.graph.nodes[i].bindings)

    def external_inputs(self, members: list[int]) -> list:
        """Vars and constants read by the members but bound outside, in first-read order."""
        inside = {self.bindings[p].var for p in members}
        found: dict = {}
        for position in members:
            for leaf in leaves(self.bindings[position].value):
                if leaf not in inside and leaf not in found:
                    found[leaf] = None
        return list(found)

    def exports(self, members: list[int]) -> list[int]:
        member_set = set(members)
        return [p for p in members if self.escapes[p] or not self.readers[p] <= member_set]


def _remap(expr, mapping: dict):
    if isinstance(expr, (relax.Var, tvm.ir.expr.Constant)):
        return mapping.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_remap(x, mapping) for x in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_remap(expr.tuple_value, mapping), expr.index)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [_remap(a, mapping) for a in expr.args], expr.attrs,
                          expr.ty_args)
    return expr


def _group_function(block: _Block, members, inputs, exports, group: int) -> relax.Function:
    """The private Primitive function computing `members`; returns the exported values."""
    sub = relax.BlockBuilder()
    params = [relax.Var(x.name if isinstance(x, relax.Var) else f"c{k}", x.ty)
              for k, x in enumerate(inputs)]
    attrs = {"Primitive": True, "korch_group": group}  # korch_group also defeats add_func dedup
    with sub.function("f", params, attrs=attrs, private=True):
        with sub.dataflow():
            mapping = dict(zip(inputs, params))
            for position in members:
                binding = block.bindings[position]
                mapping[binding.var] = sub.emit(_remap(binding.value, mapping), binding.var.name)
            outs = [mapping[block.bindings[p].var] for p in exports]
            out = sub.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        sub.emit_func_output(out)
    (function,) = [f for _, f in sub.get().functions_items()]
    return function


# --------------------------------------------------------------------- partition modules
def build_partition_module(graph: PrimitiveGraph, groups: Sequence[Iterable[int]]) -> tvm.IRModule:
    """Rebuild main as the given (possibly overlapping) node groups, each one kernel korch_k<g>.

    Every node must be in some group; opaque nodes must be alone; groups must be convex and
    their dependencies acyclic. A value read by a group that lacks its node comes from the first
    group exporting it (the first group containing it exports it if none does).
    """
    block = _Block(graph)
    groups = [sorted(set(g)) for g in groups]
    _check_groups(graph, groups)
    members = [block.members(g) for g in groups]
    inputs = [block.external_inputs(m) for m in members]
    exports = [block.exports(m) for m in members]
    source: dict = {}  # binding position -> group whose result supplies it to others
    for g, exported in enumerate(exports):
        for position in exported:
            source.setdefault(position, g)
    for group_inputs in inputs:
        for leaf in group_inputs:
            position = block.position_of.get(leaf)
            if position in block.node_positions and position not in source:
                owner = next(h for h, m in enumerate(members) if position in m)
                exports[owner] = sorted(exports[owner] + [position])
                source[position] = owner
    for position in range(len(block.bindings)):  # escaping values need a source too
        if block.escapes[position] and position in block.node_positions:
            assert position in source, "an escaping value has no exporting group"
    order = _unit_order(block, members, inputs, source)

    module_builder = relax.BlockBuilder(graph.legalized)
    callees = {g: module_builder.add_func(
        _group_function(block, members[g], inputs[g], exports[g], g), f"{KERNEL_PREFIX}{g}")
        for g in range(len(groups)) if graph.nodes[groups[g][0]].fusible}
    main_builder = relax.BlockBuilder()
    func = block.func
    attrs = dict(func.attrs.items()) if func.attrs is not None else None
    with main_builder.function(graph.func_name, list(func.params), attrs=attrs):
        with main_builder.dataflow():
            mapping: dict = {}
            for kind, unit in order:
                _emit_unit(main_builder, block, kind, unit, members, inputs, exports, source,
                           callees, mapping)
            for position, binding in enumerate(block.bindings):
                if position in block.node_positions and block.escapes[position]:
                    mapping[binding.var] = main_builder.emit_output(mapping[binding.var])
        main_builder.emit_func_output(_remap(func.body.body, mapping))
    module_builder.update_func(graph.legalized.get_global_var(graph.func_name),
                               main_builder.get()[graph.func_name])
    fused = relax.transform.FuseTIR()(module_builder.get())
    fused = mark_layout_free_weights(fused)  # as candidate_kernel does: the same keys
    return relax.transform.DeadCodeElimination([graph.func_name])(fused)


def _check_groups(graph: PrimitiveGraph, groups: list[list[int]]) -> None:
    covered = {i for g in groups for i in g}
    if covered != set(range(len(graph))):
        missing = sorted(set(range(len(graph))) - covered)[:5]
        raise ValueError(f"groups must cover every node; missing {missing}")
    for g, nodes in enumerate(groups):
        if len(nodes) > 1 and any(not graph.nodes[i].fusible for i in nodes):
            raise ValueError(f"group {g} puts an opaque (non-call_tir) node with others")
        if not graph.is_convex(graph.mask(nodes)):
            raise ValueError(f"group {g} is not convex: {nodes}")


def _unit_order(block: _Block, members, inputs, source) -> list[tuple[str, int]]:
    """Topological order of groups and glue bindings, earliest binding first."""
    glue = [p for p in range(len(block.bindings)) if p not in block.node_positions]
    units = [("group", g) for g in range(len(members))] + [("glue", p) for p in glue]
    reads = [inputs[g] for g in range(len(members))] + [
        leaves(block.bindings[p].value) for p in glue]
    unit_of_glue = {p: len(members) + k for k, p in enumerate(glue)}
    deps = []
    for u, read in enumerate(reads):
        found = set()
        for leaf in read:
            position = block.position_of.get(leaf)
            if position is None:
                continue
            found.add(unit_of_glue[position] if position in unit_of_glue else source[position])
        deps.append(found - {u})
    start = [members[g][0] for g in range(len(members))] + glue
    order = ordered_topologically(deps, start)
    if order is None:
        raise ValueError("the groups depend on each other in a cycle; no schedule exists")
    return [units[u] for u in order]


def _emit_unit(builder, block, kind, unit, members, inputs, exports, source, callees, mapping):
    if kind == "glue":
        binding = block.bindings[unit]
        value = _remap(binding.value, mapping)
        emit = builder.emit if isinstance(binding.var, relax.DataflowVar) else builder.emit_output
        mapping[binding.var] = emit(value, binding.var.name)
        return
    if unit not in callees:  # an opaque node: its bindings stay as they are
        for position in members[unit]:
            binding = block.bindings[position]
            mapping[binding.var] = builder.emit(_remap(binding.value, mapping), binding.var.name)
        return
    call = relax.Call(callees[unit], [_remap(x, mapping) for x in inputs[unit]])
    supplied = [p for p in exports[unit] if source[p] == unit]
    if len(exports[unit]) == 1:
        result = builder.emit(call, block.bindings[exports[unit][0]].var.name)
        if supplied:
            mapping[block.bindings[supplied[0]].var] = result
        return
    result = builder.emit(call, f"{KERNEL_PREFIX}{unit}_out")
    for k, position in enumerate(exports[unit]):
        if position in supplied:
            var = block.bindings[position].var
            mapping[var] = builder.emit(relax.TupleGetItem(result, k), var.name)


# --------------------------------------------------------------------- standalone kernels
def candidate_io(graph: PrimitiveGraph, nodes: Iterable[int]) -> tuple[list, list]:
    """The kernel's parameters in order: the Relax values it reads (Vars and Constants of the
    legalized main), then the Vars it writes (outputs follow inputs in the PrimFunc)."""
    block = _Block(graph)
    members = block.members(nodes)
    return (block.external_inputs(members),
            [block.bindings[p].var for p in block.exports(members)])


def candidate_kernel(graph: PrimitiveGraph, nodes: Iterable[int],
                     block: _Block | None = None) -> tvm.IRModule:
    """One candidate as a standalone `kernel_module`: what the partition module would run."""
    block = block if block is not None else _Block(graph)
    nodes = sorted(set(nodes))
    assert all(graph.nodes[i].fusible for i in nodes), "opaque nodes have no fused kernel"
    members = block.members(nodes)
    inputs = block.external_inputs(members)
    exports = block.exports(members)
    callees = {block.bindings[p].value.args[0] for p in members
               if isinstance(block.bindings[p].value, relax.Call)}
    builder = relax.BlockBuilder(tvm.IRModule({gv: graph.legalized[gv] for gv in callees}))
    kernel = builder.add_func(_group_function(block, members, inputs, exports, 0),
                              f"{KERNEL_PREFIX}0")
    params = [relax.Var(f"p{k}", x.ty) for k, x in enumerate(inputs) if isinstance(x, relax.Var)]
    param_of = dict(zip([x for x in inputs if isinstance(x, relax.Var)], params))
    with builder.function("main", params):
        with builder.dataflow():
            out = builder.emit_output(relax.Call(kernel, [param_of.get(x, x) for x in inputs]))
        builder.emit_func_output(out)
    fused = mark_layout_free_weights(relax.transform.FuseTIR()(builder.get()))
    return kernel_module(fused[f"{KERNEL_PREFIX}0"])


class DistinctKernels(NamedTuple):
    """Kernel modules by structural key, and the key of each candidate, in candidate order.

    A candidate holding a non-call_tir (opaque) node has no PrimFunc and its key is None.
    """

    modules: dict[str, tvm.IRModule]
    keys: list[str | None]


def distinct_kernels(graph: PrimitiveGraph, candidates: Sequence) -> DistinctKernels:
    """Build each structurally distinct candidate once (candidates: `Candidate`s or node sets).

    Candidates are first grouped by a cheap wiring signature (member PrimFunc hashes, how they
    connect, input types), so FuseTIR runs once per signature, not once per candidate.
    """
    block = _Block(graph)
    callee_hash: dict = {}
    by_signature: dict = {}
    modules: dict = {}
    keys: list = []
    for candidate in candidates:
        nodes = frozenset(getattr(candidate, "nodes", candidate))
        if any(not graph.nodes[i].fusible for i in nodes):
            keys.append(None)
            continue
        signature = _wiring_signature(block, nodes, callee_hash)
        if signature not in by_signature:
            module = candidate_kernel(graph, nodes, block)
            key = structural_key(module)
            modules.setdefault(key, module)
            by_signature[signature] = key
        keys.append(by_signature[signature])
    return DistinctKernels(modules, keys)


def _wiring_signature(block: _Block, nodes, callee_hash: dict) -> tuple:
    """Equal signatures give structurally equal fused kernels (the construction is determined)."""
    members = block.members(nodes)
    local: dict = {}
    external: dict = {}
    entries = []
    for position in members:
        binding = block.bindings[position]
        value = binding.value
        if isinstance(value, relax.Call):
            if position not in callee_hash:
                callee = block.graph.legalized[value.args[0]]
                callee_hash[position] = tvm_ffi.structural_hash(canonical_prim_func(callee))
            extra = str(value.args[2:]) if len(value.args) > 2 else ""  # symbolic tir_vars
            head = ("call", callee_hash[position], extra)
        else:
            head = ("get", value.index)
        refs = []
        for leaf in leaves(value):
            if leaf in local:
                refs.append(local[leaf])
            else:
                if leaf not in external:  # a constant input makes a layout-free parameter
                    external[leaf] = (len(external), str(leaf.ty),
                                      isinstance(leaf, tvm.ir.expr.Constant))
                refs.append(("in", external[leaf]))
        local[binding.var] = len(local)
        entries.append((head, tuple(refs)))
    exports = tuple(members.index(p) for p in block.exports(members))
    return tuple(entries), exports
