"""Default-schedule measurements built into shared libraries of several kernels each.

Built and linked alone, a kernel paid the fixed costs of a library each time: LLVM's set-up and
code generation of a module, and the C compiler's link. On Swin-T's kernels that was most of a
build (about 100 ms a kernel, a third of that built eight to a library:
bench/results/compile-time/kernel-libraries/), and default-schedule builds were a third of a
cold compile. So where kernels run on this machine (the builder links them,
`runners.links_here`), the builder's workers build `LIBRARY_KERNELS` kernels into one library
(`build_library_job`) and each kernel's artifact names its library and symbol (`entry`); the
runner then times every kernel of a library from one load (`run_kernels`), in MetaSchedule's
LocalRunner's own worker, with its settings. A library that fails to build is built again a
kernel at a time, so that an error stays the kernel's own; a library whose timing fails as a
whole (a crash, a time-out) has its kernels timed one by one.
"""

from __future__ import annotations

import os
import tempfile
from collections import defaultdict

from .cache_state import timed_samples
from .runners import runner_cache_state

LIBRARY_KERNELS = 8
_SEPARATOR = "::"  # between a library's path and a kernel's symbol in an artifact


def entry(path: str, symbol: str) -> str:
    """The artifact of one kernel in a library."""
    return f"{path}{_SEPARATOR}{symbol}"


def split_entry(artifact: str) -> tuple[str, str] | None:
    """(library path, symbol) of an `entry`; None for an artifact of its own (one kernel)."""
    path, separator, symbol = artifact.rpartition(_SEPARATOR)
    return (path, symbol) if separator and path else None


def library_groups(items: list, workers: int) -> list[list]:
    """`items` cut into libraries of at most `LIBRARY_KERNELS`, in order, at least one per
    worker while there are items for it: a lazy round's few kernels still build side by side."""
    count = min(len(items), max(workers, -(-len(items) // LIBRARY_KERNELS)))
    size, extra = divmod(len(items), count) if count else (0, 0)
    groups, start = [], 0
    for index in range(count):
        end = start + size + (index < extra)
        groups.append(items[start:end])
        start = end
    return groups


def build_library_job(mods: list, target, scratch: str | None) -> list:
    """Worker side: [(artifact, None) or (None, error)] for the kernels `mods` (each a `main`
    PrimFunc), built into one shared library under `scratch`, else each into its own. The
    worker's temporary files go under `scratch` too (a worker builds for one session)."""
    if scratch is not None:
        tempfile.tempdir = scratch
    if len(mods) > 1:
        try:
            return [(artifact, None) for artifact in _build_library(mods, target, scratch)]
        except Exception:  # noqa: BLE001 - one kernel's error: found below, kernel by kernel
            pass
    outcomes = []
    for mod in mods:
        try:
            outcomes.append((_build_library([mod], target, scratch)[0], None))
        except Exception as err:  # noqa: BLE001 - TVM raises its own error types
            outcomes.append((None, f"{type(err).__name__}: {err}"))
    return outcomes


def _build_library(mods: list, target, scratch: str | None) -> list[str]:
    """Build `mods` as MetaSchedule's builder would (weight-layout rewrites left out: the runner
    passes packed weights) into one library; the entries of its kernels, in order."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    symbols = [f"kernel_{i}" for i in range(len(mods))]
    merged = tvm.IRModule({symbol: mod["main"].with_attr("global_symbol", symbol)
                           for symbol, mod in zip(symbols, mods)})
    merged = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(merged)
    built = tvm.compile(merged, target=target)
    folder = tempfile.mkdtemp(dir=scratch)
    path = os.path.join(folder, "kernels.so")
    built.export_library(path)
    return [entry(path, symbol) for symbol in symbols]


def run_kernels(runner, inputs: list) -> list:
    """A future per RunnerInput, in order: kernels of one library timed from one load in the
    worker pool of `runner` (a LocalRunner), artifacts of their own by `runner.run`, as is
    everything for a runner with no such pool (one that stands in for it)."""
    splits = [split_entry(str(item.artifact_path)) for item in inputs]
    if not hasattr(runner, "pool") or not any(splits):
        return runner.run(inputs)
    futures: list = [None] * len(inputs)
    by_library = defaultdict(list)
    for position, (item, split) in enumerate(zip(inputs, splits)):
        if split is None:
            (futures[position],) = runner.run([item])
        else:
            by_library[split[0]].append((position, split[1], item))
    for path, kernels in by_library.items():
        for (position, _, _), future in zip(kernels, _time_library(runner, path, kernels)):
            futures[position] = future
    return futures


def _time_library(runner, path: str, kernels: list) -> list:
    """Futures of the `kernels` [(position, symbol, RunnerInput)] of the library at `path`."""
    from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture

    try:
        outcomes = _timed(runner, path, [(symbol, item) for _, symbol, item in kernels])
    except Exception:  # noqa: BLE001 - a crash or a time-out: each kernel timed alone
        return [_time_alone(runner, path, symbol, item) for _, symbol, item in kernels]
    return [LocalRunnerFuture(res=costs, error_message=error) for costs, error in outcomes]


def _time_alone(runner, path: str, symbol: str, item):
    """One kernel of a library timed in a job of its own (its error, or time-out, its own)."""
    from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture

    try:
        ((costs, error),) = _timed(runner, path, [(symbol, item)])
    except TimeoutError:
        return LocalRunnerFuture(
            res=None, error_message=f"LocalRunner: Timeout, killed after {runner.timeout_sec} "
                                    "seconds")
    except Exception as err:  # noqa: BLE001 - the worker's crash is this kernel's
        return LocalRunnerFuture(res=None, error_message=f"run failed: {err}")
    return LocalRunnerFuture(res=costs, error_message=error)


def _timed(runner, path: str, kernels: list) -> list:
    """`time_library_job`'s answer for [(symbol, RunnerInput)] of one library, timed in the
    runner's worker; raises what the job raised (a time-out, the worker's crash)."""
    job = runner.pool.submit(
        time_library_job, runner.f_alloc_argument, runner.evaluator_config,
        runner_cache_state(runner), runner.alloc_repeat, path, str(kernels[0][1].device_type),
        [(symbol, tuple(info.as_json() for info in item.args_info)) for symbol, item in kernels])
    return job.result()


def time_library_job(alloc_argument, evaluator_config, cache_state: str, alloc_repeat: int,
                     path: str, device_type: str, kernels: list) -> list:
    """Runner-worker side: [(seconds per sample, None) or (None, error)] for each (symbol,
    argument infos) of `kernels`, timed as MetaSchedule's LocalRunner times an entry
    function, each timed call from `cache_state` (costing/cache_state.py)."""
    import tvm
    from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument
    from tvm.s_tir.meta_schedule.utils import get_global_func_with_default_on_worker

    alloc_argument = get_global_func_with_default_on_worker(alloc_argument,
                                                            default_alloc_argument)
    library = tvm.runtime.load_module(path)
    device = tvm.runtime.device(device_type, 0)
    outcomes = []
    for symbol, args_info in kernels:
        try:
            repeated_args = alloc_argument(device, args_info, alloc_repeat)
            outcomes.append((timed_samples(library, symbol, device, evaluator_config,
                                           cache_state, repeated_args), None))
        except Exception as err:  # noqa: BLE001 - TVM raises its own error types
            outcomes.append((None, f"{type(err).__name__}: {err}"))
    return outcomes
