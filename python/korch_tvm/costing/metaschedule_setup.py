"""Make MetaSchedule usable on a small CPU machine.

Three problems seen with TVM 0.27 on 2 cores (see the cookbook's pitfalls):
* every builder worker imports `tvm.s_tir.tensor_intrin`, which parses TVMScript for every GPU
  backend (~30 s) and races the builder's 30 s time-out, so *all* builds fail;
* the default runner repeats each candidate for at least 100 ms;
* the default task split can give a task zero trials (handled by the caller's per-task cap).

CUDA targets keep the real intrinsics (MetaSchedule's CUDA rules use the tensor-core ones), so
their builder time-out is longer (`CUDA_BUILDER_TIMEOUT`): each worker's first build spends
~30 s on that import on a small machine, and nvcc/NVRTC then compiles every candidate. GPU
candidates are timed warm (no CPU cache flush) with more calls per sample, since kernels take
microseconds. The search space comes from the target: `TuneContext(target=cuda)` with
"post-order-apply" uses MetaSchedule's CUDA schedule rules and postprocessors
(`cuda_schedule_rules` names them, for tests and reports).
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import types

_GPU_INTRIN_MODULES = ("cuda", "rocm", "hexagon", "arm_cpu", "riscv_cpu", "metal")


def skip_gpu_tensor_intrin() -> None:
    """Stand in empty modules for the non-x86 tensor intrinsics (CPU targets only).

    Must run in the main process before a TuneContext exists, and is passed to LocalBuilder as
    its worker `initializer` (the worker imports this module by name, so it must be importable).
    """
    for name in _GPU_INTRIN_MODULES:
        full = f"tvm.s_tir.tensor_intrin.{name}"
        sys.modules.setdefault(full, types.ModuleType(full))


def quiet_builder_pool() -> None:
    """A builder worker's TVM pool sleeps at once after parallel work instead of spinning.

    The builders finish a batch right before the runner times it on the same cores, and pool
    threads spinning there (support/pool_spin.py) took a core from the timed kernel: an
    add + ReLU of 3-8 us timed at 1.4-8 ms (a scheduler slice or two) in 10 of 24 cold compiles
    of a one-GEMM model, in none of 6 with the builders' pools quiet. A build waits on no
    parallel region, so nothing is lost. Run before the worker's pool exists (its initializer):
    the pool reads the spin count when made."""
    os.environ["TVM_THREAD_POOL_SPIN_COUNT"] = "0"


def cpu_builder_worker() -> None:
    """A CPU builder worker's initializer: `skip_gpu_tensor_intrin`, `quiet_builder_pool`."""
    skip_gpu_tensor_intrin()
    quiet_builder_pool()


def prepare_for_target(target) -> None:
    """Apply the CPU-only shortcut when tuning for a CPU; CUDA tuning needs the real intrinsics."""
    if target.kind.name == "llvm":
        skip_gpu_tensor_intrin()


def export_into(directory: str | None, mod, linked: bool = False) -> str:
    """Export a built kernel for the runner into a new folder under `directory`.

    MetaSchedule's `default_export` writes every candidate to `tempfile.mkdtemp()/tvm_tmp_mod.tar`
    and the runner compiles it to a `.so` beside it; nothing removes either. Exporting into the
    costing session's scratch folder (costing/session.py) lets the session remove them all at
    its end, without changing the temporary folder of the compiling process. Runs only in a
    builder's worker processes, whose temporary folder becomes `directory` (None: unchanged).

    `linked`: link the kernel into a shared library here, for a runner on this machine. The
    runner's one worker would otherwise call the C compiler for every schedule, one after
    another (26 of its 33 ms per DenseNet-121 schedule), while the builders' workers link side
    by side. A remote runner gets the archive, linked there by its own toolchain.
    """
    from tvm.s_tir.meta_schedule.builder.local_builder import default_export

    if directory is not None:
        tempfile.tempdir = directory  # this worker's own: a worker builds for one session
    if not linked:
        return default_export(mod)
    path = os.path.join(tempfile.mkdtemp(), "kernel.so")
    mod.export_library(path)
    return path


