"""Alternatives offered beside the originals: their bodies inlined into `main`, equivalences kept.

Each `Alternative` (alternative.py) is inlined at the end of main's dataflow block with fresh
vars, its parameters bound to the vars it reads. Nothing reads the new values, so the original
program is unchanged; the graph stage makes the new bindings primitives of their own and records
which of them equals which replaced var (`OfferedSite`), and the orchestration program may then
produce a replaced tensor either way. Appending keeps the original bindings' positions, so with
no alternatives every later stage sees exactly today's module.

Weight-only work inside an alternative (e.g. concatenating the Q, K and V weights) is folded
here, once at compile time, wherever those weights are constants of the module; a weight that is
a parameter stays a primitive of the alternative and is costed as one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import tvm
import tvm_ffi
from tvm import relax

from ..graph.primitive_graph import PrimitiveGraph
from ..graph.relax_exprs import remap, vars_read
from .alternative import Alternative
from .rules import ALL_RULES, find_alternatives

logger = logging.getLogger("korch_tvm.substitutions")


@dataclass(frozen=True)
class OfferedSite:
    """One alternative as inlined: `offers[k]` is the new var equal to `replaces[k]`."""

    rule: str
    bound: tuple[relax.Var, ...]     # every new binding's var, in binding order
    offers: tuple[relax.Var, ...]
    replaces: tuple[relax.Var, ...]
    reads: tuple[relax.Var, ...]


@dataclass(frozen=True)
class Offered:
    """The module with the alternatives inlined, and where each one went."""

    module: tvm.IRModule
    sites: tuple[OfferedSite, ...]


def offer_alternatives(mod: tvm.IRModule, alternatives: Sequence[Alternative],
                       func_name: str = "main", *, skip_broken: bool = False) -> Offered:
    """`mod` with each alternative's body inlined at the end of `func_name`'s dataflow block.

    An alternative that breaks alternative.py's contract (a rule's bug) raises ValueError, or
    with `skip_broken` is left out with a warning, so the compile goes on with the original
    program there."""
    if not alternatives:
        return Offered(mod, ())
    func = mod[func_name]
    (block,) = func.body.blocks
    defined = {b.var for b in block.bindings} | set(func.params)
    binding_of = {b.var: b for b in block.bindings}
    bindings, sites = list(block.bindings), []
    for alternative in alternatives:
        try:
            _check_alternative(alternative, defined, binding_of)
            new_bindings, site = _inlined(alternative, len(sites))
        except ValueError as error:
            if not skip_broken:
                raise
            logger.warning("%s; not offered", error)
            continue
        bindings += new_bindings
        sites.append(site)
    if not sites:
        return Offered(mod, ())
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], func.body.body)
    builder = relax.BlockBuilder(mod)
    builder.update_func(mod.get_global_var(func_name), relax.Function(
        func.params, body, func.ret_ty, func.is_pure, func.attrs))
    # Normalize types the new block and body: an untyped node makes later passes fail
    # (FuseOps' function de-duplication, seen on EfficientViT)
    return Offered(relax.transform.Normalize()(builder.get()), tuple(sites))


def _check_alternative(alternative: Alternative, defined: set, binding_of: dict) -> None:
    """The contract of alternative.py, checked before anything is inlined (a rule's bug)."""
    rule, body = alternative.rule, alternative.body
    if len(body.params) != len(alternative.reads):
        raise ValueError(f"substitution {rule}: {len(body.params)} parameters for "
                         f"{len(alternative.reads)} reads")
    for read, param in zip(alternative.reads, body.params):
        if read not in defined:
            raise ValueError(f"substitution {rule}: reads {read.name}, which main does not define")
        if not tvm_ffi.structural_equal(read.ty, param.ty):
            raise ValueError(f"substitution {rule}: parameter {param.name} is not typed as "
                             f"{read.name}")
    fields = _result_fields(body)
    if len(fields) != len(alternative.replaces):
        raise ValueError(f"substitution {rule}: {len(fields)} results for "
                         f"{len(alternative.replaces)} replaced vars")
    for replaced, field in zip(alternative.replaces, fields):
        binding = binding_of.get(replaced)
        if binding is None or isinstance(binding.value, (relax.Tuple, relax.TupleGetItem)):
            raise ValueError(f"substitution {rule}: {replaced.name} is not bound by a "
                             "non-tuple binding of main")
        if not tvm_ffi.structural_equal(replaced.ty, field.ty):
            raise ValueError(f"substitution {rule}: the result for {replaced.name} has another "
                             "shape or dtype")


def _result_fields(body: relax.Function) -> list:
    """The vars of the body's result tuple (through a var bound to the tuple)."""
    result = body.body.body
    if isinstance(result, relax.Var):
        tuples = {b.var: b.value for blk in body.body.blocks for b in blk.bindings
                  if isinstance(b.value, relax.Tuple)}
        result = tuples.get(result, result)
    if not isinstance(result, relax.Tuple):
        raise ValueError("an alternative's body must return a tuple")
    return list(result.fields)


def _inlined(alternative: Alternative, number: int) -> tuple[list, OfferedSite]:
    """The body's bindings over fresh vars of main, with constant-only work folded."""
    body = _weights_folded(alternative.body)
    mapping: dict = dict(zip(body.params, alternative.reads))
    normalizer = relax.BlockBuilder()
    new_bindings = []
    for body_block in body.body.blocks:
        for binding in body_block.bindings:
            value = remap(binding.value, mapping)
            if isinstance(value, (tvm.ir.expr.Constant, relax.Var)):
                mapping[binding.var] = value  # a folded weight or an alias: no binding
                continue
            if isinstance(value, relax.Tuple) and binding.var not in _read_vars(body):
                continue  # the result tuple itself: its fields are the offers
            value = normalizer.normalize(value)
            var = relax.DataflowVar(f"alt{number}_{binding.var.name}", value.ty)
            new_bindings.append(relax.VarBinding(var, value))
            mapping[binding.var] = var
    offers = tuple(mapping[field] for field in _result_fields(body))
    bound = {b.var for b in new_bindings}
    for replaced, offer in zip(alternative.replaces, offers):
        if offer not in bound or isinstance(
                next(b.value for b in new_bindings if b.var.same_as(offer)),
                (relax.Tuple, relax.TupleGetItem)):
            raise ValueError(f"substitution {alternative.rule}: the result for {replaced.name} "
                             "has no producing primitive of its own")
    if len(set(offers)) != len(offers):
        raise ValueError(f"substitution {alternative.rule}: two results share one binding")
    return new_bindings, OfferedSite(alternative.rule, tuple(b.var for b in new_bindings), offers,
                                     tuple(alternative.replaces), tuple(alternative.reads))


def _read_vars(body: relax.Function) -> set:
    return {var for blk in body.body.blocks for b in blk.bindings for var in vars_read(b.value)}


def _weights_folded(body: relax.Function) -> relax.Function:
    """`body` with every call on constants only evaluated now (Relax's FoldConstant)."""
    folded = relax.transform.FoldConstant()(tvm.IRModule({"alternative": body}))
    return folded["alternative"]


def substitution_rules(choice: str) -> list:
    """The rules `--substitutions` (`KorchConfig.substitutions`) asks for: every rule of
    substitutions/rules.py for "on", none for "off"."""
    return [] if choice == "off" else list(ALL_RULES)


def graph_with_alternatives(lowered: tvm.IRModule, substitutions: str = "on", *,
                            fast_math: bool = True) -> PrimitiveGraph:
    """The primitive graph of `lowered` with every alternative the rules find offered beside
    the originals (graph/alternatives.py); exactly `PrimitiveGraph.from_module(lowered)` when
    none is found."""
    alternatives = find_alternatives(lowered["main"], substitution_rules(substitutions))
    offered = offer_alternatives(lowered, alternatives, skip_broken=True)
    return PrimitiveGraph.from_module(offered.module, fast_math=fast_math,
                                      offered_sites=offered.sites)
