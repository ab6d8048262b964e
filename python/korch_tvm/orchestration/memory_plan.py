"""How much activation storage Relax will allocate for a plan, and keeping it within the stock's.

Relax's static memory planner gives each intermediate tensor a storage block, reusing the
blocks of dead tensors greedily in program order: it takes the smallest free block at least as
large as the request, else the largest smaller one (which it grows), looking only within a
factor of 16 of the requested size. So what it allocates depends on the order of requests, not
only on how many bytes are live at once: two kernels where the stock plan runs one can leave an
extra block in the pool, which later tensors then grow. The check here replays that planner
over the whole plan; on the models checked it matches the built module's storage within 1 kB.

Kernels also keep memory of their own: an intermediate their schedule cannot compute tile by
tile (a convolution read by a concatenation, which spans more channels) is stored whole, taken per
call from TVM's workspace pool, which keeps its largest size for the life of the process. A
plan with less activation storage than stock's can so still peak higher, and the check counts
storage plus the largest kernel workspace.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import tvm
from tvm.relax.analysis import has_reshape_pattern

from ..backend.cpu_schedule import inline_injective
from ..graph.alternatives import class_map, in_classes
from ..lowering.primitive_kinds import LAYOUT
from ..support.memo import KeyedMemo
from ..support.toposort import ordered_topologically
from .solver import Plan, execution_order

logger = logging.getLogger(__name__)

# Relax reuses a free block only within this factor of the requested size (static planner).
_MATCH_RANGE = 16

# Storage this much above the stock plan's still counts as "no more": a few kilobytes are not
# worth a slower piece.
STORAGE_SLACK = 0.01


@dataclass(frozen=True)
class Step:
    """One kernel as the planner sees it."""

    inputs: frozenset[int]  # primitives it reads
    outputs: frozenset[int]  # primitives it stores
    view: bool = False  # a reshape of its one input: stores nothing of its own
    first: int = 0  # its earliest binding in the model: the rewrite emits kernels by it
    kernel: str | None = None  # its kernel's key, whose workspace is read when needed
    workspace: int | None = None  # bytes of its own (None: from `kernel`)


def node_bytes(graph) -> tuple[int, ...]:
    """Bytes of each primitive's outputs; () when a shape is symbolic (no memory accounting)."""
    sizes = tuple(node.out_bytes for node in graph.nodes)
    return () if None in sizes else sizes


def planned_storage_bytes(steps: Sequence[Step], sizes: Sequence[int],
                          graph_outputs: frozenset[int]) -> int:
    """Total bytes of the storage blocks the greedy planner allocates for `steps` in order.

    Graph outputs get their own allocations outside the plan, so they take no block; a view
    shares its input's block, which is free again only when neither is read any more.
    """
    last_read = {}
    for position, step in enumerate(steps):
        for node in step.inputs:
            last_read[node] = position
    free: list[tuple[int, int]] = []  # (size, block id), sorted
    blocks: list[int] = []
    holders: list[int] = []  # per block: how many live primitives it holds
    held: dict[int, int] = {}  # primitive -> block id
    for position, step in enumerate(steps):
        for node in sorted(step.outputs - graph_outputs):
            if node in held:
                continue
            source = next(iter(step.inputs)) if step.view else None
            if source in held:
                held[node] = held[source]
            else:
                held[node] = _request(free, blocks, holders, sizes[node])
            holders[held[node]] += 1
        for node in sorted(step.inputs | step.outputs):
            if node in held and last_read.get(node, position) <= position:
                block = held.pop(node)
                holders[block] -= 1
                if not holders[block]:
                    bisect.insort(free, (blocks[block], block))
    return sum(blocks)


def _request(free: list[tuple[int, int]], blocks: list[int], holders: list[int], size: int) -> int:
    """A block for `size` bytes: reused (grown if needed) from `free`, or a new one."""
    sizes = [block_size for block_size, _ in free]
    lowest = bisect.bisect_left(sizes, size / _MATCH_RANGE)
    fitting = bisect.bisect_left(sizes, size)
    highest = bisect.bisect_right(sizes, size * _MATCH_RANGE)
    if fitting < highest:
        return free.pop(fitting)[1]
    if fitting > lowest:
        block = free.pop(fitting - 1)[1]
        blocks[block] = size
        return block
    blocks.append(size)
    holders.append(0)
    return len(blocks) - 1