CPU_BUILDER_TIMEOUT = 60.0
CUDA_BUILDER_TIMEOUT = 180.0


def builder_worker_settings(target, timeout_sec: float | None = None):
    """(worker initializer, build time-out in seconds) of a builder for `target`: every worker's
    pool stays quiet (`quiet_builder_pool`), CPU workers skip the GPU tensor intrinsics; CUDA
    builds get the longer time-out."""
    is_cpu = target.kind.name == "llvm"
    if timeout_sec is None:
        timeout_sec = CPU_BUILDER_TIMEOUT if is_cpu else CUDA_BUILDER_TIMEOUT
    return (cpu_builder_worker if is_cpu else quiet_builder_pool), timeout_sec


def local_builder(target, max_workers: int | None = None, timeout_sec: float | None = None,
                  scratch: str | None = None, linked: bool = False):
    """A LocalBuilder for `target` whose workers start quickly (see `skip_gpu_tensor_intrin`):
    `max_workers` build processes (None: MetaSchedule's choice), a build time-out of
    `timeout_sec` (None: per target), candidates exported under `scratch` (`export_into`),
    linked for this machine when `linked`."""
    from tvm.s_tir import meta_schedule as ms

    initializer, timeout_sec = builder_worker_settings(target, timeout_sec)
    return ms.builder.LocalBuilder(
        max_workers=max_workers, timeout_sec=timeout_sec, initializer=initializer,
        f_export=(None if scratch is None and not linked
                  else functools.partial(export_into, scratch, linked=linked)),
    )


# Timed samples per measurement on every target; a CPU record with fewer was timed the old way
# (see evaluator_config; `TuningLog` warns about such records).
SAMPLES = 3


def evaluator_config(number: int = 1, repeat: int = SAMPLES, enable_cpu_cache_flush: bool = False):
    """Runner settings: a few calls per candidate instead of the default 100 ms minimum.

    `enable_cpu_cache_flush=True` times kernels with cold caches, closer to how they run inside
    a model where the previous kernel evicted their inputs. TVM's time evaluator flushes once
    per *repeat* and then times `number` calls back to back, so the default is one call per
    sample, three samples: every timed call starts cold. With several calls per sample the
    later ones find the weights warm, and small and mid-sized kernels look faster than they
    run among other kernels (bench/results/HISTORY.md has the measurements).
    `number` calls per sample, `repeat` samples.
    """
    from tvm.s_tir import meta_schedule as ms

    return ms.runner.EvaluatorConfig(
        number=number, repeat=repeat, min_repeat_ms=0, enable_cpu_cache_flush=enable_cpu_cache_flush
    )


def search_strategy(population: int = 64):
    """Evolutionary search sized for tens of trials per task, not thousands."""
    from tvm.s_tir import meta_schedule as ms

    return ms.search_strategy.EvolutionarySearch(
        population_size=population, init_min_unmeasured=16, genetic_num_iters=1
    )


def evaluator_for_target(target, *, cache_flush: bool | None = None):
    """Runner settings per target: CPU 3 cold calls, timed one by one; CUDA 10 warm calls x 3
    samples.

    A GPU kernel takes microseconds and the device has no CPU cache to flush, so more calls per
    sample give a stable number at negligible cost (the time evaluator syncs the stream).
    """
    if target.kind.name == "cuda":
        return evaluator_config(number=10, repeat=SAMPLES, enable_cpu_cache_flush=False)
    flush = True if cache_flush is None else cache_flush
    return evaluator_config(enable_cpu_cache_flush=flush)


def cuda_schedule_rules() -> list[str]:
    """Type names of MetaSchedule's CUDA schedule rules (what tuning for `cuda` searches with)."""
    from tvm.s_tir import meta_schedule as ms

    return [type(rule).__name__ for rule in ms.ScheduleRule.create("cuda")]
