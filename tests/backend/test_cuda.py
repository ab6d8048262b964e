"""The CUDA target: everything up to code generation runs here; running it needs a GPU.

CPU-only tests: target limits, the GPU kernel rule, dlight default schedules (and their traces
in the tuning log), planning on predicted costs, the CUDA build pipeline (no re-fusion), and
compiling the generated CUDA source with nvcc where nvcc is installed. Tests marked `gpu` run
the built model and are skipped, with the reason, where no CUDA device is visible.
"""

import json
import subprocess
import sys

import pytest
import tvm
import tvm_ffi

from conftest import MODELS, REPO
from korch_tvm.backend import cuda as cuda_build
from korch_tvm.backend.target import parse_target, target_tag
from korch_tvm.candidates.enumerate import enumerate_candidates
from korch_tvm.candidates.gpu_rules import gpu_limits, reduction_row_bytes, rules_for_target
from korch_tvm.config import KorchConfig
from korch_tvm.costing.tuning_log import TuningLog
from korch_tvm.frontend.onnx_import import import_onnx, load_onnx
from korch_tvm.graph.primitive_graph import PrimitiveGraph
from korch_tvm.kernels.fused import kernel_module
from korch_tvm.lowering.fission import lower_to_primitives
from korch_tvm.pipeline.stock import kernel_calls, stock_fusion

NO_DEVICE = cuda_build.no_device_reason(parse_target("cuda"))
gpu = pytest.mark.skipif(NO_DEVICE is not None, reason=f"needs a CUDA GPU ({NO_DEVICE})")
BERT = MODELS / "bert_layer.onnx"


@pytest.fixture(scope="module")
def bert():
    return import_onnx(load_onnx(BERT), None)


@pytest.fixture(scope="module")
def bert_graph(bert):
    return PrimitiveGraph.from_module(lower_to_primitives(bert))


def test_cuda_targets_carry_gpu_limits():
    target = parse_target("cuda")
    assert target.host.kind.name == "llvm"
    assert gpu_limits(target) == {"max_shared_memory_per_block": 49152,
                                  "max_threads_per_block": 1024} or NO_DEVICE is None
    small = parse_target('{"kind": "cuda", "arch": "sm_80", "max_shared_memory_per_block": 512}')
    assert target_tag(small) == "cuda-sm_80"
    assert gpu_limits(small)["max_shared_memory_per_block"] == 512


def test_gpu_rule_drops_kernels_whose_reduced_row_exceeds_shared_memory(bert_graph):
    graph = bert_graph
    reduces = [i for i, n in enumerate(graph.nodes) if n.kind == "reduce"]
    rows = {i: reduction_row_bytes(graph, i) for i in reduces}
    assert rows and all(r is not None and r > 0 for r in rows.values())

    assert rules_for_target(parse_target("llvm"), 6).accept is None
    everything = enumerate_candidates(graph, rules_for_target(parse_target("cuda"), 6))
    limit = min(rows.values())  # a row of `limit` bytes fits, any larger one does not
    small = parse_target({"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": limit})
    kept = enumerate_candidates(graph, rules_for_target(small, 6))
    assert 0 < len(kept) < len(everything)
    for candidate in kept:
        if candidate.is_stock:
            continue  # TVM's own groups are always kept (the stock plan stays feasible)
        for i in candidate.nodes:
            if i in rows and any(c in candidate.nodes for c in graph.nodes[i].consumers):
                assert rows[i] <= limit
    # every primitive is still a candidate on its own
    assert {i for c in kept for i in c.nodes} == set(range(len(graph.nodes)))


def test_default_gpu_schedules_replay_from_their_trace(bert):
    target = parse_target("cuda")
    fused = stock_fusion(bert, target)
    for name in kernel_calls(fused):
        km = kernel_module(fused[name])
        schedule = cuda_build.default_schedule(km, target)
        assert schedule is not None, name
        replay = tvm.s_tir.Schedule(km)
        schedule.trace.apply_to_schedule(replay, remove_postproc=False)
        assert tvm_ffi.structural_equal(replay.mod["main"], schedule.mod["main"]), name


def test_logged_gpu_default_schedule_is_what_gets_built(tmp_path, bert):
    """A default-schedule record (dlight trace) applied from the log yields bound GPU code."""
    from korch_tvm.backend.rewrite import apply_tuning_log

    target = parse_target("cuda")
    fused = stock_fusion(bert, target)
    log = TuningLog(str(tmp_path), target)
    name = next(iter(kernel_calls(fused)))
    km = kernel_module(fused[name])
    schedule = cuda_build.default_schedule(km, target)
    log.commit_run(km, [1e-5], trace=schedule.trace)
    reopened = TuningLog(str(tmp_path), target)
    assert reopened.best_seconds(km) == pytest.approx(1e-5)
    applied = apply_tuning_log(fused, reopened.database, target)
    scheduled = [f for gv, f in applied.functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None
                 and f.attrs.get("tirx.is_scheduled", False)]
    assert len(scheduled) >= 1
    assert "threadIdx" in scheduled[0].script()


