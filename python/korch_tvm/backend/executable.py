"""The executable a compile returns: built, exported once to a shared library, loaded from it.

Run in process, a freshly built executable JIT-compiles its LLVM module (DenseNet-121: 10 s on
one thread), and the user's `export_library` then emits the same object code again. Exporting
once, on several threads (support/parallel_codegen.py), and loading that library gives an
executable that runs at once, is exactly the file the user gets (so verification checks the
library that ships), and exports again as a copy.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from pathlib import Path

import tvm
from tvm import relax

from ..errors import error_summary
from ..library import LibraryExecutable, self_contained
from ..library.extension import link_inputs
from ..support.parallel_codegen import SHARED_LIBRARY_SUFFIXES, build_in_parts, export_in_parts
from ..support.scratch import user_temporary_folder
from ..target_spec import host_core_count
from .cuda import build, is_cuda

logger = logging.getLogger("korch_tvm.build")


class ExportedExecutable(relax.VMExecutable):
    """A VMExecutable loaded from the shared library it was exported to.

    `export_library(name)` of a shared library copies that library; with other settings
    (`fcompile`, a .tar, addons) it exports the in-memory executable `built`."""

    def __init__(self, built: relax.VMExecutable, path: Path):
        super().__init__(tvm.runtime.load_module(str(path)))
        self.built = built
        self.path = path
        # the loaded library stays mapped after its folder is removed
        weakref.finalize(self, shutil.rmtree, str(path.parent), True)

    def export_library(self, file_name, **kwargs):
        if kwargs or not str(file_name).endswith(SHARED_LIBRARY_SUFFIXES):
            return self.built.export_library(file_name, **kwargs)
        shutil.copyfile(self.path, file_name)
        return None


def build_executable(mod: tvm.IRModule, target, threads: int | None = None):
    """`mod` built for `target`. On the CPU, an `ExportedExecutable` whose kernels were compiled
    on `threads` threads (default: one per core, as the builders run; the BLAS extension linked
    in when mod calls it); on CUDA, the executable `tvm.compile` makes (a `LibraryExecutable`
    when it calls cuBLAS)."""
    threads = threads or host_core_count()
    if is_cuda(target):
        return self_contained(build(mod, target), mod)
    built = self_contained(build_in_parts(mod, target, threads), mod)
    addons, options = link_inputs() if isinstance(built, LibraryExecutable) else ([], [])
    path = Path(tempfile.mkdtemp(prefix="korch-tvm-library-", dir=user_temporary_folder()))
    path = path / "model.so"
    try:
        export_in_parts(built, str(path), addons, options, threads)
        return ExportedExecutable(built, path)
    except RuntimeError as err:  # no C compiler or linker here: run it in process (JIT)
        shutil.rmtree(path.parent, ignore_errors=True)
        logger.warning("the library cannot be linked here (%s); the executable runs from "
                       "memory, and export_library will fail the same way",
                       error_summary(str(err)))
        return built
    except BaseException:
        shutil.rmtree(path.parent, ignore_errors=True)
        raise
