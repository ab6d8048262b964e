"""Standalone kernels: numerics against the model's own intermediates, and structural keys."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

from korch_tvm.backend.rewrite import share_identical_kernels
from korch_tvm.candidates.enumerate import KernelRules, enumerate_candidates
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.kernels.fused import (build_partition_module, candidate_io, candidate_kernel,
                                     canonical_prim_func, distinct_kernels, kernel_module,
                                     structural_key)
from korch_tvm.graph.relax_exprs import remap
from test_primitive_graph import SEQ, HIDDEN, assert_same_outputs, transformer_module


@pytest.fixture(scope="module")
def two_layers():
    graph = PrimitiveGraph.from_module(transformer_module(layers=2, seed=3))
    candidates = enumerate_candidates(graph, KernelRules(max_kernel_size=4))
    return graph, candidates, distinct_kernels(graph, candidates)


def intermediate_values(graph, inputs) -> dict:
    """Every tensor bound in the legalized main, by Var, from one run of a probing copy."""
    func = graph.legalized["main"]
    tensors = [b.var for b in func.body.blocks[0].bindings
               if isinstance(b.var.ty, relax.TensorType)]
    builder = relax.BlockBuilder(graph.legalized)
    params = [relax.Var(p.name, p.ty) for p in func.params]
    with builder.function("probe", params):
        with builder.dataflow():
            mapping = dict(zip(func.params, params))
            for binding in func.body.blocks[0].bindings:
                mapping[binding.var] = builder.emit(remap(binding.value, mapping))
            out = builder.emit_output(relax.Tuple([mapping[v] for v in tensors]))
        builder.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(builder.get(), target="llvm"), tvm.cpu())
    results = vm["probe"](*[tvm.runtime.tensor(x) for x in inputs])
    return {var: value.numpy() for var, value in zip(tensors, results)}


def test_identical_layers_share_keys(two_layers):
    graph, candidates, kernels = two_layers
    per_layer = len(graph) // 2
    key_of = dict(zip((c.nodes for c in candidates), kernels.keys))
    assert len(kernels.modules) < len({c.nodes for c in candidates})
    layer_one = [c.nodes for c in candidates if max(c.nodes) < per_layer and min(c.nodes) > 0]
    assert layer_one
    for nodes in layer_one:
        shifted = frozenset(i + per_layer for i in nodes)
        assert key_of[shifted] == key_of[nodes], "same kernel in both layers, different weights"
    assert len(set(key_of[c.nodes] for c in candidates if c.is_stock)) < \
        len([c for c in candidates if c.is_stock])


def test_standalone_kernels_compute_the_model_slice(two_layers):
    graph, candidates, _ = two_layers
    x = np.random.default_rng(4).standard_normal((SEQ, HIDDEN)).astype("float32")
    values = intermediate_values(graph, [x])
    params = dict(zip(graph.legalized["main"].params, [x]))
    stock = [c for c in candidates if c.is_stock]
    picks = [max(stock, key=lambda c: len(c.nodes)),
             max((c for c in candidates if len(c.outputs) > 1), key=lambda c: len(c.nodes)),
             candidates[len(candidates) // 2]]
    for candidate in picks:
        module = candidate_kernel(graph, candidate.nodes)
        reads, writes = candidate_io(graph, candidate.nodes)
        args = [params[r] if r in params else values[r] if isinstance(r, relax.Var)
                else r.value.numpy() for r in reads]
        outs = [np.zeros([int(d) for d in p.shape], str(p.dtype))
                for p in module["main"].params[len(reads):]]
        assert len(outs) == len(writes)
        device_args = [tvm.runtime.tensor(a) for a in args + outs]
        tvm.compile(module, target="llvm")["main"](*device_args)
        for var, result in zip(writes, device_args[len(args):]):
            np.testing.assert_allclose(result.numpy(), values[var], rtol=1e-5, atol=1e-5)


def test_partition_kernels_have_the_candidate_keys(two_layers):
    graph, candidates, kernels = two_layers
    stock = list(graph.stock_fusion_groups())
    built = build_partition_module(graph, stock)
    key_of = dict(zip((c.nodes for c in candidates), kernels.keys))
    for g, group in enumerate(stock):
        func = built[f"korch_k{g}"]
        assert structural_key(kernel_module(func)) == key_of[group], f"group {g}"


def test_identical_kernels_share_one_primfunc(two_layers):
    """The two layers have the same shapes, so most of the second layer's kernels are the
    first's (their weights differ, but they are call arguments): one PrimFunc is kept for
    each distinct kernel, every call goes to it, and the module computes the same."""
    graph, _, _ = two_layers
    built = build_partition_module(graph, list(graph.stock_fusion_groups()))
    shared = share_identical_kernels(built)

    def kernels(mod):
        return {gv.name_hint: f for gv, f in mod.functions_items()
                if isinstance(f, tvm.tirx.PrimFunc)}

    distinct = {tvm_ffi.structural_hash(f) for f in kernels(built).values()}
    assert len(kernels(shared)) == len(distinct) < len(kernels(built))
    called = set()

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.args and isinstance(expr.args[0],
                                                                     tvm.ir.GlobalVar):
            called.add(expr.args[0].name_hint)

    relax.analysis.post_order_visit(shared["main"], visit)
    assert called == set(kernels(shared))  # no call left to a dropped copy, none unused
    x = np.random.default_rng(0).standard_normal((SEQ, HIDDEN)).astype("float32")
    assert_same_outputs(shared, built, [x])
    assert share_identical_kernels(shared) is shared  # nothing left to share


def test_key_is_what_metaschedule_looks_up(two_layers):
    _, _, kernels = two_layers
    for key, module in list(kernels.modules.items())[:5]:
        private = canonical_prim_func(module["main"]).without_attr("global_symbol")
        normalized = _normalize_mod(private)  # what MetaScheduleApplyDatabase looks up
        assert structural_key(normalized) == key
        assert format(tvm_ffi.structural_hash(module) & (2**64 - 1), "016x") == key
        renamed = module["main"].with_attr("op_pattern", 4).with_attr("global_symbol", "other")
        assert structural_key(kernel_module(renamed)) == key
