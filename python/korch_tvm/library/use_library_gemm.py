"""Replace chosen GEMM and convolution kernels' `call_tir` by the BLAS extension's
`call_dps_packed` (the kernel's epilogue, its bias / residual operands and activations, inside
that call)."""

from __future__ import annotations

from typing import Collection

import tvm
from tvm import relax

from .implementations import Implementation, implementations_for, library_spec

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@tvm.transform.module_pass(opt_level=0, name="UseLibraryGemm")
class UseLibraryGemm:
    """`kernels`: names of the PrimFuncs to replace (None: every one that is a GEMM or a
    convolution, with or without an epilogue the library applies);
    `device`: whose library calls ("cpu": OpenBLAS, "cuda": cuBLAS).

    A named kernel that is not a GEMM, or an unavailable extension, is an error, not a silent
    keep: the caller chose the library for it. PrimFuncs left uncalled are removed."""

    def __init__(self, kernels: Collection[str] | None = None, device: str = "cpu"):
        self.kernels = None if kernels is None else frozenset(kernels)
        self.device = device

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return _GemmRewriter(mod, self.kernels, self.device).rewrite()


@relax.expr_functor.mutator
class _GemmRewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, kernels, device: str):
        super().__init__(mod)
        self.mod_ = mod
        self.kernels, self.device = kernels, device
        self.replaced: set[str] = set()

    def rewrite(self) -> tvm.IRModule:
        for gv, func in self.mod_.functions_items():
            if isinstance(func, relax.Function):
                self.builder_.update_func(gv, self.visit_expr(func))
        missing = (self.kernels or frozenset()) - self.replaced
        if missing:
            raise ValueError(f"UseLibraryGemm: kernel {sorted(missing)[0]} is not called "
                             "through call_tir in this module")
        return relax.transform.DeadCodeElimination()(self.builder_.get())

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not call.op.same_as(CALL_TIR) or len(call.args) != 2:
            return call
        callee = call.args[0]
        if self.kernels is not None and callee.name_hint not in self.kernels:
            return call
        implementation = self._implementation(callee)
        if implementation is None:
            return call
        self.replaced.add(callee.name_hint)
        inputs = list(call.args[1].fields)
        return implementation.call(inputs, call.ty_args[0])

    def _implementation(self, callee) -> Implementation | None:
        kernel = self.mod_[callee]
        found = implementations_for(tvm.IRModule({"main": kernel}), self.device) \
            if isinstance(kernel, tvm.tirx.PrimFunc) else []
        if found or self.kernels is None:
            return found[0] if found else None
        spec = library_spec(tvm.IRModule({"main": kernel}), self.device)
        reason = ("is not a float32 GEMM or convolution the library computes (with its "
                  "epilogue)" if spec is None
                  else "has an epilogue, which cuBLAS calls do not apply"
                  if spec.epilogue and self.device != "cpu"
                  else "has no library implementation here (extension not built)")
        raise ValueError(f"UseLibraryGemm: kernel {callee.name_hint} {reason}")
