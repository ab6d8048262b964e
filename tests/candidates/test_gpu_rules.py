"""CUDA kernel rules: the thread-block rule keeps its row bytes with itself, per graph judged."""

import gc
import weakref

from tvm import relax

from korch_tvm.backend.target import parse_target
from korch_tvm.candidates.enumerate import Candidate, enumerate_candidates
from korch_tvm.candidates.gpu_rules import ThreadBlockFit, reduction_row_bytes, rules_for_target
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.lowering.fission import lower_to_primitives


def row_max_graph(columns: int) -> PrimitiveGraph:
    """x - max(x, axis=-1): a reduction whose result a primitive of the same kernel reads."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, columns), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            peak = bb.emit(relax.op.max(x, axis=-1, keepdims=True))
            out = bb.emit_output(bb.emit(relax.op.subtract(x, peak)))
        bb.emit_func_output(out)
    return PrimitiveGraph.from_module(lower_to_primitives(bb.get()))


def test_each_graph_is_judged_by_its_own_rows():
    narrow, wide = row_max_graph(64), row_max_graph(4096)
    reduce = next(i for i, node in enumerate(narrow.nodes) if node.kind == "reduce")
    assert reduction_row_bytes(narrow, reduce) == 64 * 4
    assert reduction_row_bytes(wide, reduce) == 4096 * 4
    fits = ThreadBlockFit(shared_memory_bytes=1024)
    both = Candidate(frozenset(range(len(narrow.nodes))), frozenset(), frozenset(), frozenset())
    assert fits(both, narrow) and not fits(both, wide) and fits(both, narrow)


def test_the_rules_hold_no_graph_after_they_go():
    """The row bytes live in the rule, not in a process-wide table: once the rules and the
    graph are dropped, nothing keeps the graph (a table keyed by id() kept eight)."""
    graph = row_max_graph(64)
    small = parse_target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 128})
    rules = rules_for_target(small, 4)
    candidates = enumerate_candidates(graph, rules)
    fused = [c for c in candidates if len(c.nodes) > 1 and not c.is_stock]
    assert len(fused) == 0 and any(len(c.nodes) == 1 for c in candidates)  # the row is 256 B
    alive = weakref.ref(graph)
    del graph, rules, candidates, fused
    gc.collect()
    assert alive() is None
