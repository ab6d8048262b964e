"""`python -m korch_tvm.library.build`: build the library-kernel extensions (`make install`).

Exit status 1 with one line on stderr when they cannot be built here; korch_tvm then runs
without library kernels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .compile_extension import LibraryBuildError, build_blas_extension, library_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m korch_tvm.library.build",
                                     description="Build korch_tvm's library-kernel extensions.")
    parser.add_argument("--directory", type=Path, default=None,
                        help="output folder (default: %s)" % library_dir())
    parser.add_argument("--force", action="store_true", help="rebuild even if built")
    parser.add_argument("--cuda", action="store_true",
                        help="also build the cuBLAS extension (needs nvcc and cuBLAS headers)")
    parser.add_argument("--cublas-root", type=Path, default=None,
                        help="a folder with include/cublas_v2.h and lib/libcublas.so* (default: "
                             "the CUDA toolkit, then NVIDIA's nvidia-cublas wheels)")
    args = parser.parse_args(argv)
    try:
        path = build_blas_extension(args.directory, force=args.force)
        print(f"korch_tvm: BLAS library kernels built: {path}")
        if args.cuda:
            from .cublas_build import build_cublas_extension
            print(f"korch_tvm: cuBLAS library kernels built: "
                  f"{build_cublas_extension(args.directory, args.force, args.cublas_root)}")
    except LibraryBuildError as error:
        print(f"korch_tvm: library kernels not built: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
