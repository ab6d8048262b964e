"""The schedule an untuned CPU kernel gets: outer loops parallel, innermost loop vectorized,
reductions accumulated in registers.

TIR as legalized runs on one thread, one element at a time. Trial budgets are far below the
number of distinct candidate kernels, so most kernels are never tuned and their default
schedule decides both the costs the plan is chosen by and the speed of the model. This rule
inlines every intermediate that is not a reduction (a bias add before an activation), but
the padding of a compute-bound convolution (`kept_padding.py`), and gives every block left:

* its spatial loops outside its reduction loops, and the innermost spatial loop split by the
  largest divisor of its extent up to 16 (one AVX-512 register of float32) and moved innermost,
  vectorized: a matmul or convolution then accumulates a vector of neighbouring outputs per
  reduction step (the i-k-j order), an elementwise block reads and writes whole vectors;
* for a vectorized reduction, a register tile: `TILE_ROWS` steps (a divisor of the loop; up to
  `MAX_TILE_ROWS` where only 1-3 divide it; no more than the target's registers hold,
  `tile_shape.py`) of a spatial loop that the vector loads do not depend on are moved
  inside the reduction, unrolled, so each loaded vector feeds that many multiply-adds into
  accumulators held in registers (a local buffer), stored once per tile with the block's
  elementwise consumers (bias, activation) applied (bench/default_schedule.py);
* for a block that writes its largest input transposed, the loop over that input's innermost
  dimension between the vector and its outer loop (`transposed_reads.py`);
* for a reduction along each row's contiguous axis (softmax, layer norm), vector lanes that
  walk the row instead of a vector across rows, and for an elementwise loop that no vector
  width divides (197 tokens), vectors up to a scalar tail (`row_reductions.py`);
* its leading spatial loops fused and run in parallel, as many as give each core at least
  `ITERATIONS_PER_CORE` iterations to balance;
* for vectorized reductions, the initialisation split off into its own loop nest, so the
  reduction loop carries no "first iteration" test;
* every weight the model passes as a constant (`layout_free_buffers`) packed in the order the
  loops read it (`with_packed_weights`), once at compile time.

Before the rule, the per-kind rules of `cpu_rules.py` reshape the blocks the rule would leave
without a vector or a tile (a contraction over 197 tokens is padded to whole tiles);
`kind_rules=False` gives the rule alone (bench/kind_floor.py compares the two).

The rule has variants (`schedule_variants.py`); the log keeps the fastest. A kernel the rule
cannot handle (dynamic extents, opaque blocks) keeps the form it was written in. The returned
schedule's trace replays on the kernel: applying the log rebuilds the kernel that was measured.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import tvm

from ..errors import error_summary
from ..kernels.weight_packing import LAYOUT_FREE_ATTR, read_by_one_block
from .cpu_rules import apply_kind_rules, block_points
from .kept_padding import padding_read_by_reductions
from .partial_sums import partial_sums, sum_in_parts
from .row_reductions import is_row_reduction, reduce_rows, vectorize_with_tail, whole_vectors
from .tile_shape import (AVX512, MAX_TILE_ROWS, TILE_ROWS, RegisterFile, register_file,
                         tile_rows as _tile_rows, tile_width, vector_width as _vector_width)
from .transposed_reads import transposed_loop

logger = logging.getLogger("korch_tvm.cpu_schedule")

ITERATIONS_PER_CORE = 16
# The variants the profiler also measures (`schedule_variants.py`): a register tile of up to 16
# rows (16 of AVX-512's 32 registers as accumulators), and the rule's tile with the vector's
# outer loop outermost, and the rule's form with unpacked weights.
WIDE_TILE_ROWS = 16
# And a tile two vectors wide: each reduction step loads two vectors of the streamed operand and
# broadcasts one value per row, so TILE_ROWS rows make 2 x TILE_ROWS multiply-adds from
# TILE_ROWS + 2 loads instead of TILE_ROWS from TILE_ROWS + 1.
PAIR_COLUMNS = 2
DEFAULT_SCHEDULE_ATTR = "korch.default_schedule"  # marks a PrimFunc scheduled by this rule


def default_schedule(kernel_mod: tvm.IRModule, target, *, register_tiles: bool = True,
                     tile_rows: int = TILE_ROWS, vector_outer: bool = False,
                     pack_weights: bool = True, kind_rules: bool = True, columns: int = 1,
                     untiled_fallback: bool = True, prepared: Prepared | None = None,
                     registers: RegisterFile | None = None):
    """The schedule of a standalone kernel (`{"main": PrimFunc}`), or None where the rule
    does not apply (the kernel then runs as written). A kernel whose register tile the
    schedule primitives refuse gets the rule without it; `register_tiles=False` asks for that
    form directly (bench/default_schedule.py compares the forms). `tile_rows` and
    `vector_outer` and `columns` (vectors per tile row) give the variants of
    `schedule_variants.py`; `pack_weights=False` leaves the weights in the model's layout;
    `kind_rules=False` leaves out the per-kind rules (`cpu_rules.py`: the generic rule alone,
    as bench/kind_floor.py compares); `untiled_fallback=False`: None rather than the form
    without tiles (a variant's untiled form is never the faster one); `prepared`: the kernel's
    `prepare(kernel_mod, kind_rules)`, made once for several forms; `registers`: what tiles
    fit (default: the target CPU's registers, `tile_shape.register_file`)."""
    cores = max(1, int(target.attrs.get("num-cores", 1)))  # parallel loops balanced over
    registers = registers or register_file(target)
    prepared = prepared or prepare(kernel_mod, kind_rules)
    for tiles in ((True, False) if untiled_fallback else (True,)) if register_tiles else (False,):
        try:
            schedule = _scheduled(prepared, cores, tile_rows if tiles else 0, vector_outer,
                                  columns if tiles else 1, registers)
        except Exception as err:  # noqa: BLE001 - a form the rule does not cover
            logger.debug("no CPU default schedule%s: %s", " with register tiles" if tiles else "",
                         error_summary(str(err)))
            continue
        return with_packed_weights(schedule, target) if pack_weights else schedule
    return None


class Prepared(NamedTuple):
    """Where every form of the rule starts: the kernel's schedule with its injective blocks
    inlined and the kind rules applied, and the blocks left; or why the rule does not apply."""

    schedule: object | None
    blocks: list
    error: str | None = None


def prepare(kernel_mod: tvm.IRModule, kind_rules: bool = True) -> Prepared:
    """The steps all forms share, taken once (`Prepared`)."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    try:
        # errors rendered briefly: an inlining the schedule refuses is expected, and rendering
        # the kernel into each message took a sixth of the rule's time
        schedule = tvm.s_tir.Schedule(kernel_mod, error_render_level="fast")
        blocks = normalize_prim_func(schedule)
        if blocks is None:
            raise ValueError("the kernel has blocks dlight cannot normalize")
        _inline_injective(schedule, [block.block_rv for block in blocks])
        blocks = normalize_prim_func(schedule)
        if blocks is None:
            raise ValueError("the kernel has blocks dlight cannot normalize")
        kept = apply_kind_rules(schedule, blocks, _row_loop, _tile_rows, _vector_width,
                                is_row_reduction) if kind_rules else None
        if kept is not None:
            _inline_injective(schedule, [block.block_rv for block in normalize_prim_func(schedule)
                                         if schedule.get(block.block_rv).name_hint not in kept])
            blocks = normalize_prim_func(schedule)
            if blocks is None:
                raise ValueError("the kernel has blocks dlight cannot normalize")
    except Exception as err:  # noqa: BLE001 - a kernel the rule does not cover
        return Prepared(None, [], error_summary(str(err)))
    return Prepared(schedule, blocks)


def _scheduled(prepared: Prepared, cores: int, tile_rows: int, vector_outer: bool = False,
               columns: int = 1, registers: RegisterFile = AVX512):
    """The rule on every block of a copy of `prepared`; `tile_rows` 0: no register tiles;
    `vector_outer`: a tiled block's loops in the order (vector's outer loop, other spatial
    loops); `columns`: vectors per tile row; `registers`: what a tile may hold."""
    if prepared.error is not None:
        raise ValueError(prepared.error)
    schedule = prepared.schedule.copy()  # the same random variables name the same blocks
    for block in prepared.blocks:
        if _still_there(schedule, block.block_rv):  # not written back by a tile before it
            _schedule_block(schedule, block, cores, tile_rows, vector_outer, columns,
                            registers)
    return schedule


def with_packed_weights(schedule, target):
    """The schedule with each layout-free weight (`kernels/weight_packing.py`) stored in the order
    the scheduled loops read it, by MetaSchedule's RewriteLayout postprocessor; unchanged where it
    does not apply.

    A register tile reads one vector of a weight row per reduction step; in the model's layout
    consecutive steps are a whole row apart (3 KB for a 768-wide matmul), so the strip a tile
    streams is scattered over the cache's sets. Packed, it is contiguous. The repacking block
    this adds is moved out of the kernel and run once on the constant weight at compile time
    (`layout.pack_constant_weights`); MetaSchedule's builder leaves it out when measuring.
    """
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.postproc import RewriteLayout

    func = schedule.mod["main"]
    if (func.attrs is None or not list(func.attrs.get(LAYOUT_FREE_ATTR, []))
            or not read_by_one_block(schedule.mod)):  # packed for one reader, wrong for others
        return schedule
    packed = schedule.copy()
    # Marked as postprocessing: MetaSchedule, seeding its search with this record, replays the
    # trace without it and packs the weights of its own candidates itself.
    packed.enter_postproc()
    rewrite = _LAYOUT_REWRITERS.get(str(target))
    if rewrite is None:  # a TuneContext costs about half a second; the postprocessor keeps none
        rewrite = _LAYOUT_REWRITERS[str(target)] = RewriteLayout()
        rewrite._initialize_with_tune_context(ms.TuneContext(schedule.mod, target=target))
    return packed if rewrite.apply(packed) else schedule


_LAYOUT_REWRITERS: dict = {}  # target text -> RewriteLayout initialized for it


def _still_there(schedule, block_rv) -> bool:
    try:
        schedule.get(block_rv)
    except Exception:  # noqa: BLE001 - TVM reports a removed block as a generic error
        return False
    return True


def inline_injective(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with its injective intermediates inlined, as the default schedule starts."""
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    schedule = tvm.s_tir.Schedule(func, error_render_level="fast")
    blocks = normalize_prim_func(schedule)
    if blocks is None:
        return func
    _inline_injective(schedule, [block.block_rv for block in blocks])
    return schedule.mod["main"]


def _inline_injective(schedule, blocks) -> None:
    """Inline every injective block but outputs and kept padding, until none can."""
    kept = padding_read_by_reductions(schedule, blocks)
    remaining = [block for block in blocks if schedule.get(block).name_hint not in kept]
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


def _schedule_block(schedule, block, cores: int, tile_rows: int, vector_outer: bool = False,
                    columns: int = 1, registers: RegisterFile = AVX512) -> None:
    """The rule on one block; `tile_rows` 0: no register tile; `columns` vectors per tile row
    (where the vector's outer loop divides by it), as many rows as `registers` hold."""
    if any(iterator.kind not in "SR" for iterator in block.iters):
        return  # an opaque iterator: loop order is not ours to change
    if (parts := partial_sums(block)) is not None:
        return sum_in_parts(schedule, block, parts)  # hardly any outputs to spread
    if is_row_reduction(schedule, block):
        return reduce_rows(schedule, block)  # along each row, not across rows
    spatial = [iterator.loop_rv for iterator in block.iters if iterator.kind == "S"]
    reduction = [iterator.loop_rv for iterator in block.iters if iterator.kind == "R"]
    vector = None
    row = _row_loop(schedule, block) if tile_rows and reduction else None  # the tile's rows
    if spatial:
        width = _vector_width(_extent(schedule, spatial[-1]))
        if width is not None and row is not None and columns == 1:
            width = tile_width(registers, _extent(schedule, spatial[-1]), width,
                               _extent(schedule, spatial[row]), tile_rows)
        if width is not None:
            spatial[-1], vector = schedule.split(spatial[-1], [None, width])
        elif not reduction and whole_vectors(_extent(schedule, spatial[-1])) is not None:
            _parallel_outer(schedule, spatial[:-1], cores)
            return vectorize_with_tail(schedule, spatial[-1])
    if not reduction and vector is not None and (
            moved := transposed_loop(schedule, block)) is not None:
        spatial = spatial[:moved] + spatial[moved + 1:-1] + [spatial[-1], spatial[moved]]
    tile = []
    if tile_rows and reduction and vector is not None:
        # a row of `columns` vectors only where the vector's outer loop divides by it
        pairs = columns > 1 and (_extent(schedule, spatial[-1]) or 1) % columns == 0
        most = registers.rows_at_most(width, columns if pairs else 1)
        spatial, tile = _register_tile(schedule, spatial, row, tile_rows, most)
        if columns > 1 and tile:
            spatial[-1], pair = _split_columns(schedule, spatial[-1], columns)
            tile += pair
        if vector_outer and tile:
            spatial = [spatial[-1]] + spatial[:-1]
    order = spatial + reduction + tile + ([vector] if vector is not None else [])
    if len(order) > 1:
        schedule.reorder(*order)
    fused, parallel = _parallel_outer(schedule, spatial, cores)
    if vector is None:
        return
    schedule.vectorize(vector)
    if tile:
        for loop in tile:
            schedule.unroll(loop)
        _accumulate_in_registers(schedule, block.block_rv,
                                 spatial[-1] if parallel < len(spatial) else fused)
    if reduction:
        schedule.decompose_reduction(block.block_rv, reduction[0])


def _parallel_outer(schedule, spatial: list, cores: int) -> tuple[object | None, int]:
    """(the parallel loop, how many of `spatial` it fuses): the outermost loops fused and run
    in parallel, as many as give each core at least `ITERATIONS_PER_CORE` iterations."""
    parallel, iterations = [], 1
    for loop in spatial:
        extent = _extent(schedule, loop)
        if extent is None:
            break
        parallel.append(loop)
        iterations *= extent
        if iterations >= cores * ITERATIONS_PER_CORE:
            break
    if not parallel:
        return None, 0
    fused = schedule.fuse(*parallel) if len(parallel) > 1 else parallel[0]
    schedule.parallel(fused)
    return fused, len(parallel)


def _register_tile(schedule, spatial: list, row: int | None, tile_rows: int,
                   most: int = MAX_TILE_ROWS) -> tuple[list, list]:
    """(spatial loops, tile loops): split off `_tile_rows` steps (`most` at most: what the
    registers hold) of `spatial[row]`, a loop the vector loads do not depend on (`_row_loop`),
    so that each vector loaded per reduction step feeds that many multiply-adds (a matmul's
    rows, a convolution's output pixels in NHWC or its output channels in NCHW) and a large
    operand streams through the cache that many times less."""
    rows = 1 if row is None else _tile_rows(_extent(schedule, spatial[row]), tile_rows, most)
    if rows == 1:
        return spatial, []
    spatial = list(spatial)
    spatial[row], row_loop = schedule.split(spatial[row], [None, rows])
    return spatial, [row_loop]


def _split_columns(schedule, vector_outer_loop, columns: int) -> tuple[object, list]:
    """(the loop left outside, [the `columns` vectors of a tile row]), or the loop unchanged
    and [] where its extent does not divide by `columns`."""
    extent = _extent(schedule, vector_outer_loop)
    if not extent or extent % columns:
        return vector_outer_loop, []
    outer, inner = schedule.split(vector_outer_loop, [None, columns])
    return outer, [inner]


def _row_loop(schedule, block) -> int | None:
    """Position, among the block's spatial loops, of the innermost one (other than the
    vectorized last) that no input read along the vector depends on; else the one just
    outside the vector."""
    spatial = [str(iterator.var) for iterator in block.iters if iterator.kind == "S"]
    if len(spatial) < 2:
        return None
    sblock = schedule.get(block.block_rv)
    written = [region.source for region in sblock.writes]
    streamed = [used for used in (_vars_used(region) for region in sblock.reads
                                  if not any(region.source.same_as(w) for w in written))
                if spatial[-1] in used]
    reused = [i for i, var in enumerate(spatial[:-1]) if not any(var in used for used in streamed)]
    return reused[-1] if reused else len(spatial) - 2


def _vars_used(region) -> set[str]:
    return {str(var) for extent in region.region
            for var in tvm.tirx.analysis.undefined_vars(extent.min)}


def _accumulate_in_registers(schedule, block_rv, anchor) -> None:
    """Accumulate a tile in a local buffer, which LLVM keeps in registers, and store it once,
    with the block's elementwise consumers (bias, activation) applied on the way out."""
    write_back = schedule.cache_write(block_rv, 0, "local")
    consumers = schedule.get_consumers(write_back)
    # A sole reader only: taken into the write-back, one of several would leave the others
    # reading a buffer nothing writes. A reader over fewer points is the valid part of a padded
    # tile (cpu_rules.py): inlined, it would not be.
    if len(consumers) == 1 and (block_points(schedule.get(consumers[0]))
                                == block_points(schedule.get(write_back))):
        try:
            schedule.reverse_compute_inline(consumers[0])
        except tvm.s_tir.ScheduleError:
            pass
    schedule.reverse_compute_at(write_back, anchor)
    schedule.vectorize(schedule.get_loops(write_back)[-1])


def _extent(schedule, loop) -> int | None:
    extent = schedule.get(loop).extent
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else None


def default_schedule_pass(target) -> tvm.transform.Pass:
    """Give every PrimFunc that no tuning record scheduled the CPU default schedule."""
    from ..kernels.fused import schedule_unscheduled

    @tvm.transform.module_pass(opt_level=0, name="KorchCPUDefaultSchedule")
    def _schedule(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return schedule_unscheduled(
            mod, lambda func: default_schedule(tvm.IRModule({"main": func}), target),
            marks=(DEFAULT_SCHEDULE_ATTR,))

    return _schedule
