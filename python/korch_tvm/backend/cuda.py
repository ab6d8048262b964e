"""The CUDA target up to (and, where a GPU is present, including) running the code.

What this module settles for the rest of the package:

* **Is there a device?** `device_present(target)`: the CPU always; CUDA only when TVM's CUDA
  runtime is loaded *and* `tvm.cuda(0).exist`. Without one, kernels cannot be measured, so the
  profiler costs them by prediction and the compile stops before running the model.
* **Default GPU schedules.** Unscheduled TIR cannot be built for CUDA (it has no thread
  bindings). A kernel without a tuning record gets the schedule TVM's own CUDA pipeline would
  give it: the dlight rules (matmul, GEMV, reductions, fallback). `default_schedule` returns it
  as an `s_tir.Schedule`, whose trace replays exactly, so the profiler records the default
  measurement under that trace and applying the log later reproduces the measured kernel.
* **The build pipeline.** `relax.get_default_pipeline(cuda)` runs FuseOps/FuseTIR again, which
  would re-fuse Korch's chosen kernels (and lose their tuned schedules). `relax_pipeline`
  is that pipeline without the two fusion passes, with dlight plus `DefaultGPUSchedule` as
  the safety net for whatever is still unscheduled. The stock path fused already, so it uses
  the same pipeline.
* **Device code without a device.** The apache-tvm wheel links its CUDA runtime against
  libcudart.so.13 and the driver's libcuda.so.1; where these are missing, `tvm.compile` emits
  the CUDA source but does not compile it. `check_device_code` then compiles that source with
  the machine's nvcc (sm_XX of the target) so a broken kernel is caught before any GPU is
  involved, and says in one line how far it got.
"""

from __future__ import annotations

import logging
import os
import shutil

import tvm
from tvm import relax

from ..errors import KorchError, error_summary

logger = logging.getLogger("korch_tvm.cuda")


# --------------------------------------------------------------------- device and toolchain
def is_cuda(target) -> bool:
    return target.kind.name == "cuda"


def cuda_runtime_loaded() -> bool:
    """TVM's CUDA runtime library loaded (it needs libcudart.so.13 and the driver's libcuda)."""
    try:
        return bool(tvm.runtime.enabled("cuda"))
    except Exception:  # noqa: BLE001
        return False


def cuda_device_present() -> bool:
    if not cuda_runtime_loaded():
        return False
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - a broken driver reads as "no device"
        return False


def device_present(target) -> bool:
    """Whether code built for `target` can run on this machine."""
    return cuda_device_present() if is_cuda(target) else True


def no_device_reason(target) -> str | None:
    """One line saying why kernels for `target` cannot run here, or None when they can."""
    if not is_cuda(target) or cuda_device_present():
        return None
    if not cuda_runtime_loaded():
        return ("no CUDA device: TVM's CUDA runtime is not loaded (it needs the NVIDIA driver's "
                "libcuda.so.1 and libcudart.so.13)")
    return "no CUDA device: tvm.cuda(0) does not exist"


def nvcc_path() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


def nvrtc_available() -> bool:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError, or a broken CUDA install
        return False
    return True


def cuda_compiler() -> str | None:
    """The compiler TVM will use for CUDA source: 'nvrtc', 'nvcc' or None (neither found).

    TVM defaults to NVRTC (through the cuda-bindings package); where that is missing but nvcc
    is on the machine, TVM_CUDA_COMPILE_MODE is set to nvcc so that builds still work.
    """
    mode = os.environ.get("TVM_CUDA_COMPILE_MODE", "").lower()
    if mode == "nvcc":
        return "nvcc" if nvcc_path() else None
    if nvrtc_available():
        return "nvrtc"
    if nvcc_path():
        os.environ["TVM_CUDA_COMPILE_MODE"] = "nvcc"
        return "nvcc"
    return None


# --------------------------------------------------------------------- default schedules
def dlight_rules():
    """The rules of TVM's CUDA pipeline (relax.backend.cuda.legalize_passes), in its order."""
    from tvm.s_tir import dlight as dl

    return [dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(),
            dl.gpu.Fallback()]


def default_schedule(kernel_mod: tvm.IRModule, target):
    """The dlight schedule of a standalone kernel (`{"main": PrimFunc}`), or None.

    The returned `s_tir.Schedule` has a trace that replays on `kernel_mod` to the same module,
    so it can be stored in the tuning log as the kernel's default-schedule record.
    """
    return _dlight_schedule(kernel_mod["main"], target)


def _dlight_schedule(func, target):
    """First dlight rule that schedules `func`. Unlike dlight's own ApplyDefaultSchedule, a rule
    that raises (dlight's GEMV and Matmul assert on some fused kernels Korch forms) is skipped
    instead of failing the build."""
    with target:
        for rule in dlight_rules():
            try:
                space = rule.apply(func, target, False)
            except Exception as err:  # noqa: BLE001 - a rule that cannot handle it: next one
                logger.debug("dlight %s failed: %s", type(rule).__name__, error_summary(str(err)))
                continue
            if space is None:
                continue
            return space[0] if isinstance(space, list) else space
    return None


