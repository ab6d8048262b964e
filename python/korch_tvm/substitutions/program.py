"""A read-only view of `main` for rules: who binds and who reads each variable, static shapes,
constants, and the builder of an alternative's body.

Rules match small patterns (a divide feeding a matmul, matmuls sharing an input); they need the
producer of an argument and the consumers of a value, which Relax does not keep on the vars.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Sequence

import numpy as np
import tvm
from tvm import relax

from ..graph.relax_exprs import vars_read
from .alternative import Alternative

R = relax.op


class Program:
    """`main`'s non-tuple call bindings, indexed both ways. Built once per rule search."""

    def __init__(self, main: relax.Function):
        self.main = main
        self.params = list(main.params)
        self.bindings: list[relax.VarBinding] = []
        self.value_of: dict[relax.Var, relax.Expr] = {}
        self.consumers: dict[relax.Var, list[relax.Var]] = defaultdict(list)
        for block in main.body.blocks:
            for binding in block.bindings:
                if not isinstance(binding, relax.VarBinding):
                    continue
                self.bindings.append(binding)
                self.value_of[binding.var] = binding.value
                for read in vars_read(binding.value):
                    self.consumers[read].append(binding.var)
        self.outputs = set(vars_read(main.body.body))

    def calls(self, op_name: str) -> list[tuple[relax.Var, relax.Call]]:
        """Every binding `var = op_name(...)`, in program order."""
        return [(b.var, b.value) for b in self.bindings if is_call(b.value, op_name)]

    def call_of(self, var, op_name: str | None = None) -> relax.Call | None:
        """The op call binding `var` (of `op_name` if given), or None."""
        value = self.value_of.get(var) if isinstance(var, relax.Var) else None
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        return value if op_name is None or value.op.name == op_name else None

    def readers(self, var: relax.Var) -> list[relax.Var]:
        """The vars whose bindings read `var` (once per binding)."""
        return list(dict.fromkeys(self.consumers.get(var, [])))

    def skip_identity_casts(self, var):
        """`var`'s source through `astype` calls that keep the dtype (SegFormer has two)."""
        call = self.call_of(var, "relax.astype")
        while call is not None and dtype_of(call.args[0]) == dtype_of(var):
            var = call.args[0]
            call = self.call_of(var, "relax.astype")
        return var


def is_call(expr, op_name: str) -> bool:
    return (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name == op_name)


def static_shape(expr) -> list[int] | None:
    """The static shape of a tensor expression, or None where any dimension is symbolic."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = []
    for dim in ty.shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            return None
        dims.append(int(dim))
    return dims


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


def is_float(expr) -> bool:
    return dtype_of(expr).startswith(("float", "bfloat"))


def constant_array(expr) -> np.ndarray | None:
    """The value of a Relax constant, or None for anything else."""
    if isinstance(expr, tvm.ir.expr.Constant):
        return expr.value.numpy()
    return None


def int_values(expr) -> list[int] | None:
    """Integers of an attribute tuple (strided_slice's axes/begin/end are Tuples of IntImms)."""
    if not isinstance(expr, relax.Tuple):
        return None
    fields = expr.fields
    values = []
    for field in fields:
        if not isinstance(field, (int, tvm.tirx.IntImm)):
            return None
        values.append(int(field))
    return values


def build_alternative(rule: str, operands: Sequence[relax.Expr], replaces: Sequence[relax.Var],
                      emit: Callable[..., Sequence[relax.Expr]]) -> Alternative:
    """An alternative whose reads are the distinct vars among `operands` (constants stay in the
    body). `emit(bb, *operands)` gets the operands with each var replaced by its body param,
    emits the intermediate primitives with `bb.emit` and returns one call per replaced tensor;
    each is bound here by its own binding and the body returns them as a tuple."""
    reads = tuple(dict.fromkeys(op for op in operands if isinstance(op, relax.Var)))
    params = [relax.Var(read.name, read.ty) for read in reads]
    lookup = dict(zip(reads, params))
    bb = relax.BlockBuilder()
    with bb.function("alternative", params):
        with bb.dataflow():
            calls = emit(bb, *[lookup.get(op, op) for op in operands])
            results = [bb.emit_output(call) for call in calls]
        bb.emit_func_output(relax.Tuple(results))
    body = bb.get()["alternative"]
    for result, replaced in zip(body.ret_ty.fields, replaces):
        assert static_shape_of_type(result) == static_shape(replaced), \
            f"{rule}: the body's result does not have {replaced.name}'s shape"
    return Alternative(rule, reads, tuple(replaces), body)


def static_shape_of_type(ty) -> list[int] | None:
    return [int(dim) for dim in ty.shape.values] if ty.shape is not None else None


def size_of(expr) -> int:
    return int(np.prod(static_shape(expr), dtype=np.int64))


def constant_like(array: np.ndarray, like) -> relax.Expr:
    return relax.const(np.ascontiguousarray(array).astype(dtype_of(like)), dtype_of(like))