@dataclass(frozen=True)
class StorageModel:
    """What the planner needs to know about a model's candidates."""

    sizes: tuple[int, ...]  # bytes of each primitive's outputs
    graph_outputs: frozenset[int]
    steps: tuple[Step, ...]  # per candidate
    kernel_modules: Mapping[str, tvm.IRModule] = field(default_factory=dict, compare=False)
    # workspace bytes by kernel key, asked for on every storage check of the memory loop
    workspaces: KeyedMemo[int] = field(default_factory=KeyedMemo, compare=False, repr=False)

    @staticmethod
    def of(graph, candidates, kernel_keys, kernel_modules) -> StorageModel | None:
        """None when a tensor size is unknown (symbolic shapes): no storage accounting.

        A candidate is a view when TVM would rewrite its kernel into a reshape
        (RewriteDataflowReshape, by the same analysis): in the NHWC layout a transpose, reshape,
        transpose chain can be one.
        """
        sizes = node_bytes(graph)
        if not sizes:
            return None
        steps = []
        classes = class_map(graph.alternatives)
        reshapes: dict[str, bool] = {}  # per kernel key: candidates share kernels
        for candidate, key in zip(candidates, kernel_keys):
            view = (key is not None and len(candidate.inputs) == 1 and len(candidate.outputs) == 1
                    and all(graph.nodes[n].kind == LAYOUT for n in candidate.nodes))
            if view:
                if key not in reshapes:
                    reshapes[key] = _is_reshape(kernel_modules[key]["main"])
                view = reshapes[key]
            first = min((position for n in candidate.nodes for position in graph.nodes[n].bindings),
                        default=min(candidate.nodes))
            steps.append(Step(in_classes(candidate.inputs, classes),  # as the program sees them
                              in_classes(candidate.outputs, classes), view, first, key))
        return StorageModel(sizes, frozenset(graph.outputs), tuple(steps), kernel_modules)

    def storage_bytes(self, subproblems, orders: Sequence[Sequence[int]]) -> int:
        """`planned_storage_bytes` of the pieces' kernels in the order the rewrite emits them:
        topological, earliest binding first (kernels.build_partition_module), which is not the
        plan's own order."""
        steps = self._steps(subproblems, orders)
        source: dict[int, int] = {}  # primitive -> first kernel storing it, as the rewrite reads
        for position, step in enumerate(steps):
            for node in step.outputs:
                source.setdefault(node, position)
        needs = [{source[n] for n in step.inputs if n in source} - {position}
                 for position, step in enumerate(steps)]
        emitted = ordered_topologically(needs, [step.first for step in steps])
        return planned_storage_bytes([steps[i] for i in emitted], self.sizes, self.graph_outputs)

    def workspace_bytes(self, subproblems, orders: Sequence[Sequence[int]]) -> int:
        """The largest kernel workspace of the pieces' kernels: what the pool keeps."""
        return max((self._workspace(step) for step in self._steps(subproblems, orders)),
                   default=0)

    def _steps(self, subproblems, orders) -> list[Step]:
        return [self.steps[s.candidate_ids[k]] for s, order in zip(subproblems, orders)
                for k in order]

    def _workspace(self, step: Step) -> int:
        if step.workspace is not None:
            return step.workspace
        if step.kernel is None or step.kernel not in self.kernel_modules:
            return 0
        return self.workspaces.get(step.kernel, lambda: kernel_workspace_bytes(
            self.kernel_modules[step.kernel]["main"]))

    def report(self, subproblems, plans: Sequence[Plan]) -> dict:
        """Megabytes of storage and of the largest kernel workspace for this plan and the
        stock plan, and the pieces on their stock plan."""
        orders = [plan.chosen for plan in plans]
        stock = stock_orders(subproblems)
        return {"korch": _mb(self.storage_bytes(subproblems, orders)),
                "stock": None if stock is None else _mb(self.storage_bytes(subproblems, stock)),
                "korch_workspace": _mb(self.workspace_bytes(subproblems, orders)),
                "stock_workspace": (None if stock is None
                                    else _mb(self.workspace_bytes(subproblems, stock))),
                "pieces_on_stock_plan": sum(plan.status == "memory_limited" for plan in plans)}

    def cheapest_within_stock(self, solve: Callable[..., tuple[list, list[Plan]]]
                              ) -> tuple[list, list[Plan]]:
        """(subproblems, plans) needing no more memory than the stock plan, the cheaper of two
        ways: solving again without the kernels `left_out_for_memory` names until none is
        left, or putting pieces back whole on their stock plans (`within_stock`), where that
        alone fits. Leaving kernels out keeps most of a piece's gains but narrows every later
        solve too, so either can be the cheaper.

        `solve(left_out)` solves every piece without the candidates `left_out`.
        """
        problems, plans = solve()
        options = []
        reverted = self.within_stock(problems, plans)
        if not self.left_out_for_memory(problems, reverted):
            options.append((problems, reverted))
        left_out: set[int] = set()
        while more := self.left_out_for_memory(problems, plans):
            left_out |= more  # each round adds a candidate at least: this ends
            problems, plans = solve(frozenset(left_out))
        options.append((problems, self.within_stock(problems, plans)))
        if left_out:
            logger.debug("%d kernels left out so that the plan needs no more memory than the "
                         "stock plan", len(left_out))
        return min(options, key=lambda option: sum(plan.objective for plan in option[1]))

    def left_out_for_memory(self, subproblems, plans: Sequence[Plan]) -> set[int]:
        """Candidates (global ids; never a stock group) the plan should do without to need no
        more memory than the stock plan; empty when it needs no more, or when only putting a
        piece back on its stock plan (`within_stock`) can help.

        Storage above the stock plan's: the chosen kernels of the piece whose stock plan would
        bring it lowest, so that the piece is solved again without them (its stock plan gives
        up all of its gains, another plan few of them). Storage within it: the kernels whose
        workspace is larger than both the stock plan's largest and the room the stock plan's
        storage plus workspace leaves beside this plan's storage.
        """
        stock = stock_orders(subproblems)
        if stock is None:
            return set()
        orders = [plan.chosen for plan in plans]
        korch = self.storage_bytes(subproblems, orders)
        stock_storage = self.storage_bytes(subproblems, stock)
        if korch > stock_storage * (1 + STORAGE_SLACK):
            piece = self._piece_to_revert(subproblems, plans, orders, stock)[2]
            chosen = [(piece, k) for k in orders[piece]]
        else:
            stock_workspace = self.workspace_bytes(subproblems, stock)
            room = max((stock_storage + stock_workspace) * (1 + STORAGE_SLACK) - korch,
                       stock_workspace)
            chosen = [(piece, k) for piece, order in enumerate(orders) for k in order
                      if self._workspace(self.steps[subproblems[piece].candidate_ids[k]]) > room]
        return {subproblems[piece].candidate_ids[k] for piece, k in chosen
                if k not in subproblems[piece].problem.stock_plan}

    def _piece_to_revert(self, subproblems, plans, orders, stock) -> tuple[int, float, int]:
        """(storage, modelled seconds lost, piece) for the piece whose stock plan brings the
        storage lowest (the cheaper one on a tie), among pieces not on it."""
        return min((self.storage_bytes(subproblems,
                                       orders[:piece] + [stock[piece]] + orders[piece + 1:]),
                    plan.stock_objective - plan.objective, piece)
                   for piece, plan in enumerate(plans) if orders[piece] != stock[piece])

    def within_stock(self, subproblems, plans: Sequence[Plan]) -> list[Plan]:
        """`plans`, with pieces put back on their stock plan until the storage is within
        STORAGE_SLACK of the stock plan's.

        The piece whose stock plan brings the storage lowest goes first (the cheaper one on a
        tie); with every piece on its stock plan the storage is the stock's, so this ends. Such
        a piece's status becomes "memory_limited".
        """
        fallback = stock_orders(subproblems)
        if fallback is None:
            return list(plans)
        stock = self.storage_bytes(subproblems, fallback)
        orders = [plan.chosen for plan in plans]
        plans = list(plans)
        korch = self.storage_bytes(subproblems, orders)
        while korch > stock * (1 + STORAGE_SLACK):
            # some piece is off its stock plan: with all on it, the storage is the stock's
            korch, lost, piece = self._piece_to_revert(subproblems, plans, orders, fallback)
            orders[piece] = fallback[piece]
            plan = plans[piece]
            plans[piece] = replace(plan, chosen=fallback[piece], objective=plan.stock_objective,
                                   status="memory_limited",
                                   gap=(plan.stock_objective - plan.best_bound) / plan.stock_objective)
            logger.debug("planned storage above the stock plan's %.1f MB: a piece of %d "
                         "primitives runs its stock plan (%.3f ms modelled given up)", stock / 1e6,
                        len(subproblems[piece].piece), lost * 1e3)
        return plans


