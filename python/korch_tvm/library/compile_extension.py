"""Compile korch_tvm's library-kernel extensions with the machine's C++ compiler.

`build_blas_extension` (`python -m korch_tvm.library.build`, run by `make install`) builds the OpenBLAS extension from
blas_ext.cc into `library_dir()`: one object file, linked into exported Relax libraries, and
a shared library built from it, loaded to run and time the kernels in this process. With
`--cuda` it also builds the cuBLAS extension (cublas_ext.cu), which needs nvcc and cuBLAS's
headers. The outputs go to the venv (or the user's cache), never into the source tree, and their
names carry a hash of what they were built from, so an edited source is never loaded stale.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
BLAS_SOURCE = SOURCE_DIR / "blas_ext.cc"
# The headers the extensions include (operand checks, the epilogue), hashed with each source.
HEADERS = ("gemm_operands.h", "gemm_epilogue.h", "conv_im2col.h", "conv_grouped.h")
_COMPILE_TIMEOUT_S = 600


class LibraryBuildError(RuntimeError):
    """A build that cannot run here (no compiler, no BLAS, a compile error); one line."""


def library_dir() -> Path:
    """Where built extensions live: inside the active venv, else the user's korch_tvm cache."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "share" / "korch_tvm" / "library"
    cache = os.environ.get("KORCH_TVM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "korch_tvm")
    return Path(cache) / "library"


def openblas_paths() -> tuple[Path, Path]:
    """(include dir, shared library) of the scipy-openblas32 package."""
    try:
        import scipy_openblas32
    except ImportError as error:
        raise LibraryBuildError("scipy-openblas32 is not installed; run `pip install "
                                "scipy-openblas32` (or `make install`)") from error
    lib_dir = Path(scipy_openblas32.get_lib_dir())
    library = lib_dir / f"lib{scipy_openblas32.get_library()}.so"
    if not library.is_file():
        raise LibraryBuildError(f"scipy-openblas32 has no shared library at {library}")
    return Path(scipy_openblas32.get_include_dir()), library


def _tvm_ffi_paths() -> tuple[Path, Path]:
    import tvm_ffi.libinfo
    return Path(tvm_ffi.libinfo.find_include_path()), Path(tvm_ffi.libinfo.find_libtvm_ffi())


def _tvm_runtime_library() -> Path:
    """libtvm_runtime.so, whose thread pool the BLAS runs its jobs on."""
    import tvm.libinfo
    try:
        return Path(tvm.libinfo.find_libtvm_runtime())
    except (RuntimeError, OSError) as error:
        raise LibraryBuildError(f"TVM's libtvm_runtime.so not found: {error}") from error


def source_digest(source: Path) -> "hashlib._Hash":
    """sha256 of `source` and the headers beside it that the extensions include."""
    digest = hashlib.sha256(source.read_bytes())
    for header in HEADERS:
        path = source.parent / header
        digest.update(path.read_bytes() if path.is_file() else b"")
    return digest


def build_key(source: Path = BLAS_SOURCE) -> str:
    """Hash of the source (and headers), the BLAS it links and the tvm-ffi version: names the
    outputs."""
    import tvm_ffi
    digest = source_digest(source)
    digest.update(str(openblas_paths()[1]).encode())
    digest.update(str(tvm_ffi.__version__).encode())
    return digest.hexdigest()[:12]


def blas_artifacts(directory: Path | None = None) -> tuple[Path, Path]:
    """(object file, shared library) paths of the OpenBLAS extension for the current source."""
    directory = Path(directory) if directory is not None else library_dir()
    stem = f"korch_blas-{build_key()}"
    return directory / f"{stem}.o", directory / f"{stem}.so"


def find_cxx() -> str:
    """The C++ compiler: $CXX, else c++, g++ or clang++ on PATH."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    raise LibraryBuildError(f"no C++ compiler found (tried {', '.join(candidates)}); install "
                            "g++ or set CXX to build the BLAS library kernels")


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=_COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LibraryBuildError(f"{what} could not run: {error}") from error
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        first = next((line for line in lines if "error" in line and "collect2" not in line),
                     lines[-1] if lines else "")
        raise LibraryBuildError(f"{what} failed (exit {done.returncode}): {first.strip()}")


def build_atomically(object_path: Path, shared_path: Path, compile_step, link_step) -> None:
    """Compile and link under temporary names, then rename, so a concurrent loader never sees
    half a file. `compile_step(object)` and `link_step(object, shared)` give (command, what it
    does) for those temporary paths; nothing partial is left behind when a step fails."""
    object_path.parent.mkdir(parents=True, exist_ok=True)
    partial = f".partial-{os.getpid()}"
    object_tmp = object_path.with_name(object_path.name + partial)
    shared_tmp = shared_path.with_name(shared_path.name + partial)
    try:
        _run(*compile_step(object_tmp))
        _run(*link_step(object_tmp, shared_tmp))
        os.replace(object_tmp, object_path)
        os.replace(shared_tmp, shared_path)
    finally:
        for leftover in (object_tmp, shared_tmp):
            leftover.unlink(missing_ok=True)


def build_blas_extension(directory: Path | None = None, force: bool = False) -> Path:
    """Build (or reuse) the OpenBLAS extension; returns the shared library's path."""
    object_path, shared_path = blas_artifacts(directory)
    if not force and object_path.is_file() and shared_path.is_file():
        return shared_path
    cxx = find_cxx()
    blas_include, blas_library = openblas_paths()
    ffi_include, ffi_library = _tvm_ffi_paths()
    runtime = _tvm_runtime_library()
    build_atomically(
        object_path, shared_path,
        # -fno-trapping-math lets the epilogue's activation loops vectorise (gemm_epilogue.h);
        # -ffp-contract=fast lets a multiply-add be one FMA (conv_grouped.h), as in the BLAS
        lambda obj: ([cxx, "-std=c++17", "-O3", "-fno-trapping-math", "-ffp-contract=fast",
                      "-fPIC", "-c",
                      str(BLAS_SOURCE),
                      f"-I{ffi_include}", f"-I{blas_include}", "-o", str(obj)],
                     "compiling blas_ext.cc"),
        lambda obj, shared: ([cxx, "-shared", "-o", str(shared), str(obj), str(blas_library),
                              str(ffi_library), str(runtime), f"-Wl,-rpath,{blas_library.parent}",
                              f"-Wl,-rpath,{ffi_library.parent}", f"-Wl,-rpath,{runtime.parent}"],
                             "linking the BLAS extension"))
    for stale in object_path.parent.glob("korch_blas-*"):   # builds of earlier sources
        if stale.suffix in (".o", ".so") and stale not in (object_path, shared_path):
            stale.unlink(missing_ok=True)
    return shared_path
