"""The VM's time per kernel call: where it comes from, where it is kept, what it does to plans."""

import json
import logging

import numpy as np
import pytest
import tvm

from korch_tvm.candidates.enumerate import KernelRules, enumerate_candidates
from korch_tvm.costing import call_overhead
from korch_tvm.costing.kernel_costs import KernelCost
from korch_tvm.errors import KorchError
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.orchestration.problems import orchestration_problems, plan_groups, plan_report
from korch_tvm.orchestration.solver import solve_orchestration


@pytest.fixture
def unset(monkeypatch):
    """The session's conftest sets the variable to 0 for every test; these read the store."""
    monkeypatch.delenv(call_overhead.VARIABLE, raising=False)


def test_every_kernel_is_priced_with_its_call_and_an_opaque_binding_is_not():
    """0 -> 1 -> 2, node 1 opaque (no kernel key): each kernel's price in the program is its
    cost plus the call, whatever the cost's source; the opaque binding's stays 0."""
    graph = PrimitiveGraph.from_edges(3, [(0, 1), (1, 2)], outputs=[2])
    candidates = enumerate_candidates(graph, KernelRules(max_kernel_size=1))
    keys = ["a" if c.nodes == {0} else None if c.nodes == {1} else "b" for c in candidates]
    costs = {"a": KernelCost(1e-6, "measured", 1), "b": KernelCost(3e-6, "predicted", 0)}
    problem = orchestration_problems(graph, [frozenset({0, 1, 2})], candidates,
                                     list(range(3)), keys, costs, 0.5e-6)[0].problem
    prices = {key: choice.cost for key, choice in zip(keys, problem.kernels)}
    assert prices["a"] == pytest.approx(1.5e-6) and prices["b"] == pytest.approx(3.5e-6)
    assert prices[None] == 0.0
    unpriced = orchestration_problems(graph, [frozenset({0, 1, 2})], candidates,
                                      list(range(3)), keys, costs)[0].problem
    assert [choice.cost for choice in unpriced.kernels] == [
        costs[key].seconds if key else 0.0 for key in keys]


def test_the_variable_sets_it_in_microseconds(monkeypatch, tmp_path):
    def never(*_):
        raise AssertionError("measured although the variable is set")

    monkeypatch.setenv(call_overhead.VARIABLE, "2.5")
    assert call_overhead.call_overhead_seconds(str(tmp_path), 2, measure=never) \
        == pytest.approx(2.5e-6)
    assert not (tmp_path / call_overhead.FILE_NAME).exists()
    for bad in ("fast", "-1", "1e9", "nan"):
        monkeypatch.setenv(call_overhead.VARIABLE, bad)
        with pytest.raises(KorchError, match="KORCH_TVM_CALL_OVERHEAD_US must be microseconds"):
            call_overhead.call_overhead_seconds(str(tmp_path), 2, measure=never)


def test_measured_once_then_read_per_thread_count(unset, tmp_path):
    measured = []

    def measure(_target, threads):
        measured.append(threads)
        return 0.6e-6 * threads

    seconds = call_overhead.call_overhead_seconds(str(tmp_path), 2, measure=measure)
    assert seconds == pytest.approx(1.2e-6) and measured == [2]
    kept = json.loads((tmp_path / call_overhead.FILE_NAME).read_text())
    assert kept["format"] == 1 and kept["threads"] == 2 and kept["seconds"] == seconds
    assert call_overhead.call_overhead_seconds(str(tmp_path), 2, measure=measure) == seconds
    assert measured == [2]  # read back, not measured again
    assert call_overhead.call_overhead_seconds(str(tmp_path), 1, measure=measure) \
        == pytest.approx(0.6e-6)
    assert measured == [2, 1]  # another thread count is another measurement


@pytest.mark.parametrize("text", ["{not json", json.dumps({"format": 1, "threads": 2}),
                                  json.dumps({"format": 1, "threads": 2, "seconds": 1.0}),
                                  json.dumps({"format": 1, "threads": 2, "seconds": True}),
                                  json.dumps({"format": 9, "threads": 2, "seconds": 1e-6}),
                                  json.dumps([1e-6])])
def test_a_refused_file_is_measured_again_with_a_warning(unset, tmp_path, caplog, text):
    (tmp_path / call_overhead.FILE_NAME).write_text(text)
    with caplog.at_level(logging.WARNING):
        seconds = call_overhead.call_overhead_seconds(str(tmp_path), 2,
                                                      measure=lambda *_: 0.7e-6)
    assert seconds == pytest.approx(0.7e-6)
    assert any(call_overhead.FILE_NAME in record.getMessage() for record in caplog.records)
    assert json.loads((tmp_path / call_overhead.FILE_NAME).read_text())["seconds"] == seconds