def kernel_workspace_bytes(func: tvm.tirx.PrimFunc) -> int:
    """Bytes a kernel stores whole of its own: intermediates its schedule cannot tile away.

    Injective intermediates inline into their consumers, as the schedules start, but the
    padding kept for a compute-bound convolution (`backend/kept_padding.py`) is stored whole.
    A reduction's result (a matmul's, a convolution's) cannot take its epilogue inlined; the
    schedules compute it tile by tile under its one consumer where that consumer reads it
    element for element (x * sigmoid(x) reads it twice), and otherwise (a reshape's fused
    index, a concatenation's channel offset, a broadcast) store it whole.
    """
    func = inline_injective(func)
    schedule = tvm.s_tir.Schedule(func)
    readers: dict = {}
    for rv in schedule.get_child_blocks(schedule.get_sblock("root")):
        block = schedule.get(rv)
        for region in block.reads:
            readers.setdefault(region.source, []).append((block, region))
    return sum(_buffer_bytes(buffer) for buffer in func.body.block.alloc_buffers
               if buffer.scope() == "global" and not _read_element_for_element(
                   buffer, readers.get(buffer, ())))


def _read_element_for_element(buffer, readers) -> bool:
    """One consumer that reads `buffer` at its own spatial iterators and iterates nothing else
    (unit dimensions aside): the schedule can produce it tile by tile under that consumer."""
    if len(readers) != 1:
        return False
    block, region = readers[0]
    spatial = [iv for iv in block.iter_vars
               if iv.iter_type == tvm.tirx.IterVar.DataPar and not _is(iv.dom.extent, 1)]
    used = []
    for index, size in zip(region.region, buffer.shape):
        if _is(size, 1):
            continue
        match = [k for k, iv in enumerate(spatial) if index.min.same_as(iv.var)]
        if not (match and _is(index.extent, 1) and isinstance(size, tvm.tirx.IntImm)
                and _is(spatial[match[0]].dom.extent, int(size))):
            return False
        used.append(match[0])
    return len(set(used)) == len(used) == len(spatial)


def _is(extent, value: int) -> bool:
    return isinstance(extent, tvm.tirx.IntImm) and int(extent) == value


def _buffer_bytes(buffer) -> int:
    count = 1
    for size in buffer.shape:
        if not isinstance(size, tvm.tirx.IntImm):
            return 0  # symbolic: no accounting, as for storage
        count *= int(size)
    return count * tvm.DataType(buffer.dtype).bits // 8


def _is_reshape(func) -> bool:
    """Whether TVM will run the kernel as a reshape: its analysis sees one block, so a chain
    of layout primitives counts once inlined, as the build's schedule inlines it."""
    return bool(has_reshape_pattern(func)) or bool(has_reshape_pattern(inline_injective(func)))


def stock_orders(subproblems) -> list[tuple[int, ...]] | None:
    """Each piece's stock plan in execution order; None if some piece has none."""
    orders = [execution_order(s.problem, s.problem.stock_plan) if s.problem.stock_plan else None
              for s in subproblems]
    return None if any(order is None for order in orders) else orders


def _mb(size: int) -> float:
    return round(size / 1e6, 3)
