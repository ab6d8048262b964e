"""Vendor-library kernels (OpenBLAS GEMM and im2col convolution on CPU, beside the extension's
own direct kernel for convolutions of narrow groups; cuBLAS behind a build flag) as candidates.

`implementations_for(kernel_mod)` says which library calls compute a kernel; an
`Implementation` times itself (`measure()`) and emits its Relax call (`call(...)`);
`UseLibraryGemm` rewrites chosen kernels' call_tir into those calls; `export_library` links the
extension into the exported library so a fresh process runs it with only TVM. Everything here
needs the extension that `python -m korch_tvm.library.build` (run by `make install`) built;
without it `implementations_for` returns nothing and the rest of korch_tvm is unaffected.
"""

from .compile_extension import LibraryBuildError, build_blas_extension, library_dir
from .export import LibraryExecutable, export_library, library_calls, self_contained
from .extension import load_blas_extension, load_cublas_extension, set_blas_threads
from .conv_match import ConvSpec, match_conv
from .gemm_match import GemmSpec, match_gemm
from .implementations import Implementation, implementations_for, time_call
from .use_library_gemm import UseLibraryGemm

__all__ = [
    "ConvSpec", "GemmSpec", "Implementation", "LibraryBuildError", "LibraryExecutable",
    "UseLibraryGemm", "build_blas_extension", "export_library", "implementations_for",
    "library_calls", "library_dir", "load_blas_extension", "load_cublas_extension",
    "match_conv", "match_gemm", "self_contained", "set_blas_threads", "time_call",
]
