"""In-model kernel times: joining them to reports, keeping their ratios, planning with them."""

import json
import logging

import numpy as np
import pytest
import tvm
from tvm import relax

from korch_tvm import compile_model
from korch_tvm.backend.target import parse_target, target_tag
from korch_tvm.config import KorchConfig
from korch_tvm.costing.in_model import (FILE_NAME, InModelTimes, fidelity_by_kind, kernel_rows,
                                        library_call_name, load_in_model_times,
                                        record_in_model_times, scaled_costs)
from korch_tvm.costing.measure import KernelCost
from korch_tvm.tools.kind_profile import tvm_kernel_times
from test_weight_packing import conv_block_onnx

STOCK_REPORT = {
    "korch": False,
    "kernel_kinds": {"fused_conv": "conv1x1", "fused_add": "memory"},
    "kernels": [{"name": "fused_conv", "calls": 1, "ms": 1.4, "isolated_ms": 2.0, "key": "a"},
                {"name": "fused_add", "calls": 3, "ms": 0.5, "isolated_ms": 0.5, "key": "b"},
                {"name": "never_ran", "calls": 1, "ms": 0.1, "isolated_ms": 0.1, "key": "c"}],
}
KORCH_REPORT = {
    "korch": True,
    "kernel_kinds": {"korch_k0": "conv1x1", "korch_k1": "memory"},
    "plan": {"kernels": [{"key": "d", "ms": 3.0, "isolated_ms": 1.5},
                         {"key": None, "ms": None, "isolated_ms": None},   # opaque
                         {"key": "e", "ms": 0.2, "isolated_ms": 0.2},
                         {"key": "d", "ms": 3.0, "isolated_ms": 1.5}]},   # runs as korch_k0
}


def row(key, kind, isolated_ms, in_model_ms, name="k"):
    return {"name": name, "key": key, "kind": kind, "isolated_ms": isolated_ms,
            "in_model_ms": in_model_ms}


def test_rows_join_reports_with_in_model_times_per_run():
    stock = kernel_rows(STOCK_REPORT, {"fused_conv": 1.0, "fused_add": 3.0, "runtime": 0.4})
    # isolated ms (not the scaled "ms" a calibrated compile reports), times the calls
    assert stock == [row("a", "conv1x1", 2.0, 1.0, "fused_conv"),
                     row("b", "memory", 1.5, 3.0, "fused_add")]
    korch = kernel_rows(KORCH_REPORT, {"korch_k0": 1.2, "korch_k1": 9.0, "korch_k2": 0.3})
    # the isolated cost, not the scaled one; the opaque kernel has no key and is left out; k3
    # has k0's key, and the build called k0's PrimFunc for both (both calls are in k0's time)
    assert korch == [row("d", "conv1x1", 3.0, 1.2, "korch_k0"),
                     row("e", "memory", 0.2, 0.3, "korch_k2")]
    table = fidelity_by_kind(stock + korch)
    assert table["conv1x1"] == pytest.approx({"isolated_ms": 5.0, "in_model_ms": 2.2,
                                              "ratio": 2.2 / 5.0})


def test_library_calls_join_their_kernels_in_plan_order():
    """The profile knows a library call only by its order in the run (one packed function
    serves every GEMM), so the n-th library kernel of the plan gets the n-th call's time; the
    isolated times of all kernels that ran add up to the plan's."""
    report = {"korch": True,
              "kernel_kinds": {"korch_k0": "memory", "korch_k1": "conv1x1", "korch_k2": "matmul",
                               "korch_k3": "conv1x1"},
              "plan": {"kernels": [{"key": "m", "isolated_ms": 0.5},
                                   {"key": "g", "isolated_ms": 2.0, "implementation": "gemm"},
                                   {"key": "t", "isolated_ms": 1.0, "implementation": "tvm"},
                                   {"key": "h", "isolated_ms": 4.0, "implementation": "gemm"}]}}
    profile = {"korch_k0": 0.4, library_call_name(0): 1.5, "korch_k2": 0.9,
               library_call_name(1): 3.0, "runtime": 0.1}
    # a library call's ratio is its own kind's: it would skew the median of TVM's 1x1
    # convolutions, which kernels never timed in a model are scaled by
    assert kernel_rows(report, profile) == [row("m", "memory", 0.5, 0.4, "korch_k0"),
                                            row("g", "library", 2.0, 1.5, "korch_k1"),
                                            row("t", "matmul", 1.0, 0.9, "korch_k2"),
                                            row("h", "library", 4.0, 3.0, "korch_k3")]


def test_record_replaces_older_ratios_and_drops_implausible_ones(tmp_path, caplog):
    directory = str(tmp_path)
    assert not load_in_model_times(directory)
    assert record_in_model_times(directory, [row("a", "conv1x1", 2.0, 1.0),
                                             row("b", "memory", 1.0, 3.0)], "m1") == 2
    with caplog.at_level(logging.WARNING, logger="korch_tvm"):
        kept = record_in_model_times(directory, [row("a", "conv1x1", 2.0, 3.0),
                                                 row("z", "memory", 1.0, 50.0)], "m2")
    assert kept == 1 and "not kept" in caplog.text
    times = load_in_model_times(directory)
    assert times.ratios == {"a": 1.5, "b": 3.0}
    assert times.kinds == {"a": "conv1x1", "b": "memory"}


