"""How much activation storage Relax will allocate for a plan, and keeping it within the stock's.

Relax's static memory planner gives each intermediate tensor a storage block, reusing the
blocks of dead tensors greedily in program order: it takes the smallest free block at least as
large as the request, else the largest smaller one (which it grows), looking only within a
factor of 16 of the requested size. So what it allocates depends on the order of requests, not
only on how many bytes are live at once: on Candy, a pad and a transpose that Korch's plan runs
as two kernels near the input left one more block in the pool, which later tensors grew to
6.4 MB (26.6 MB of storage against the stock plan's 22.3). The check here replays that planner
over the whole plan; on the models checked it matches the built module's storage within 1 kB.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tvm.relax.analysis import has_reshape_pattern

from .cpu_schedule import inline_injective
from .orchestration import Plan, execution_order
from .primitive_kinds import LAYOUT
from .toposort import ordered_topologically

logger = logging.getLogger(__name__)

# Relax reuses a free block only within this factor of the requested size (static planner).
_MATCH_RANGE = 16

# Storage this much above the stock plan's still counts as "no more": a few kilobytes are not
# worth a slower piece (segformer_block's plan stored 8 KB more in 5.3 MB).
STORAGE_SLACK = 0.01


@dataclass(frozen=True)
class Step:
    """One kernel as the planner sees it."""

    inputs: frozenset[int]  # primitives it reads
    outputs: frozenset[int]  # primitives it stores
    view: bool = False  # a reshape of its one input: stores nothing of its own
    first: int = 0  # its earliest binding in the model: the rewrite emits kernels by it


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
            steps.append(Step(frozenset(candidate.inputs), frozenset(candidate.outputs), view,
                              first))
        return StorageModel(sizes, frozenset(graph.outputs), tuple(steps))

    def storage_bytes(self, subproblems, orders: Sequence[Sequence[int]]) -> int:
        """`planned_storage_bytes` of the pieces' kernels in the order the rewrite emits them:
        topological, earliest binding first (kernels.build_partition_module), which is not the
        plan's own order."""
        steps = [self.steps[s.candidate_ids[k]] for s, order in zip(subproblems, orders)
                 for k in order]
        source: dict[int, int] = {}  # primitive -> first kernel storing it, as the rewrite reads
        for position, step in enumerate(steps):
            for node in step.outputs:
                source.setdefault(node, position)
        needs = [{source[n] for n in step.inputs if n in source} - {position}
                 for position, step in enumerate(steps)]
        emitted = ordered_topologically(needs, [step.first for step in steps])
        return planned_storage_bytes([steps[i] for i in emitted], self.sizes, self.graph_outputs)

    def report(self, subproblems, plans: Sequence[Plan]) -> dict:
        """Megabytes for this plan and the stock plan, and the pieces on their stock plan."""
        stock = stock_orders(subproblems)
        return {"korch": _mb(self.storage_bytes(subproblems, [plan.chosen for plan in plans])),
                "stock": None if stock is None else _mb(self.storage_bytes(subproblems, stock)),
                "pieces_on_stock_plan": sum(plan.status == "memory_limited" for plan in plans)}

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
            options = [(self.storage_bytes(subproblems,
                                           orders[:piece] + [fallback[piece]] + orders[piece + 1:]),
                        plan.stock_objective - plan.objective, piece)
                       for piece, plan in enumerate(plans) if plan.chosen != fallback[piece]]
            korch, lost, piece = min(options)  # not empty: all pieces on stock plans is stock
            orders[piece] = fallback[piece]
            plan = plans[piece]
            plans[piece] = replace(plan, chosen=fallback[piece], objective=plan.stock_objective,
                                   status="memory_limited",
                                   gap=(plan.stock_objective - plan.best_bound) / plan.stock_objective)
            logger.debug("planned storage above the stock plan's %.1f MB: a piece of %d primitives "
                        "runs its stock plan (%.3f ms modelled given up)", stock / 1e6,
                        len(subproblems[piece].piece), lost * 1e3)
        return plans


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