def default_schedule_pass(target) -> tvm.transform.Pass:
    """Schedule every PrimFunc not yet scheduled: dlight first, thread binding as the last resort."""
    from ..kernels.fused import schedule_unscheduled

    @tvm.transform.module_pass(opt_level=0, name="KorchDlightSchedule")
    def _dlight(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return schedule_unscheduled(mod, lambda func: _dlight_schedule(func, target))

    return tvm.transform.Sequential([_dlight, tvm.s_tir.transform.DefaultGPUSchedule()],
                                    name="KorchDefaultGPUSchedule")


def relax_pipeline(target):
    """The Relax pipeline `tvm.compile` should run for `target` on an already fused module.

    CPU: "default" (TVM's generic pipeline does not fuse). CUDA: TVM's CUDA pipeline minus
    FuseOps/FuseTIR, so the kernels that were planned and tuned are the kernels that are built.
    """
    if not is_cuda(target):
        return "default"
    from tvm.relax.backend.cuda import pipeline as cuda_pipeline

    @tvm.transform.module_pass(opt_level=0, name="KorchCUDAPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(
                cuda_pipeline.library_dispatch_passes(target)
                + [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                   relax.transform.FoldConstant(), default_schedule_pass(target)]
                + cuda_pipeline.dataflow_lower_passes(target)
                + cuda_pipeline.finalize_passes(target)
            )(mod)

    return _pipeline


def build(mod: tvm.IRModule, target):
    """`tvm.compile` with the pipeline above; a missing CUDA compiler is one clear error."""
    if is_cuda(target) and cuda_runtime_loaded():
        cuda_compiler()  # falls back to nvcc where NVRTC is missing
    try:
        return tvm.compile(mod, target=target, relax_pipeline=relax_pipeline(target))
    except Exception as err:  # noqa: BLE001
        text = str(err)
        if is_cuda(target) and ("nvrtc" in text.lower() or "nvcc" in text.lower()):
            raise KorchError("cannot compile the CUDA kernels: " + error_summary(text) +
                             " (install cuda-bindings for NVRTC, or put nvcc on PATH)") from None
        raise


# --------------------------------------------------------------------- device code check
def cuda_source(executable) -> str | None:
    """The generated CUDA C++ of a built executable (None when it holds no CUDA module)."""
    pending = [executable.mod]
    while pending:
        module = pending.pop()
        if module.kind == "cuda":
            try:
                return module.inspect_source()
            except Exception:  # noqa: BLE001 - a compiled module may not keep its source
                return None
        pending += list(module.imports)
    return None


def check_device_code(executable, target) -> dict:
    """How far the device code got, for the report: {"stage": ..., "message": ...}.

    stage is "loaded" (CUDA runtime present: TVM compiled the kernels itself), "compiled" (no
    runtime, but nvcc compiled the generated source for the target's arch), "source" (neither
    runtime nor nvcc: stopped after code generation) or "not-cuda".
    """
    if not is_cuda(target):
        return {"stage": "not-cuda", "message": "CPU target"}
    if cuda_runtime_loaded():
        return {"stage": "loaded",
                "message": f"kernels compiled by TVM ({cuda_compiler() or 'unknown compiler'})"}
    source = cuda_source(executable)
    kernels = source.count("__global__") if source else 0
    if source is None:
        return {"stage": "source", "message": "no CUDA module in the executable"}
    nvcc = nvcc_path()
    if nvcc is None:
        return {"stage": "source", "kernels": kernels,
                "message": f"stopped after CUDA code generation ({kernels} kernels): no CUDA "
                           "runtime and no nvcc on this machine"}
    from tvm.support import nvcc as tvm_nvcc

    arch = str(target.attrs.get("arch", "sm_90"))
    os.environ.setdefault("PATH", "")
    if os.path.dirname(nvcc) not in os.environ["PATH"].split(os.pathsep):
        os.environ["PATH"] = os.path.dirname(nvcc) + os.pathsep + os.environ["PATH"]
    try:
        suffix = arch[3:] if arch.startswith("sm_") else arch
        with target:  # compile_cuda also reads the arch from the current target
            binary = tvm_nvcc.compile_cuda(
                source, target_format="cubin", compiler="nvcc",
                arch=["-gencode", f"arch=compute_{suffix},code=sm_{suffix}"])
    except Exception as err:  # noqa: BLE001
        raise KorchError(f"nvcc rejects the generated CUDA code for {arch}: "
                         + error_summary(str(err))) from None
    return {"stage": "compiled", "kernels": kernels, "cubin_bytes": len(binary),
            "message": f"{kernels} kernels compiled by nvcc for {arch}; not run: "
                       + (no_device_reason(target) or "")}
