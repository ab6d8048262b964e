"""Numerical check of alternatives: the original subgraph of `main` against the body, on random
inputs, in the Relax VM on llvm.

A rule is trusted only as far as this check: every alternative a rule finds on a real model
can be run through it (all at once: one module, one compile), so a rule that mis-reads an
axis or a layout shows up as a large error instead of a silently wrong plan.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tvm
from tvm import relax

from .alternative import Alternative
from ..graph.relax_exprs import remap, vars_read
from .program import dtype_of, static_shape


def original_subgraph(main: relax.Function, alternative: Alternative) -> relax.Function:
    """The bindings of `main` that compute `alternative.replaces` from `alternative.reads`, as a
    function of the reads. Raises ValueError where the replaced values depend on a param of
    `main` that is not among the reads (the alternative would not be closed)."""
    value_of = {b.var: b.value for block in main.body.blocks for b in block.bindings
                if isinstance(b, relax.VarBinding)}
    order = {var: index for index, var in enumerate(value_of)}
    reads = set(alternative.reads)
    needed, stack = set(), list(alternative.replaces)
    while stack:
        var = stack.pop()
        if var in reads or var in needed:
            continue
        if var not in value_of:
            raise ValueError(f"{alternative.rule}: {var.name} is not computed from the reads")
        needed.add(var)
        stack.extend(vars_read(value_of[var]))
    params = [relax.Var(read.name, read.ty) for read in alternative.reads]
    mapping = dict(zip(alternative.reads, params))
    bb = relax.BlockBuilder()
    with bb.function("original", params):
        for var in sorted(needed, key=order.__getitem__):
            mapping[var] = bb.emit(remap(value_of[var], mapping), var.name)
        bb.emit_func_output(relax.Tuple([mapping[var] for var in alternative.replaces]))
    return bb.get()["original"]


def check_alternatives(main: relax.Function, alternatives: Sequence[Alternative], *,
                       module: tvm.IRModule | None = None, seed: int = 0) -> list[float]:
    """The max relative error (max |body - original| / max |original|, over every replaced
    tensor) of each alternative, on uniform random inputs in [0.5, 1.5) (positive, so a
    softmax denominator is never near zero). `module`: the primitive module, needed only
    where a subgraph calls one of its functions (call_tir)."""
    check = tvm.IRModule({} if module is None else
                         {gv: f for gv, f in module.functions_items() if gv.name_hint != "main"})
    for index, alternative in enumerate(alternatives):
        check[f"original_{index}"] = _named(original_subgraph(main, alternative),
                                            f"original_{index}")
        check[f"alternative_{index}"] = _named(alternative.body, f"alternative_{index}")
    vm = relax.VirtualMachine(tvm.compile(check, target="llvm"), tvm.cpu())
    rng = np.random.default_rng(seed)
    errors = []
    for index, alternative in enumerate(alternatives):
        inputs = [tvm.runtime.tensor(_random_like(read, rng)) for read in alternative.reads]
        expected = vm[f"original_{index}"](*inputs)
        actual = vm[f"alternative_{index}"](*inputs)
        errors.append(max(_relative_error(a.numpy(), e.numpy()) for a, e in zip(actual, expected)))
    return errors


def check_alternative(main: relax.Function, alternative: Alternative, *,
                      module: tvm.IRModule | None = None, seed: int = 0) -> float:
    """`check_alternatives` for one alternative."""
    return check_alternatives(main, [alternative], module=module, seed=seed)[0]


def _relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    if actual.shape != expected.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-30)
    difference = np.abs(actual.astype("float64") - expected.astype("float64"))
    return float(np.max(difference, initial=0.0)) / scale


def _random_like(var: relax.Var, rng: np.random.Generator) -> np.ndarray:
    shape, dtype = static_shape(var), dtype_of(var)
    assert shape is not None, f"{var.name}: the check needs static shapes"
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith(("int", "uint")):
        return rng.integers(0, 4, size=shape).astype(dtype)
    return rng.uniform(0.5, 1.5, size=shape).astype(dtype)


def _named(func: relax.Function, name: str) -> relax.Function:
    return func.with_attr("global_symbol", name)


