"""Alternatives end to end on a tiny Relax model with a test rule (x * 2 computed as x + x):
offered in the graph, chosen by the solver where cheaper, built, and numerically checked."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from korch_tvm.candidates.enumerate import enumerate_candidates
from korch_tvm.candidates.partition import partition_graph
from korch_tvm.costing.measure import KernelCost
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.kernels.fused import build_partition_module, distinct_kernels
from korch_tvm.lowering.fission import lower_to_primitives
from korch_tvm.orchestration.problems import orchestration_problems, plan_groups
from korch_tvm.orchestration.solver import solve_orchestration
from korch_tvm.substitutions import offer
from korch_tvm.substitutions.alternative import Alternative


@tvm.script.ir_module
class Tiny:
    @R.function
    def main(x: R.Tensor((8, 16), "float32")):
        with R.dataflow():
            a = R.exp(x)
            b = R.multiply(a, R.const(2.0, "float32"))
            c = R.nn.relu(b)
            gv = R.add(c, a)
            R.output(gv)
        return gv


def _expected(x):
    return np.maximum(2 * np.exp(x), 0) + np.exp(x)


class DoubleAsSum:
    """The test rule: `v * 2.0` (a constant 2) offered as `v + v`."""

    name = "double_as_sum"

    def find(self, main):
        found = []
        for binding in main.body.blocks[0].bindings:
            value = binding.value
            if not (isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.multiply"
                    and isinstance(value.args[1], tvm.ir.expr.Constant)
                    and float(value.args[1].value.numpy()) == 2.0):
                continue
            read = value.args[0]
            param = relax.Var("v", read.ty)
            builder = relax.BlockBuilder()
            with builder.function("alternative", [param]):
                with builder.dataflow():
                    total = builder.emit(relax.op.add(param, param))
                    result = builder.emit_output(relax.Tuple([total]))
                builder.emit_func_output(result)
            found.append(Alternative(self.name, (read,), (binding.var,),
                                     builder.get()["alternative"]))
        return found


@pytest.fixture
def test_rule(monkeypatch):
    monkeypatch.setattr(offer, "substitution_rules",
                        lambda choice: [] if choice == "off" else [DoubleAsSum()])


def _built(graph, dear_node):
    """The module of the plan where every kernel holding `dear_node` costs 5 ms more."""
    pieces = partition_graph(graph, 100)
    candidates = [c for p in pieces for c in enumerate_candidates(graph, node_subset=p)]
    kernels = distinct_kernels(graph, candidates)
    costs = {}
    for candidate, key in zip(candidates, kernels.keys):
        seconds = 1e-3 * (1 + len(candidate.nodes) + 5 * (dear_node in candidate.nodes))
        costs[key] = KernelCost(min(seconds, getattr(costs.get(key), "seconds", 1.0)),
                                "measured", 1)
    problems = orchestration_problems(graph, pieces, candidates, range(len(candidates)),
                                      kernels.keys, costs)
    chosen = plan_groups(problems, [solve_orchestration(p.problem) for p in problems])
    groups = [candidates[i].nodes for i in chosen]
    return groups, build_partition_module(graph, groups)


def _run(module, x):
    vm = relax.VirtualMachine(tvm.compile(module, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _ops(module):
    return {op for _, f in module.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
            for op in ("multiply", "add") if op in f.script()}


def test_the_plan_reads_the_alternative_where_it_is_cheaper_and_computes_the_same(test_rule):
    lowered = lower_to_primitives(Tiny)
    graph = offer.graph_with_alternatives(lowered)
    (site,) = graph.alternatives
    assert site.rule == "double_as_sum" and [graph.nodes[i].op_name for i in site.offers] \
        == ["relax.add"]
    assert len(graph.nodes) == 5 and graph.stock_fusion_groups() == (frozenset(range(4)),)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype("float32")
    groups, module = _built(graph, dear_node=site.replaced[0])      # multiply dear
    assert any(site.offers[0] in g for g in groups) and not any(site.replaced[0] in g
                                                                 for g in groups)
    np.testing.assert_allclose(_run(module, x), _expected(x), rtol=1e-5)
    groups, module = _built(graph, dear_node=site.offers[0])        # the sum dear
    assert not any(g & site.nodes for g in groups)
    assert "T.float32(2.0)" in module.script()
    np.testing.assert_allclose(_run(module, x), _expected(x), rtol=1e-5)


def test_without_rules_the_graph_is_the_lowered_one(test_rule):
    lowered = lower_to_primitives(Tiny)
    offered = offer.graph_with_alternatives(lowered, "off")
    assert offered == PrimitiveGraph.from_module(lowered) and not offered.alternatives


def test_an_alternative_breaking_the_contract_is_refused():
    lowered = lower_to_primitives(Tiny)
    (alternative,) = DoubleAsSum().find(lowered["main"])
    offer.offer_alternatives(lowered, [alternative])  # the right one is accepted
    with pytest.raises(ValueError, match="substitution bad: 1 parameters for 0 reads"):
        offer.offer_alternatives(lowered, [Alternative("bad", (), alternative.replaces,
                                                       alternative.body)])
    output = lowered["main"].body.blocks[0].bindings[-1].var
    relu = lowered["main"].body.blocks[0].bindings[2].var
    with pytest.raises(ValueError, match="substitution bad: reads"):
        offer.offer_alternatives(lowered, [Alternative("bad", (relax.Var("v", relu.ty),),
                                                       (output,), alternative.body)])


def test_a_compile_offers_the_alternative_and_verifies(test_rule, tmp_path):
    from korch_tvm import KorchConfig, compile_model

    config = KorchConfig(library="off", time_budget=0, substitutions="on")
    _, report = compile_model(Tiny, korch=True, tuning_logs=str(tmp_path), config=config)
    substitutions = report["plan"]["substitutions"]
    assert substitutions["found"] == 1 and substitutions["sites"][0]["offered"]
    assert report["verification"]["passed"]
    assert all("columns" in piece and piece["rows"] > 0 for piece in report["plan"]["solver"])


SITES = {"found": 2, "chosen": 1, "alternative_primitives": 3, "sites": [
    {"rule": "double_as_sum", "replaces": ["b"], "primitives": 1, "offered": True,
     "chosen": True, "saved_ms": 0.25},
    {"rule": "double_as_sum", "replaces": ["d"], "primitives": 2, "offered": False,
     "chosen": False}]}


def test_the_summary_and_explain_say_what_was_found_chosen_and_saved():
    from korch_tvm.report.text import explain_lines, summary_lines

    plan = {"kernels_chosen": 2, "candidates": 9, "modelled_ms": 1.0, "substitutions": SITES}
    line = next(x for x in summary_lines({"plan": plan}) if "substitutions" in x)
    assert line.strip() == ("substitutions: 1 of 2 chosen (double_as_sum 1/2); together they "
                            "save 0.250 ms modelled")
    explanation = {"kernels": [], "recomputed": [], "solver_status": "optimal",
                   "stock_diff": {"stock_kernels": 1, "same": [], "merged": [],
                                  "part_of_stock": [], "split": []},
                   "solver": [{"primitives": 5, "candidates": 9, "columns": 9, "rows": 14,
                               "status": "optimal", "gap": 0.0, "seconds": 0.01}],
                   "substitutions": SITES, "onnx_trace": "x"}
    text = "\n".join(explain_lines(explanation))
    assert "  double_as_sum for b (1 primitives): chosen, saves 0.250 ms" in text
    assert "  double_as_sum for d (2 primitives): not offered (straddles a piece cut)" in text
    assert "subproblem 0: 5 primitives, 9 candidates, 9 columns x 14 rows: optimal" in text


def test_a_compile_leaves_out_an_alternative_breaking_the_contract(monkeypatch, caplog):
    class Broken(DoubleAsSum):
        def find(self, main):
            return [Alternative("broken", (), a.replaces, a.body) for a in super().find(main)]

    monkeypatch.setattr(offer, "substitution_rules", lambda choice: [Broken(), DoubleAsSum()])
    graph = offer.graph_with_alternatives(lower_to_primitives(Tiny))
    assert [site.rule for site in graph.alternatives] == ["double_as_sum"]
    assert "substitution broken: 1 parameters for 0 reads; not offered" in caplog.text


def test_the_offered_and_legalized_modules_are_well_formed(test_rule):
    # an untyped block once made FuseOps fail on EfficientViT (its function de-duplication)
    lowered = lower_to_primitives(Tiny)
    offered = offer.offer_alternatives(lowered, DoubleAsSum().find(lowered["main"]))
    assert relax.analysis.well_formed(offered.module) is not False
    graph = offer.graph_with_alternatives(lowered)
    assert relax.analysis.well_formed(graph.legalized) is not False
    from korch_tvm.graph.alternatives import without_alternatives

    assert relax.analysis.well_formed(without_alternatives(graph)) is not False
