"""korch-tvm bench: statistics, interleaving, ratios and the physical-floor arithmetic.

Fast: nothing here times a real model; the floor is checked on a tiny hand-built Relax model.
"""

import math
import os
import sys

import pytest

from korch_tvm.tools import (bench, bench_compare, bench_floor, bench_stats, bench_summary,
                             engines)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    data = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 7.5]
    for q in (0, 10, 25, 50, 90, 100):
        assert bench_stats.percentile(data, q) == pytest.approx(float(np.percentile(data, q)))
    assert math.isnan(bench_stats.percentile([], 50))


def test_summarize_samples():
    stats = bench_stats.summarize_samples([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stats["median"] == 3.0
    assert stats["p10"] == pytest.approx(1.4)
    assert stats["p90"] == pytest.approx(4.6)
    assert stats["min"] == 1.0 and stats["max"] == 5.0 and stats["n"] == 5
    assert stats["spread"] == pytest.approx((4.6 - 1.4) / 3.0)


def test_paired_ratio_and_verdict():
    stock = [2.0, 2.2, 2.1, 4.0, 2.0]  # one slow moment of the machine (round 4) hits both
    korch = [1.0, 1.1, 1.0, 2.0, 1.0]
    ratio = bench_stats.paired_ratio(stock, korch)
    assert ratio["ratio"] == pytest.approx(2.1 / 1.0)
    assert ratio["p10"] > 1.9 and ratio["p90"] < 2.2
    assert ratio["verdict"] == "faster"
    slower = bench_stats.paired_ratio(korch, stock)
    assert slower["ratio"] < 1 and slower["verdict"] == "slower"
    noisy = bench_stats.paired_ratio([1.0, 1.2, 0.9, 1.1], [1.1, 1.0, 1.0, 1.05])
    assert noisy["verdict"] == "within noise"
    with pytest.raises(ValueError):
        bench_stats.paired_ratio([1.0], [1.0, 2.0])


def test_geomean_ignores_missing():
    assert bench_stats.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert bench_stats.geomean([2.0, None, float("nan"), 8.0]) == pytest.approx(4.0)
    assert math.isnan(bench_stats.geomean([]))


def test_interleaved_samples_time_cap():
    now = [0.0]

    def call():
        now[0] += 1.0

    samples = bench_stats.interleaved_samples({"a": call, "b": call}, 100, warmup=1, min_sample_s=0.0,
                                        max_seconds=10.0, clock=lambda: now[0],
                                        sleep=lambda s: None)
    assert len(samples["a"]) == 5 and len(samples["b"]) == 5  # 2 s a round -> 5 rounds


def test_interleaved_samples_order_number_and_gap():
    now = [0.0]
    calls, sleeps = [], []

    def clock():
        return now[0]

    def runner(name, seconds):
        def call():
            calls.append(name)
            now[0] += seconds
        return call

    runners = {"a": runner("a", 0.004), "b": runner("b", 0.010), "c": runner("c", 0.030)}
    samples = bench_stats.interleaved_samples(runners, 3, warmup=2, min_sample_s=0.02, gap_s=0.001,
                                        clock=clock, sleep=sleeps.append)
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]  # warm-up, per runner
    timed = calls[6:]
    # the same calls per sample for all, so that the fastest lasts 0.02 s: 5; rounds a b c
    one_round = ["a"] * 5 + ["b"] * 5 + ["c"] * 5
    assert timed == one_round * 3
    assert samples["a"] == pytest.approx([0.004] * 3)
    assert samples["b"] == pytest.approx([0.010] * 3)
    assert samples["c"] == pytest.approx([0.030] * 3)
    assert sleeps == [0.001] * 9


def test_interleaved_samples_settle_calls_are_untimed():
    """A sample's first `settle` calls run after the gap and are left out of its time: here the
    first call of each sample is ten times slower (weights back from memory), and the samples
    are the steady calls alone."""
    now, calls, since_gap = [0.0], [], {"a": True, "b": True}

    def runner(name, seconds):
        def call():
            calls.append(name)
            now[0] += seconds * (10 if since_gap[name] else 1)
            since_gap[name] = False
        return call

    def sleep(_seconds):
        for name in since_gap:
            since_gap[name] = True

    runners = {"a": runner("a", 0.004), "b": runner("b", 0.010)}
    samples = bench_stats.interleaved_samples(runners, 2, warmup=1, min_sample_s=0.02, gap_s=0.3,
                                              settle=1, clock=lambda: now[0], sleep=sleep)
    # warm-up 'a' (slow, timed 0.04) and 'b' (0.1) -> 1 call a sample; one settle call each
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 2
    assert samples["a"] == pytest.approx([0.004] * 2)
    assert samples["b"] == pytest.approx([0.010] * 2)
    unsettled = bench_stats.interleaved_samples(runners, 1, warmup=1, min_sample_s=0.02,
                                                gap_s=0.3, clock=lambda: now[0], sleep=sleep)
    assert unsettled["a"][0] > 0.006  # settle=0: the slow first call is in the sample


def test_linear_flops():
    assert bench_floor.linear_flops("relax.matmul", [[64, 256], [256, 1024]], [64, 1024]) \
        == 2 * 64 * 1024 * 256
    # batched matmul: K from the first operand
    assert bench_floor.linear_flops("relax.matmul", [[4, 8, 16], [4, 16, 32]], [4, 8, 32]) \
        == 2 * 4 * 8 * 32 * 16
    # conv2d 3x3, 16 -> 32 channels: 2 * |out| * C_in * 9
    assert bench_floor.linear_flops("relax.nn.conv2d", [[1, 16, 8, 8], [32, 16, 3, 3]],
                              [1, 32, 8, 8]) == 2 * 32 * 64 * 16 * 9
    # depthwise: weight [C, 1, 3, 3] -> 9 MACs per output element
    assert bench_floor.linear_flops("relax.nn.conv2d", [[1, 32, 8, 8], [32, 1, 3, 3]],
                              [1, 32, 8, 8]) == 2 * 32 * 64 * 9
    # conv2d_transpose: weight [C_in, C_out, k, k]; each input element -> C_out * k * k MACs
    assert bench_floor.linear_flops("relax.nn.conv2d_transpose", [[1, 8, 4, 4], [8, 4, 2, 2]],
                              [1, 4, 8, 8]) == 2 * 8 * 16 * 4 * 4
    with pytest.raises(ValueError):
        bench_floor.linear_flops("relax.add", [[1], [1]], [1])


def test_floor_seconds_picks_the_binding_term():
    compute = bench_floor.floor_seconds(flops=1e9, min_bytes=1e6, peak_flops=1e11, bandwidth=1e10)
    assert compute["seconds"] == pytest.approx(0.01) and compute["bound"] == "compute"
    memory = bench_floor.floor_seconds(flops=1e6, min_bytes=1e9, peak_flops=1e11, bandwidth=1e10)
    assert memory["seconds"] == pytest.approx(0.1) and memory["bound"] == "memory"
    report = bench_floor.floor_report({"linear_flops": 1e9, "min_bytes": 1e6},
                                {"matmul_peak_flops": 1e11, "bandwidth_bytes_per_s": 1e10},
                                {"korch": 50.0, "stock": None})
    assert report["ms"] == pytest.approx(10.0)
    assert report["latency_over_floor"] == {"korch": pytest.approx(5.0), "stock": None}


def test_model_work_on_a_tiny_model():
    tvm = pytest.importorskip("tvm")
    import numpy as np
    from tvm import relax

    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 16), "float32"))
    weight = relax.const(np.ones((16, 32), "float32"))
    gamma = relax.const(np.ones((32,), "float32"))
    beta = relax.const(np.zeros((32,), "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit(relax.op.matmul(x, weight))
            z = builder.emit(relax.op.nn.layer_norm(y, gamma, beta, axes=[-1]))
            out = builder.emit_output(relax.op.nn.relu(z))
        builder.emit_func_output(out)
    work = bench_floor.model_work(builder.get())
    assert work["linear_primitives"] == 1
    assert work["linear_flops"] == 2 * 8 * 32 * 16
    assert work["input_bytes"] == 8 * 16 * 4
    assert work["output_bytes"] == 8 * 32 * 4
    # the weights, plus the scalar constants fission introduces (epsilon, 1/N)
    assert (16 * 32 + 32 + 32) * 4 <= work["weight_bytes"] <= (16 * 32 + 32 + 32) * 4 + 64
    assert work["min_bytes"] == work["input_bytes"] + work["output_bytes"] + work["weight_bytes"]
    assert work["other_elementwise_ops"] > 0
    assert tvm is not None


def test_machine_info_has_the_basics():
    info = bench_floor.machine_info()
    assert info["cores"] >= 1 and info["cpu"]


def test_suite_table_from_a_result(tmp_path):
    sys.path.insert(0, os.path.join(HERE, "..", "bench"))
    try:
        import run_suite
    finally:
        sys.path.pop(0)
    samples = {"stock": [2.0, 2.1, 2.0], "korch": [1.0, 1.0, 1.1], "onnxruntime": [1.5, 1.5, 1.6],
               "openvino": [0.8, 0.8, 0.9]}
    phase = {"compile_seconds": 10.0, "trials_run": 8, "peak_rss_mb": 300.0,
             "tuning": {"from_log": 0}, "kernel_calls": 12, "modelled_ms": 2.0,
             "verification": {"max_rel_error": 1e-7}}
    result = {
        "model": "tiny.onnx", "date": "2025-01-01 00:00:00", "machine": bench_floor.machine_info(),
        "tvm_version": "x", "onnxruntime_version": "y", "target": "llvm",
        "target_tag": "llvm-test-2c", "threads": 2, "trials_budget": 8,
        "latency_ms": {k: bench_stats.summarize_samples(v) for k, v in samples.items()},
        "ratios": {"korch_vs_stock": bench_stats.paired_ratio(samples["stock"], samples["korch"]),
                   "korch_vs_onnxruntime": bench_stats.paired_ratio(samples["onnxruntime"],
                                                              samples["korch"]),
                   "korch_vs_openvino": bench_stats.paired_ratio(samples["openvino"],
                                                                 samples["korch"])},
        "openvino_version": "2026.4.1",
        "openvino": {"settings": {"device": "CPU", "INFERENCE_NUM_THREADS": 2}},
        "compile": {"stock": {"cold": phase, "warm": {**phase, "trials_run": 0}},
                    "korch": {"cold": phase,
                              "warm": {**phase, "trials_run": 0, "layout": "NHWC"}}},
        "korch_plan": {"candidates": 40, "distinct_kernels": 30, "pruned": 3,
                       "kernels_chosen": 9, "solver_status": "optimal", "max_gap": 0.0,
                       "modelled_ms": 1.0},
        "inference_memory_mb": {"stock": 10.0, "korch": 9.0, "onnxruntime": 20.0},
        "work": {"linear_flops": 2e9, "min_bytes": 2 ** 20},
        "floor": {"ms": 0.5, "bound": "compute",
                  "latency_over_floor": {"korch": 2.0, "stock": 4.0}},
        "kind_profile_ms": {"stock": {"conv1x1": 1.5, "memory": 0.4, "runtime": 0.1},
                            "korch": {"conv1x1": 0.75, "memory": 0.25, "runtime": 0.05},
                            "onnxruntime": {"conv1x1": 1.25, "memory": 0.25}},
    }
    directory = tmp_path / "llvm"
    directory.mkdir()
    bench_summary.write_json(str(directory / "tiny.json"), result)
    summary = run_suite.aggregate(str(directory), str(tmp_path / "llvm"), {"big": "too slow"})
    assert summary["geomean_korch_vs_stock"] == pytest.approx(2.0)
    assert summary["geomean_korch_vs_ort"] == pytest.approx(1.5)
    assert summary["geomean_korch_vs_openvino"] == pytest.approx(0.8)
    table = (tmp_path / "llvm.md").read_text()
    assert "| tiny |" in table and "2.00×" in table and "big: too slow" in table
    assert "| OpenVINO ms |" in table and "| 0.800 |" in table and "0.80× [" in table
    assert "OpenVINO 2026.4.1 (device CPU, INFERENCE_NUM_THREADS 2)" in table
    assert "| tiny | exact | NCHW / NHWC |" in table  # a compile without "layout" was NCHW
    assert "| tiny | korch | 0.75 | 0.00 | 0.00 | 0.00 | 0.00 | 0.25 | 0.05 | 1.05 |" in table
    assert "| tiny | onnxruntime | 1.25 |" in table
    # stock's 2.0 ms of which 1.5 in convolutions: orchestration can buy at most 2.0 / 1.5
    assert summary["models"][0]["orchestration_ceiling"] == pytest.approx(4 / 3)
    assert "tiny 1.33×; geomean **1.33×**" in table


def test_bench_and_retime_a_tiny_conv_model_end_to_end(tmp_path):
    """The whole harness once, small: both compiles (in both layouts), timing, the kernel
    profile joined with the isolated costs, and a re-time of the kept libraries."""
    import onnx

    from test_weight_packing import conv_block_onnx

    model = tmp_path / "conv.onnx"
    onnx.save(conv_block_onnx(8, 10), str(model))
    reports = tmp_path / "reports"
    timing = bench_stats.TimingProtocol(repeat=2, warmup=1, min_sample_ms=1.0, gap_ms=1.0)
    result = bench_compare.bench_model(str(model), {"tuning_logs": str(tmp_path / "logs")},
                                       warm=False, memory=False, reports_dir=str(reports),
                                       timing=timing)
    for path in ("stock", "korch"):
        compiled = result["compile"][path]["cold"]
        # Korch may also plan a layout per region (region_layout.py), the stock path never
        planned = {"NCHW", "NHWC"} | ({"mixed"} if path == "korch" else set())
        assert compiled["layout"] in planned
        # untuned, a layout whose optimistic plan models above the first one's stops early
        # (pipeline/korch_costs.py): it is said so, never silently missing
        stopped = set(compiled["layouts_stopped"])
        assert not stopped or path == "korch"
        assert not stopped & set(compiled["layout_modelled_ms"])
        assert {"NCHW", "NHWC"} <= set(compiled["layout_modelled_ms"]) | stopped
        assert set(compiled["layout_modelled_ms"]) <= planned
        assert compiled["layout_modelled_ms"][compiled["layout"]] == pytest.approx(
            min(compiled["layout_modelled_ms"].values()))
        assert len(result["samples_ms"][path]) == 2
        # every kernel that ran is joined with its isolated cost: the isolated times add up
        # to the modelled latency
        rows = result["in_model"]["kernels"][path]
        assert sum(r["isolated_ms"] for r in rows) == pytest.approx(compiled["modelled_ms"])
    assert any("layout" in line for line in bench_summary.summary_lines(result))
    # the stock run's memory-bound kernels (pads, layout changes) take some of its time
    assert result["orchestration_ceiling"] > 1.0
    assert any("orchestration ceiling" in line for line in bench_summary.summary_lines(result))
    if engines.import_openvino() is not None:  # timed in the same rounds, checked against ORT
        assert len(result["samples_ms"]["openvino"]) == 2
        assert result["openvino"]["settings"]["PERFORMANCE_HINT"] == "LATENCY"
        assert result["openvino"]["verification"]["passed"]
        assert "korch_vs_openvino" in result["ratios"]
        assert any(line.startswith("  OpenVINO ") for line in bench_summary.summary_lines(result))
    retimed = bench_compare.retime(str(model), result, str(reports), with_ort=False,
                                   timing=timing)
    assert retimed["earlier_timings"][0]["samples_ms"] == result["samples_ms"]
    assert retimed["in_model"]["kernels"]["korch"], "the re-time profiles the kernels again"


def _recorded_result():
    """A bench result as `korch-tvm bench --json` writes it, cut to what the plot reads."""
    samples = {"stock": [2.0, 2.1, 2.4, 2.0], "korch": [1.0, 1.2, 1.1, 1.0],
               "onnxruntime": [1.5, 1.5, 1.9, 1.6], "openvino": [1.3, 1.4, 1.3, 1.3]}
    return {"model": "tiny.onnx", "threads": 2, "trials_budget": 64, "trials_per_kernel": None,
            "machine": {"cpu": "Test CPU", "cores": 2},
            "latency_ms": {k: bench_stats.summarize_samples(v) for k, v in samples.items()}}


def _png_size(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_bench_writes_its_latency_plot_from_a_recorded_result(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from korch_tvm.report import bench_plot

    result = _recorded_result()
    path = tmp_path / "tiny.png"
    assert bench_plot.write_bench_plot(result, str(path)) == str(path)
    width, height = _png_size(path)
    assert 300 <= width <= 2000 and 300 <= height <= 1200, (width, height)
    assert bench_plot.plot_title(result).startswith(
        "Latency per engine, median and p10-p90 (64 trials per compile, 2 threads, Test CPU")
    assert [key for key, _, _ in bench_plot.engine_order(bench_plot.bench_latencies(result))] == [
        "stock", "korch", "onnxruntime", "openvino"]
    # the CLI's default: beside the JSON
    args = type("Args", (), {"json": str(tmp_path / "out.json"), "quiet": True, "plot": None,
                             "draw_plot": True, "model": "m/tiny.onnx"})()
    result.update(ratios={}, compile={}, tvm_version="x")
    bench._write_outputs(args, result)
    assert _png_size(tmp_path / "out.png")[0] > 300 and (tmp_path / "out.json").exists()
    assert bench.plot_path(None, None, "m/tiny.onnx") == "tiny.bench.png"


def test_suite_rows_plot_with_the_same_drawing():
    from korch_tvm.report import bench_plot

    stats = bench_stats.summarize_samples([1.0, 2.0, 3.0])
    rows = {"models": [{"model": "a", "stock_ms": stats, "korch_ms": stats, "ort_ms": None,
                        "trials_budget": 128, "korch_vs_stock": 1.0}]}
    assert bench_plot.suite_latencies(rows) == [("a", {"stock": stats, "korch": stats})]
    assert "128 trials per compile" in bench_plot.plot_title(rows)


def test_bench_plot_without_matplotlib_says_so_and_writes_nothing(tmp_path, monkeypatch):
    import builtins

    from korch_tvm.report import bench_plot

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    said = []
    path = tmp_path / "tiny.png"
    assert bench_plot.write_bench_plot(_recorded_result(), str(path), say=said.append) is None
    assert said == [bench_plot.MISSING_MATPLOTLIB] and "make install" in said[0]
    assert not path.exists() and list(tmp_path.iterdir()) == []
