"""Export a compiled Relax module whose kernels call the BLAS extension, self-contained.

The extension's object file is linked into the exported library, so loading that library runs
the extension's static registration: a fresh process needs only `tvm.runtime.load_module(path)`
and `relax.VirtualMachine`, nothing of korch_tvm. The BLAS stays a shared library, found through
the absolute rpath of this installation (the export runs where korch_tvm is installed).
"""

from __future__ import annotations

from pathlib import Path

import tvm
from tvm import relax

from .extension import BLAS_PREFIX, CUBLAS_PREFIX, cublas_link_inputs, link_inputs

CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")


def library_calls(mod: tvm.IRModule) -> set[str]:
    """Names of the korch_tvm.blas.* / korch_tvm.cublas.* functions mod's Relax code calls."""
    names: set[str] = set()

    def visit(expr):
        if (isinstance(expr, relax.Call) and expr.op.same_as(CALL_DPS_PACKED)
                and isinstance(expr.args[0], relax.ExternFunc)
                and str(expr.args[0].global_symbol).startswith((BLAS_PREFIX, CUBLAS_PREFIX))):
            names.add(str(expr.args[0].global_symbol))

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return names


def export_library(executable, path: str | Path, directory: Path | None = None,
                   cuda: bool = False) -> Path:
    """executable.export_library(path) with the BLAS (or, with cuda, the cuBLAS) extension
    linked in."""
    files, options = cublas_link_inputs(directory) if cuda else link_inputs(directory)
    relax.VMExecutable.export_library(executable, str(path), addons=files, options=options)
    return Path(path)


class LibraryExecutable(relax.VMExecutable):
    """A VMExecutable whose own `export_library` links the extension its code calls, so a user
    who exports it the usual way gets a library that runs in a fresh process with TVM alone."""

    def __init__(self, mod: tvm.runtime.Module, cuda: bool = False):
        super().__init__(mod)
        self.cuda = cuda

    def export_library(self, file_name, *, fcompile=None, addons=None, workspace_dir=None,
                       **kwargs):
        files, options = cublas_link_inputs() if self.cuda else link_inputs()
        kwargs["options"] = list(kwargs.get("options") or []) + options
        return super().export_library(file_name, fcompile=fcompile,
                                      addons=list(addons or []) + files,
                                      workspace_dir=workspace_dir, **kwargs)


def self_contained(executable, mod: tvm.IRModule):
    """`executable` (built from `mod`) as a `LibraryExecutable` when mod calls the extension,
    else as it is."""
    calls = library_calls(mod)
    if not calls:
        return executable
    return LibraryExecutable(executable.mod, cuda=any(name.startswith(CUBLAS_PREFIX)
                                                      for name in calls))