def test_a_failed_measurement_leaves_the_term_out_and_keeps_nothing(unset, tmp_path, caplog):
    def busy(*_):
        raise KorchError("the VM's time per kernel call measured 400 us, above 100")

    with caplog.at_level(logging.WARNING):
        assert call_overhead.call_overhead_seconds(str(tmp_path), 2, measure=busy) == 0.0
    assert "was not measured (the VM's time per kernel call measured 400 us" in caplog.text
    assert not (tmp_path / call_overhead.FILE_NAME).exists()  # the next compile tries again


def test_the_measurement_is_the_chain_less_the_kernel(monkeypatch):
    times = {"add_one": 1.0e-6, 1: 2.0e-6, call_overhead.CHAIN_CALLS: 0.0}
    times[call_overhead.CHAIN_CALLS] = 2.0e-6 + (call_overhead.CHAIN_CALLS - 1) * 1.6e-6
    calls_of = {}

    def least(holder, name, _device, *_args):
        return times["add_one"] if name == "add_one" else times[calls_of[id(holder)]]

    def chain(_kernel, _size, calls, _target):
        holder = object()
        calls_of[id(holder)] = calls
        return holder

    monkeypatch.setattr(call_overhead, "_least", least)
    monkeypatch.setattr(call_overhead, "_chain_vm", chain)
    assert call_overhead.measure_call_overhead("llvm", 2) == pytest.approx(0.6e-6)
    times[call_overhead.CHAIN_CALLS] = 2.0e-6 + (call_overhead.CHAIN_CALLS - 1) * 1e-3
    with pytest.raises(KorchError, match="is the machine busy"):
        call_overhead.measure_call_overhead("llvm", 2)


def test_the_chain_timed_runs_every_call():
    """What is timed is CHAIN_CALLS real kernel calls, each on the previous one's output."""
    kernel = call_overhead._add_one(64, 2)
    vm = call_overhead._chain_vm(kernel, 64, call_overhead.CHAIN_CALLS, "llvm")
    out = vm["main"](tvm.runtime.tensor(np.arange(64, dtype="float32")))
    np.testing.assert_array_equal(out.numpy(), np.arange(64) + call_overhead.CHAIN_CALLS)


def test_the_call_makes_fewer_kernels_pay():
    """0 -> 1: two kernels of 1 us, or one of 2.2 us. Without the call the two are cheaper;
    with 0.5 us a call the one fused kernel is (2.7 against 3.0), and the modelled latency
    counts its call."""
    graph = PrimitiveGraph.from_edges(2, [(0, 1)], outputs=[1])
    candidates = enumerate_candidates(graph, KernelRules(max_kernel_size=2))
    keys = [f"k{i}" for i in range(len(candidates))]
    costs = {key: KernelCost(2.2e-6 if len(c.nodes) == 2 else 1e-6, "measured", 1)
             for key, c in zip(keys, candidates)}
    kept = list(range(len(candidates)))

    def plan(call_seconds):
        problems = orchestration_problems(graph, [frozenset({0, 1})], candidates, kept, keys,
                                          costs, call_seconds)
        plans = [solve_orchestration(p.problem) for p in problems]
        chosen = plan_groups(problems, plans)
        report = plan_report(graph, candidates, kept, problems, plans, chosen, keys, costs)
        return sorted(len(candidates[i].nodes) for i in chosen), report["modelled_ms"]

    assert plan(0.0) == ([1, 1], pytest.approx(2e-3))
    assert plan(0.5e-6) == ([2], pytest.approx(2.7e-3))


@pytest.mark.parametrize("korch", [True, False])
def test_a_compile_measures_it_once_and_prices_every_call(unset, tmp_path, monkeypatch, korch):
    """The first compile measures the VM's time per call into the log's directory, the second
    reads it; each path's modelled latency is its kernels' costs plus one call per kernel."""
    from conftest import make_tiny_onnx
    from korch_tvm.pipeline.compile import compile_model

    model = make_tiny_onnx(8, 16)
    compile_model(model, "llvm", korch=korch, tuning_logs=str(tmp_path), trials=0)
    kept = list(tmp_path.rglob(call_overhead.FILE_NAME))
    assert len(kept) == 1
    seconds = json.loads(kept[0].read_text())["seconds"]

    def never(*_):
        raise AssertionError("measured again")

    monkeypatch.setattr(call_overhead, "measure_call_overhead", never)
    _, report = compile_model(model, "llvm", korch=korch, tuning_logs=str(tmp_path), trials=0)
    assert report["verification"]["passed"]
    if korch:
        plan = report["plan"]
        kernels = [k for k in plan["kernels"] if k["key"] is not None]
        assert plan["call_overhead_us"] == pytest.approx(seconds * 1e6)
        assert plan["kernel_calls"] == len(kernels) > 0
        assert plan["modelled_ms"] == pytest.approx(
            sum(k["ms"] for k in kernels) + len(kernels) * seconds * 1e3)
    else:
        assert report["call_overhead_us"] == pytest.approx(seconds * 1e6)
        assert report["modelled_ms"] == pytest.approx(
            sum(k["ms"] * k["calls"] for k in report["kernels"])
            + report["kernel_calls"] * seconds * 1e3)
