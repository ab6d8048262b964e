"""Library implementations of a kernel: what the solver may choose instead of a TVM schedule.

`implementations_for(kernel_mod)` lists the vendor calls that compute exactly what the kernel
computes (today: one OpenBLAS GEMM or batched GEMM when the kernel is a float32 GEMM, or one
im2col + GEMM call when it is a float32 2-D convolution, a direct kernel of the extension's own
when that convolution has narrow groups, with its epilogue of bias / residual
adds and activations applied inside the call; cuBLAS for a plain GEMM).
Each `Implementation` times itself on this machine and emits the Relax call that replaces the
kernel's `call_tir`, so costing and the plan rewrite meet through this one record.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import tvm
from tvm import relax

from .conv_match import ConvSpec, match_conv
from .extension import (BLAS_PREFIX, CUBLAS_PREFIX, load_blas_extension,
                        load_cublas_extension)
from .gemm_match import GemmSpec, match_gemm

# What a library call computes: its two main operands (`main_inputs`, `input_shapes()`), the
# scalars after them (`scalar_arguments()`), its epilogue and its output (`output_shape()`).
CallSpec = Union[GemmSpec, ConvSpec]
# Routines of the extension that are its own code rather than a BLAS call (reported as
# "korch.<routine>").
OWN_ROUTINES = ("sgconv2d",)


@dataclass(frozen=True)
class Implementation:
    """One library call computing a kernel: `name` for reports (the routine, then "+step" per
    epilogue step), `function` the packed name."""

    name: str
    function: str
    spec: CallSpec

    def call(self, kernel_inputs: Sequence[relax.Expr], out_ty: relax.TensorType) -> relax.Call:
        """The `call_dps_packed` that replaces `call_tir(kernel, kernel_inputs, out_ty)`."""
        spec = self.spec
        operands = [step.input for step in spec.epilogue if step.input is not None]
        wanted = len({*spec.main_inputs, *operands})
        assert len(kernel_inputs) == wanted, \
            f"this kernel takes {wanted} inputs, got {len(kernel_inputs)}"
        args = [kernel_inputs[n] for n in spec.main_inputs]
        args += [relax.prim_value(value) for value in spec.scalar_arguments()]
        if spec.epilogue:
            args += [tvm.ir.StringImm(epilogue_text(spec))] + [kernel_inputs[n] for n in operands]
        return relax.op.call_dps_packed(self.function, relax.Tuple(args), out_ty)

    def measure(self, repeats: int = 7, min_repeat_seconds: float = 2e-3,
                preprocess: str = "") -> float:
        """Median seconds per call on this machine, the packed function timed directly
        (`preprocess`: see `time_call`)."""
        return time_call(self.function, self.spec, repeats, min_repeat_seconds, preprocess)


def implementations_for(kernel_mod: tvm.IRModule, device: str = "cpu") -> list[Implementation]:
    """The library implementations of kernel_mod's `main` on `device` ("cpu": OpenBLAS,
    "cuda": cuBLAS); empty when none applies or the extension is not built here."""
    assert device in ("cpu", "cuda"), f"unknown library device {device!r}"
    spec = library_spec(kernel_mod, device)
    if spec is None or (spec.epilogue and device != "cpu"):   # cuBLAS: plain GEMMs only
        return []
    loaded = load_blas_extension() if device == "cpu" else load_cublas_extension()
    if not loaded:
        return []
    vendor, prefix = ("openblas", BLAS_PREFIX) if device == "cpu" else ("cublas", CUBLAS_PREFIX)
    if spec.routine in OWN_ROUTINES:
        vendor = "korch"
    name = "+".join([f"{vendor}.{spec.routine}"] + [step.token() for step in spec.epilogue])
    return [Implementation(name, prefix + spec.routine, spec)]


def library_spec(kernel_mod: tvm.IRModule, device: str = "cpu") -> CallSpec | None:
    """What kernel_mod computes in a form `device`'s library has a routine for (a GEMM; on the
    CPU also a convolution), whether or not that routine applies its epilogue; None else."""
    spec = match_gemm(kernel_mod)
    return match_conv(kernel_mod) if spec is None and device == "cpu" else spec


def epilogue_text(spec: CallSpec) -> str:
    """The epilogue argument of the extension's call: its steps' tokens, space-separated."""
    return " ".join(step.token() for step in spec.epilogue)


def time_call(function_name: str, spec: CallSpec, repeats: int = 7,
              min_repeat_seconds: float = 2e-3, preprocess: str = "") -> float:
    """Median seconds of one call over `repeats` timed runs, each of enough calls to last
    about min_repeat_seconds (the FFI call's microsecond overhead is included, as in the VM).
    With `preprocess` (CPU only: the name of a global function, given every operand, as the
    time evaluator runs one) each run is one call after it: TVM kernels are timed that way,
    from the cache state a model leaves them (costing/cache_state.py).
    cuBLAS calls run on CUDA device 0 and are timed up to a device synchronisation."""
    assert function_name.startswith((BLAS_PREFIX, CUBLAS_PREFIX)), \
        f"not a library call: {function_name}"
    function = tvm.get_global_func(function_name)
    device = tvm.cuda(0) if function_name.startswith(CUBLAS_PREFIX) else tvm.cpu()
    rng = np.random.default_rng(0)
    operand_shapes = [step.shape for step in spec.epilogue if step.input is not None]
    a, b, *operands = (tvm.runtime.tensor(rng.standard_normal(shape, dtype="float32"), device)
                       for shape in [*spec.input_shapes()] + operand_shapes)
    c = tvm.runtime.tensor(np.empty(spec.output_shape(), dtype="float32"), device)
    scalars = spec.scalar_arguments()
    epilogue = (epilogue_text(spec), *operands) if spec.epilogue else ()

    def run(number: int) -> float:
        device.sync()
        start = time.perf_counter()
        for _ in range(number):
            function(a, b, *scalars, *epilogue, c)
        device.sync()
        return (time.perf_counter() - start) / number

    once = max(run(1), 1e-7)                        # warm-up; also sizes the inner loop
    if preprocess and not function_name.startswith(CUBLAS_PREFIX):
        before = tvm.get_global_func(preprocess)

        def run_after() -> float:
            before(0, a, b, *operands, c)  # a leading 0: TVM's flush leaves its first argument
            return run(1)

        return statistics.median(run_after() for _ in range(max(1, repeats)))
    number = max(1, min(1000, int(min_repeat_seconds / once)))
    return statistics.median(run(number) for _ in range(max(1, repeats)))