def test_recording_keeps_entries_that_loading_ignores(tmp_path):
    """A file holding only implausible ratios (hand-edited, say) loads as empty, but a new
    record is added to it, not written over it."""
    (tmp_path / FILE_NAME).write_text(json.dumps(
        {"version": 1, "kernels": {"x": {"ratio": 50.0, "kind": "memory"}}}))
    assert not load_in_model_times(str(tmp_path))
    assert record_in_model_times(str(tmp_path), [row("a", "memory", 1.0, 2.0)], "m") == 1
    kept = json.loads((tmp_path / FILE_NAME).read_text())["kernels"]
    assert sorted(kept) == ["a", "x"] and kept["x"]["ratio"] == 50.0
    assert load_in_model_times(str(tmp_path)).ratios == {"a": 2.0}


def test_a_corrupt_file_is_moved_aside_and_plans_use_isolated_costs(tmp_path, caplog):
    (tmp_path / FILE_NAME).write_text('{"version": 1, "kernels": {"a": {"rat')
    with caplog.at_level(logging.WARNING, logger="korch_tvm"):
        assert not load_in_model_times(str(tmp_path))
    assert "unreadable" in caplog.text
    assert (tmp_path / (FILE_NAME + ".corrupt")).exists() and not (tmp_path / FILE_NAME).exists()
    assert record_in_model_times(str(tmp_path), [row("a", "memory", 1.0, 2.0)], "m") == 1
    assert load_in_model_times(str(tmp_path)).ratios == {"a": 2.0}


def test_factors_own_ratio_then_kind_median_then_one():
    times = InModelTimes({"a": 0.5, "b": 0.7, "c": 0.9, "m": 2.0},
                         {"a": "conv1x1", "b": "conv1x1", "c": "conv1x1", "m": "memory"})
    factors = times.factors({"a": "conv1x1", "x": "conv1x1", "y": "memory", "z": "matmul"})
    assert factors == {"a": 0.5, "x": 0.7, "y": 2.0, "z": 1.0}
    costs = {"a": KernelCost(1e-3, "measured", 0), "z": KernelCost(2e-3, "log", 0)}
    scaled = scaled_costs(costs, factors)
    assert scaled["a"] == KernelCost(0.5e-3, "measured", 0) and scaled["z"] is costs["z"]


def test_recorded_ratios_steer_the_next_plan(tmp_path):
    """Time a Korch build's kernels in the model, then claim TVM's fusion groups run 5x faster
    in the model than alone: the next plan is exactly those groups, costed that way."""
    logs = str(tmp_path)
    # one layout, TVM kernels only: the ratios below cover all its kernels (a library call has
    # no kernel of its own for the VM's hook to time)
    config = KorchConfig(layout="NCHW", library="off")
    executable, report = compile_model(conv_block_onnx(), korch=True, tuning_logs=logs,
                                       verify=False, config=config)
    vm = relax.VirtualMachine(executable, tvm.cpu(0))
    data = np.random.default_rng(0).standard_normal((1, 16, 14, 14)).astype("float32")
    rows = kernel_rows(report, tvm_kernel_times(vm, [tvm.runtime.tensor(data, tvm.cpu(0))],
                                                runs=3))
    # one row per distinct kernel: a plan may use the same kernel twice (timing decides)
    assert len(rows) == len({kernel["key"] for kernel in report["plan"]["kernels"]} - {None})
    assert all(r["in_model_ms"] > 0 and r["isolated_ms"] > 0 for r in rows)

    _, stock = compile_model(conv_block_onnx(), korch=False, tuning_logs=logs, verify=False,
                             config=config)
    directory = tmp_path / target_tag(parse_target("llvm"))
    entries = {k["key"]: {"ratio": 0.2, "kind": k["kind"]} for k in stock["kernels"]}
    entries.update({r["key"]: {"ratio": 5.0, "kind": r["kind"]} for r in rows
                    if r["key"] not in entries})
    (directory / FILE_NAME).write_text(json.dumps({"version": 1, "kernels": entries}))

    _, again = compile_model(conv_block_onnx(), korch=True, tuning_logs=logs, verify=False,
                             config=config)
    kernels = again["plan"]["kernels"]
    assert all(kernel["stock_group"] for kernel in kernels)
    assert {kernel["key"] for kernel in kernels} == {k["key"] for k in stock["kernels"]}
    for kernel in kernels:
        assert kernel["ms"] == pytest.approx(0.2 * kernel["isolated_ms"])
    assert again["modelled_ms"] == pytest.approx(0.2 * again["modelled_isolated_ms"])
    assert again["tuning"]["measured"] == 0    # nothing new to measure: only costs changed
    _, stock_again = compile_model(conv_block_onnx(), korch=False, tuning_logs=logs,
                                   verify=False, config=config)
    assert stock_again["modelled_ms"] == pytest.approx(0.2 * stock["modelled_ms"])