@pytest.mark.skipif(NO_DEVICE is None, reason="a GPU is present: costs are measured there")
def test_without_a_gpu_korch_plans_on_predictions_and_builds_cuda(tmp_path, bert):
    from korch_tvm.pipeline.korch import run_korch
    from korch_tvm.pipeline.stock import run_stock

    target = parse_target("cuda")
    # latency alone: within the stock plan's memory the plan does without kernels that keep
    # a matmul's result whole for a reshaping epilogue (memory_plan.py), and the stock path's
    # own plan is costed on another basis (its fused kernels' predictions)
    config = KorchConfig(target=target, tuning_logs=str(tmp_path), trials=8, memory_limit="none")
    optimized, report = run_korch(bert, config)
    tuning = report["tuning"]
    assert tuning["predicted"] == tuning["kernels"] > 0
    assert tuning["measured"] == tuning["trials_run"] == 0
    stock, stock_report = run_stock(bert, config)
    assert report["modelled_ms"] <= stock_report["modelled_ms"] * (1 + 1e-6)

    # the CUDA pipeline must not re-fuse: the planned kernels are the built kernels
    names = {gv.name_hint for gv, f in optimized.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)}
    lowered = tvm.transform.Sequential([cuda_build.relax_pipeline(target)])(optimized)
    after = {gv.name_hint for gv, f in lowered.functions_items()
             if isinstance(f, tvm.tirx.PrimFunc)}
    assert names <= after and not any(n.startswith("fused_") for n in after - names)

    executable = cuda_build.build(optimized, target)
    code = cuda_build.check_device_code(executable, target)
    assert code["kernels"] >= len(names)
    if cuda_build.nvcc_path():
        assert code["stage"] == "compiled" and code["cubin_bytes"] > 0
    else:
        assert code["stage"] == "source"
    assert "\n" not in code["message"]


@pytest.mark.skipif(NO_DEVICE is None, reason="only meaningful without a CUDA runtime")
def test_without_nvcc_the_build_stops_after_codegen_with_one_line(monkeypatch, bert):
    target = parse_target("cuda")
    executable = cuda_build.build(stock_fusion(bert, target), target)
    monkeypatch.setattr(cuda_build, "nvcc_path", lambda: None)
    code = cuda_build.check_device_code(executable, target)
    assert code["stage"] == "source"
    assert "stopped after CUDA code generation" in code["message"]


def test_profiler_settings_for_cuda():
    from korch_tvm.costing.metaschedule_setup import (CUDA_BUILDER_TIMEOUT, evaluator_for_target,
                                                      local_builder)

    target = parse_target("cuda")
    evaluator = evaluator_for_target(target)
    assert not evaluator.enable_cpu_cache_flush and evaluator.number >= 3
    cpu = evaluator_for_target(parse_target("llvm"))
    # the flush comes once per sample: one call per sample, or later calls find the weights warm
    assert cpu.enable_cpu_cache_flush and cpu.number == 1 and cpu.repeat >= 3
    builder = local_builder(target, max_workers=1)
    assert builder.timeout_sec == CUDA_BUILDER_TIMEOUT


def test_device_check_script_dry_run(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "cuda_device_check.py"), "--dry-run",
         "--models", "bert_layer,yolox_nano", "--bench-models", str(tmp_path / "none"),
         "--trials", "0", "--out", str(out),
         "--logs", str(tmp_path / "logs"), "--time-limit", "120"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads((out / "cuda_results.json").read_text())
    assert results["target_tag"] == "cuda-sm_90" and results["dry_run"]
    bert_entry = results["models"][0]
    assert bert_entry["model"] == "bert_layer"
    for path in ("stock", "korch"):
        assert bert_entry[path]["device_code"]["stage"] in ("compiled", "source", "loaded")
    assert "absent" in results["models"][1]["skipped"]
    assert "GPU" in (out / "cuda_results.md").read_text()


# ------------------------------------------------------------------ on a GPU only
@gpu
@pytest.mark.gpu
def test_korch_on_the_gpu_matches_onnxruntime(tmp_path):
    from korch_tvm.pipeline.compile import compile_model

    executable, report = compile_model(str(BERT), target="cuda", korch=True,
                                       tuning_logs=str(tmp_path), trials=0,
                                       verify_tolerance=2e-3)
    assert report["verification"]["passed"]
    assert report["tuning"]["measured"] > 0


@gpu
@pytest.mark.gpu
def test_gpu_default_schedules_are_measured_and_logged(tmp_path, bert):
    from korch_tvm.costing.measure import measure_kernels

    target = parse_target("cuda")
    fused = stock_fusion(bert, target)
    kernels = {name: kernel_module(fused[name]) for name in kernel_calls(fused)}
    log = TuningLog(str(tmp_path), target)
    costs = measure_kernels(kernels, target, log)
    assert all(cost.source == "measured" for cost in costs.values())
    assert all(0 < cost.seconds < 1e-2 for cost in costs.values())
