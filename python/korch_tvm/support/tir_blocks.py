"""The blocks of a TIR function, read off its statements.

A `tvm.s_tir.Schedule` lists them too, but building one costs 0.6-0.8 ms a kernel, and the
costing and the library matchers ask this of thousands of kernels.
"""

from __future__ import annotations

import tvm

# IterVar.CommReduce, as the plain int the iterators' `iter_type` compares with.
REDUCE = int(tvm.tirx.IterVar.CommReduce)


def is_reduction(block) -> bool:
    """Whether `block` has a reduction iterator (a matmul's, a convolution's, a sum's)."""
    return any(int(iv.iter_type) == REDUCE for iv in block.iter_vars)


def blocks_of(func: tvm.tirx.PrimFunc) -> list:
    """Every block of `func`, nested ones included (the root left out), in the code's order."""
    body = func.body
    if isinstance(body, tvm.s_tir.SBlockRealize):  # the root block
        body = body.block.body
    return blocks_below(body)


def blocks_below(stmt, found: list | None = None) -> list:
    """Every block under the statement `stmt` (its own, if it is a block), in the code's order."""
    found = [] if found is None else found
    if isinstance(stmt, tvm.s_tir.SBlockRealize):
        found.append(stmt.block)
        stmt = stmt.block.body
    if isinstance(stmt, tvm.tirx.SeqStmt):
        for part in stmt.seq:
            blocks_below(part, found)
    elif isinstance(stmt, tvm.tirx.IfThenElse):
        blocks_below(stmt.then_case, found)
        if stmt.else_case is not None:
            blocks_below(stmt.else_case, found)
    elif isinstance(getattr(stmt, "body", None), tvm.tirx.Stmt):  # a loop, let, attribute, ...
        blocks_below(stmt.body, found)
    return found
