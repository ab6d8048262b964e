"""PrimitiveGraph: nodes and edges of a lowered module, reachability, and round-tripping plans."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from korch_tvm.errors import KorchError
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.kernels.fused import build_partition_module
from korch_tvm.lowering.fission import PrimitiveLowering

SEQ, HIDDEN = 4, 8


def transformer_module(layers: int = 1, seed: int = 0, softmax: bool = True) -> tvm.IRModule:
    """`layers` tiny pre-norm transformer blocks (attention + GELU MLP), lowered to primitives."""
    rng = np.random.default_rng(seed)
    const = lambda *shape: relax.const(rng.standard_normal(shape).astype("float32"))  # noqa: E731
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((SEQ, HIDDEN), "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(layers):
                ln = bb.emit(op.nn.layer_norm(h, const(HIDDEN), const(HIDDEN), axes=[-1]))
                q = bb.emit(op.matmul(ln, const(HIDDEN, HIDDEN)))
                k = bb.emit(op.matmul(ln, const(HIDDEN, HIDDEN)))
                s = bb.emit(op.matmul(q, op.permute_dims(k)))
                p = bb.emit(op.nn.softmax(s) if softmax else op.exp(s))
                h = bb.emit(op.add(h, op.matmul(p, ln)))
                f = bb.emit(op.nn.gelu(op.add(op.matmul(h, const(HIDDEN, HIDDEN)), const(HIDDEN))))
                h = bb.emit(op.add(h, op.matmul(f, const(HIDDEN, HIDDEN))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return tvm.transform.Sequential([PrimitiveLowering(), relax.transform.CanonicalizeBindings(),
                                     relax.transform.DeadCodeElimination()])(bb.get())


@tvm.script.ir_module
class TupleAndOpaque:
    """A tuple-producing split, an op LegalizeOps leaves alone (argsort) and a tuple result."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.add(a, R.const(np.ones(8, "float32")))
            s = R.split(b, 2, axis=1)
            c = R.nn.relu(s[0])
            d = R.exp(s[1])
            e = R.concat((c, d), axis=1)
            t = R.argsort(e)
            f = R.multiply(e, R.astype(t, "float32"))
            gv = (f, a)
            R.output(gv)
        return gv


def run_module(mod, inputs):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def assert_same_outputs(mod_a, mod_b, inputs):
    for got, want in zip(run_module(mod_a, inputs), run_module(mod_b, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def brute_reach(graph, i):
    seen, stack = set(), list(graph.nodes[i].consumers)
    while stack:
        j = stack.pop()
        if j not in seen:
            seen.add(j)
            stack += graph.nodes[j].consumers
    return seen


@pytest.fixture(scope="module")
def block_graph():
    return PrimitiveGraph.from_module(transformer_module())


def test_nodes_kinds_and_edges(block_graph):
    graph = block_graph
    kinds = [n.kind for n in graph.nodes]
    assert kinds.count("linear") == 6 and "reduce" in kinds and "opaque" not in kinds
    assert graph.inputs == ("x",) and graph.outputs == (len(graph) - 1,)
    for node in graph.nodes:
        assert all(p < node.index for p in node.inputs), "ids follow a topological order"
        assert all(node.index in graph.nodes[p].consumers for p in node.inputs)
        assert node.out_shapes and node.fusible
    first_matmul = next(n for n in graph.nodes if n.kind == "linear")
    assert first_matmul.num_constants == 1 and len(first_matmul.inputs) == 1, \
        "weights are attributes, not edges"
    assert first_matmul.op_name == "relax.matmul" and first_matmul.shape == (SEQ, HIDDEN)


def test_reachability_bitsets_match_brute_force(block_graph):
    graph = block_graph
    for node in graph.nodes:
        assert graph.descendants[node.index] == graph.mask(brute_reach(graph, node.index))
        ancestors = {j for j in range(len(graph)) if node.index in brute_reach(graph, j)}
        assert graph.ancestors[node.index] == graph.mask(ancestors)


def test_is_convex_matches_definition():
    graph = PrimitiveGraph.from_edges(5, [(0, 1), (1, 2), (0, 2), (2, 3), (0, 4)])
    assert graph.is_convex(graph.mask([0, 1, 2]))
    assert not graph.is_convex(graph.mask([0, 2]))  # 0 -> 1 -> 2 leaves the set
    assert graph.is_convex(graph.mask([3, 4]))  # disconnected but convex
    assert graph.convex_hull(graph.mask([0, 3])) == graph.mask([0, 1, 2, 3])


def test_identity_stock_and_overlapping_partitions_round_trip(block_graph):
    graph = block_graph
    x = np.random.default_rng(1).standard_normal((SEQ, HIDDEN)).astype("float32")
    original = transformer_module()
    stock = graph.stock_fusion_groups()
    assert any(len(g) > 1 for g in stock)
    identity = [[i] for i in range(len(graph))]
    merged = [sorted(stock[0] | stock[1])] + [sorted(g) for g in stock[2:]] \
        if graph.is_convex(graph.mask(stock[0] | stock[1])) else stock
    overlapping = [sorted(g) for g in stock] + [sorted(stock[1] | stock[2])]
    for plan in (identity, stock, merged, overlapping):
        built = build_partition_module(graph, plan)
        names = {gv.name_hint for gv, f in built.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc)}
        assert names <= {f"korch_k{g}" for g in range(len(plan))}
        assert_same_outputs(built, original, [x])
    assert len([f for _, f in build_partition_module(graph, stock).functions_items()
                if isinstance(f, tvm.tirx.PrimFunc)]) == len(stock)


def test_tuple_outputs_opaque_bindings_and_multi_output_groups():
    graph = PrimitiveGraph.from_module(TupleAndOpaque)
    by_name = {n.name: n for n in graph.nodes}
    assert not by_name["t"].fusible and by_name["t"].kind == "opaque"
    assert len(by_name["s"].out_shapes) == 2 and len(by_name["s"].bindings) == 3  # split + 2 items
    assert set(graph.outputs) == {by_name["a"].index, by_name["f"].index}
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((4, 8)).astype("float32"),
              rng.standard_normal((8, 8)).astype("float32")]
    ids = [by_name[n].index for n in ("a", "b", "s", "c", "d", "e", "t", "lv9", "f")]
    plans = [[[i] for i in range(len(graph))], graph.stock_fusion_groups(),
             [ids[0:4], ids[2:6], [ids[6]], ids[7:9]]]  # {a,b,s,c} exports a (output) and c
    for plan in plans:
        assert_same_outputs(build_partition_module(graph, plan), TupleAndOpaque, inputs)
    with pytest.raises(ValueError, match="opaque"):
        build_partition_module(graph, [ids[5:8], ids[:5], ids[8:]])
    with pytest.raises(ValueError, match="convex"):
        rest = [[i] for i in ids if i not in (ids[2], ids[5])]
        build_partition_module(graph, [[ids[2], ids[5]]] + rest)


def test_several_blocks_are_rejected():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 2), "float32"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.exp(x))  # a binding outside any dataflow block
        with bb.dataflow():
            z = bb.emit_output(relax.op.exp(y))
        bb.emit_func_output(z)
    with pytest.raises(KorchError, match="single dataflow block"):
        PrimitiveGraph.from_module(bb.get())
