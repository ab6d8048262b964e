"""Build the cuBLAS extension (cublas_ext.cu) with nvcc, against cuBLAS from a CUDA toolkit or
NVIDIA's wheels (`nvidia-cublas` for CUDA 13, `nvidia-cublas-cu12` for CUDA 12).

Built only on request (`python -m korch_tvm.library.build --cuda`): hosts without nvcc or
cuBLAS's headers get one line saying which is missing. The outputs mirror the BLAS extension's
(an object to link into exports, a shared library to load), named by a hash of the source.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from .compile_extension import (SOURCE_DIR, LibraryBuildError, _tvm_ffi_paths, build_atomically,
                                find_cxx, library_dir, source_digest)

CUBLAS_SOURCE = SOURCE_DIR / "cublas_ext.cu"


def find_nvcc() -> str:
    """nvcc from $CUDA_HOME/bin, else PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [os.path.join(home, "bin", "nvcc")] if home else []
    candidates.append(shutil.which("nvcc") or "")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise LibraryBuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH) to build the "
                            "cuBLAS library kernels")


def cuda_home(nvcc: str) -> Path:
    """The toolkit nvcc belongs to (nvcc may be a wrapper script elsewhere on PATH)."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = ([Path(env)] if env else []) + [Path(nvcc).resolve().parent.parent,
                                                 Path("/usr/local/cuda")]
    candidates += sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    for candidate in candidates:
        if (candidate / "include" / "cuda_runtime.h").is_file() and \
                (candidate / "lib64" / "libcudart.so").exists():
            return candidate
    raise LibraryBuildError(f"no CUDA toolkit (include/cuda_runtime.h, lib64/libcudart.so) "
                            f"found for {nvcc}; set CUDA_HOME")


def _cublas_roots(nvcc: str) -> list[Path]:
    """Folders that may hold include/cublas_v2.h and lib[64]/libcublas.so*, in order."""
    roots = [cuda_home(nvcc)]
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        roots += [Path(base) / "cu13", Path(base) / "cublas"]      # CUDA 13 and 12 wheels
    return roots


def find_cublas(nvcc: str, root: Path | None = None) -> tuple[Path, Path]:
    """(include dir, libcublas shared library) from `root`, the toolkit or NVIDIA's wheels."""
    for candidate in ([Path(root)] if root is not None else _cublas_roots(nvcc)):
        header = candidate / "include" / "cublas_v2.h"
        libraries = sorted(p for folder in ("lib64", "lib") if (candidate / folder).is_dir()
                           for p in (candidate / folder).glob("libcublas.so*"))
        if header.is_file() and libraries:
            return header.parent, libraries[0]
    where = root if root is not None else "the CUDA toolkit or an nvidia-cublas wheel"
    raise LibraryBuildError(f"cuBLAS headers and library not found in {where}; `pip install "
                            "nvidia-cublas` (CUDA 13) or `nvidia-cublas-cu12` (CUDA 12)")


def cublas_artifacts(directory: Path | None = None) -> tuple[Path, Path]:
    """(object file, shared library) paths of the cuBLAS extension for the current source.

    Named by the source alone, so a host that only runs (no nvcc) can still find it."""
    directory = Path(directory) if directory is not None else library_dir()
    digest = source_digest(CUBLAS_SOURCE)
    stem = f"korch_cublas-{digest.hexdigest()[:12]}"
    return directory / f"{stem}.o", directory / f"{stem}.so"


def build_cublas_extension(directory: Path | None = None, force: bool = False,
                           cublas_root: Path | None = None) -> Path:
    """Build (or reuse) the cuBLAS extension; returns the shared library's path."""
    nvcc = find_nvcc()
    cublas_include, cublas_library = find_cublas(nvcc, cublas_root)
    object_path, shared_path = cublas_artifacts(directory)
    if not force and object_path.is_file() and shared_path.is_file():
        return shared_path
    ffi_include, ffi_library = _tvm_ffi_paths()
    cuda_lib = cuda_home(nvcc) / "lib64"
    # The host compiler links: nvcc refuses a versioned library (libcublas.so.13) as input.
    build_atomically(
        object_path, shared_path,
        lambda obj: ([nvcc, "-std=c++17", "-O2", "-Xcompiler", "-fPIC", "-c", str(CUBLAS_SOURCE),
                      f"-I{ffi_include}", f"-I{cublas_include}", "-o", str(obj)],
                     "compiling cublas_ext.cu"),
        lambda obj, shared: ([find_cxx(), "-shared", "-o", str(shared), str(obj),
                              str(cublas_library), str(ffi_library), f"-L{cuda_lib}", "-lcudart",
                              f"-Wl,-rpath,{cublas_library.parent}",
                              f"-Wl,-rpath,{ffi_library.parent}", f"-Wl,-rpath,{cuda_lib}"],
                             "linking the cuBLAS extension"))
    return shared_path
