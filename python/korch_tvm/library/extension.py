"""Find and load korch_tvm's own built BLAS extension, and name what an export must link.

Only the extension this package built, at the path `build.blas_artifacts` derives from its own
source, is ever loaded: nothing here takes a path from a model, a log or a user file. A missing
extension makes the library kernels unavailable (one info line), never an error.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from .compile_extension import LibraryBuildError, blas_artifacts, openblas_paths

logger = logging.getLogger("korch_tvm.library")

BLAS_PREFIX = "korch_tvm.blas."
CUBLAS_PREFIX = "korch_tvm.cublas."


def load_blas_extension(directory: Path | None = None) -> bool:
    """Load the extension (once per process: a loaded library stays loaded); True if loaded.
    An absent one is looked for again on the next call, so a build later in the process counts."""
    try:
        _, shared_path = blas_artifacts(directory)
    except LibraryBuildError as error:
        logger.info("BLAS library kernels unavailable: %s", error)
        return False
    if not shared_path.is_file():
        logger.info("BLAS library kernels unavailable: %s is not built (run `python -m "
                    "korch_tvm.library.build`)", shared_path.name)
        return False
    return _load_once(str(shared_path))


def load_cublas_extension(directory: Path | None = None) -> bool:
    """Load the cuBLAS extension (built with `build --cuda`) once; True if it is loaded."""
    from .cublas_build import cublas_artifacts
    _, shared_path = cublas_artifacts(directory)
    if not shared_path.is_file():
        logger.info("cuBLAS library kernels unavailable: %s is not built (run `python -m "
                    "korch_tvm.library.build --cuda`)", shared_path.name)
        return False
    return _load_once(str(shared_path))


@functools.lru_cache(maxsize=None)
def _load_once(path: str) -> bool:
    import tvm_ffi
    tvm_ffi.load_module(path)
    return True


def blas_function(name: str):
    """The registered packed function `korch_tvm.blas.<name>`; the extension must be loaded."""
    import tvm_ffi
    function = tvm_ffi.get_global_func(BLAS_PREFIX + name, allow_missing=True)
    assert function is not None, f"{BLAS_PREFIX}{name} is not registered: load the extension first"
    return function


def set_blas_threads(count: int) -> int:
    """Ask for `count` BLAS threads; returns the count granted. The BLAS runs its jobs on TVM's
    thread pool (TVM_NUM_THREADS threads), so by default it uses the pool's size and never more;
    1 avoids its busy-waiting between jobs on a machine whose cores other processes share."""
    return int(blas_function("set_num_threads")(int(count)))


def link_inputs(directory: Path | None = None) -> tuple[list[str], list[str]]:
    """(extra input files, linker options) that put the extension into an exported library.

    The object's static initialiser registers the functions when the exported library is
    loaded, so a fresh process needs only `tvm.runtime.load_module`; the BLAS itself stays a
    shared library, found through the rpath recorded here."""
    object_path, _ = blas_artifacts(directory)
    if not object_path.is_file():
        raise LibraryBuildError(f"{object_path} is not built; run `python -m "
                                "korch_tvm.library.build`")
    _, blas_library = openblas_paths()
    return [str(object_path), str(blas_library)], [f"-Wl,-rpath,{blas_library.parent}"]


def cublas_link_inputs(directory: Path | None = None) -> tuple[list[str], list[str]]:
    """The same for the cuBLAS extension: its shared library becomes a dependency of the
    export (its own rpath finds cuBLAS), so loading the export loads and registers it."""
    from .cublas_build import cublas_artifacts
    _, shared_path = cublas_artifacts(directory)
    if not shared_path.is_file():
        raise LibraryBuildError(f"{shared_path} is not built; run `python -m "
                                "korch_tvm.library.build --cuda`")
    # Nothing in the export refers to its symbols, so keep the linker from dropping it.
    return [str(shared_path)], ["-Wl,--no-as-needed", f"-Wl,-rpath,{shared_path.parent}"]
