"""The schedule an untuned CPU kernel gets: outer loops parallel, innermost loop vectorized.

TIR as legalized runs on one thread, one element at a time. Trial budgets are far below the
number of candidate kernels (SegFormer-b0 has 1250 distinct ones), so most kernels are never
tuned and their default schedule decides both the costs the plan is chosen by and the speed of
the model. This rule inlines every block that can be (padding, a bias add before an
activation: each intermediate that is not a reduction) and gives every block left:

* its spatial loops outside its reduction loops, and the innermost spatial loop split by the
  largest divisor of its extent up to 16 (one AVX-512 register of float32) and moved innermost,
  vectorized: a matmul or convolution then accumulates a vector of neighbouring outputs per
  reduction step (the i-k-j order), an elementwise block reads and writes whole vectors;
* its leading spatial loops fused and run in parallel, as many as give each core at least
  `ITERATIONS_PER_CORE` iterations to balance;
* for vectorized reductions, the initialisation split off into its own loop nest, so the
  reduction loop carries no "first iteration" test.

A kernel the rule cannot handle (dynamic extents, opaque blocks) keeps the form it was written
in. The returned schedule's trace replays on the kernel, so the profiler records the default
measurement under it and applying the log rebuilds exactly the kernel that was measured.
"""

from __future__ import annotations

import logging

import tvm

from .errors import error_summary

logger = logging.getLogger("korch_tvm.cpu_schedule")

MAX_VECTOR_WIDTH = 16  # float32 lanes of AVX-512 (LLVM splits them for AVX2, SSE or NEON)
MIN_VECTOR_WIDTH = 4
ITERATIONS_PER_CORE = 16
DEFAULT_SCHEDULE_ATTR = "korch.default_schedule"  # marks a PrimFunc scheduled by this rule


def default_schedule(kernel_mod: tvm.IRModule, target):
    """The schedule of a standalone kernel (`{"main": PrimFunc}`), or None where the rule
    does not apply (the kernel then runs as written)."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    cores = max(1, int(target.attrs.get("num-cores", 1)))
    schedule = tvm.s_tir.Schedule(kernel_mod)
    try:
        blocks = normalize_prim_func(schedule)
        if blocks is None:
            return None
        _inline_injective(schedule, [block.block_rv for block in blocks])
        blocks = normalize_prim_func(schedule)
        if blocks is None:
            return None
        for block in blocks:
            _schedule_block(schedule, block, cores)
    except Exception as err:  # noqa: BLE001 - a form the rule does not cover runs as written
        logger.debug("no CPU default schedule: %s", error_summary(str(err)))
        return None
    return schedule


def _inline_injective(schedule, blocks) -> None:
    """Inline every block that can be (injective, not an output), until none can."""
    remaining = list(blocks)
    inlined = True
    while inlined:
        inlined = False
        for block in list(remaining):
            try:
                schedule.compute_inline(block)
            except tvm.s_tir.ScheduleError:
                continue
            remaining.remove(block)
            inlined = True


def _schedule_block(schedule, block, cores: int) -> None:
    kinds = [iterator.kind for iterator in block.iters]
    if any(kind not in "SR" for kind in kinds):
        return  # an opaque iterator: loop order is not ours to change
    loops = [iterator.loop_rv for iterator in block.iters]
    spatial = [loop for loop, kind in zip(loops, kinds) if kind == "S"]
    reduction = [loop for loop, kind in zip(loops, kinds) if kind == "R"]
    vector = None
    if spatial:
        width = _vector_width(_extent(schedule, spatial[-1]))
        if width is not None:
            spatial[-1], vector = schedule.split(spatial[-1], [None, width])
    order = spatial + reduction + ([vector] if vector is not None else [])
    if len(order) > 1:
        schedule.reorder(*order)
    parallel, iterations = [], 1
    for loop in spatial:
        extent = _extent(schedule, loop)
        if extent is None:
            break
        parallel.append(loop)
        iterations *= extent
        if iterations >= cores * ITERATIONS_PER_CORE:
            break
    if parallel:
        schedule.parallel(schedule.fuse(*parallel) if len(parallel) > 1 else parallel[0])
    if vector is not None:
        schedule.vectorize(vector)
        if reduction:
            schedule.decompose_reduction(block.block_rv, reduction[0])


def _extent(schedule, loop) -> int | None:
    extent = schedule.get(loop).extent
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else None


def _vector_width(extent: int | None) -> int | None:
    """The largest divisor of `extent` that fits one vector register, if at least 4 (an odd
    width such as 13 or 14 is padded to the register by LLVM)."""
    if not extent:
        return None
    width = next(w for w in range(min(extent, MAX_VECTOR_WIDTH), 0, -1) if extent % w == 0)
    return width if width >= MIN_VECTOR_WIDTH else None


def default_schedule_pass(target) -> tvm.transform.Pass:
    """Give every PrimFunc that no tuning record scheduled the CPU default schedule."""
    from .kernels import schedule_unscheduled

    @tvm.transform.module_pass(opt_level=0, name="KorchCPUDefaultSchedule")
    def _schedule(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return schedule_unscheduled(
            mod, lambda func: default_schedule(tvm.IRModule({"main": func}), target),
            marks=(DEFAULT_SCHEDULE_ATTR,))

    return _schedule
