"""OpenVINO as a benchmark baseline: it runs the same ONNX file with the stated settings, its
outputs agree with ONNX Runtime's, and a result names it, its settings and its check.

Skipped where openvino (the `openvino` extra) or onnxruntime is not installed.
"""

import json

import numpy as np
import pytest

from conftest import make_tiny_onnx
from korch_tvm.tools import bench_compare, bench_stats, bench_summary, engines

openvino = pytest.importorskip("openvino")
pytest.importorskip("onnxruntime")


@pytest.fixture
def tiny_model(tmp_path):
    import onnx

    path = tmp_path / "tiny.onnx"
    onnx.save(make_tiny_onnx(), str(path))
    return str(path)


def test_openvino_outputs_match_onnxruntime_on_a_tiny_model(tiny_model):
    inputs = engines.model_inputs(tiny_model)
    ort = engines.ort_session(tiny_model, 2).run(None, inputs)
    compiled = engines.openvino_model(tiny_model, 2, inputs)
    outputs = engines.openvino_runner(compiled, inputs)()
    assert len(outputs) == len(ort) == 1
    assert outputs[0].shape == ort[0].shape == (16, 32) and outputs[0].dtype == np.float32
    np.testing.assert_allclose(outputs[0], ort[0], rtol=1e-4, atol=1e-4)
    check = engines.openvino_verification(tiny_model, inputs, 2)
    assert check["passed"] and check["reference"] == "onnxruntime"
    assert check["max_rel_error"] < 1e-4 == check["tolerance"]  # float32's default tolerance
    # the settings the result states are the ones the compiled model has
    assert int(compiled.get_property("INFERENCE_NUM_THREADS")) == 2
    assert str(compiled.get_property("PERFORMANCE_HINT")).endswith("LATENCY")
    assert compiled.get_property("INFERENCE_PRECISION_HINT") == openvino.Type.f32


def test_a_result_names_openvino_its_settings_and_its_check(tiny_model, tmp_path):
    runtimes = bench_compare.Runtimes(tiny_model, threads=2)
    inputs = engines.model_inputs(tiny_model)
    result = {}
    bench_compare._foreign_settings_into(result, runtimes, inputs)
    bench_summary.write_json(str(tmp_path / "result.json"), result)
    written = json.loads((tmp_path / "result.json").read_text())
    assert written["openvino"]["version"] == engines.openvino_version()
    assert openvino.__version__.startswith(written["openvino"]["version"])
    assert written["openvino"]["settings"] == {
        "device": "CPU", "INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32"}
    assert written["openvino"]["verification"]["passed"]
    assert written["onnxruntime"]["settings"]["intra_op_num_threads"] == 2
    lines = bench_summary._foreign_runtime_lines(result)  # what the command prints
    assert lines[1] == (f"  OpenVINO {engines.openvino_version()}: device CPU, "
                        "INFERENCE_NUM_THREADS 2, PERFORMANCE_HINT LATENCY, "
                        "INFERENCE_PRECISION_HINT f32")
    assert "outputs vs ONNX Runtime" in lines[2] and "passed" in lines[2]


def test_openvino_and_ort_are_timed_in_the_same_rounds(tiny_model):
    inputs = engines.model_inputs(tiny_model)
    runners = engines.engine_runners(tiny_model, {}, inputs, 2, with_openvino=True)
    assert list(runners) == ["onnxruntime", "openvino"]
    protocol = bench_stats.TimingProtocol(repeat=3, warmup=1, min_sample_ms=0.1, gap_ms=0.0)
    samples = bench_stats.time_interleaved(runners, protocol)
    assert {name: len(values) for name, values in samples.items()} == {
        "onnxruntime": 3, "openvino": 3}
    assert all(value > 0 for values in samples.values() for value in values)


def test_korch_over_openvino_sits_beside_korch_over_ort():
    samples = {"stock": [2.0, 2.0], "korch": [1.0, 1.0], "onnxruntime": [1.5, 1.5],
               "openvino": [0.5, 0.5]}
    ratios = bench_compare._ratios(samples)
    assert list(ratios) == ["korch_vs_stock", "korch_vs_onnxruntime", "korch_vs_openvino",
                            "stock_vs_onnxruntime", "stock_vs_openvino"]
    assert ratios["korch_vs_openvino"]["ratio"] == pytest.approx(0.5)
    assert ratios["korch_vs_onnxruntime"]["ratio"] == pytest.approx(1.5)


def test_missing_openvino_is_one_line_and_the_rest_still_runs(monkeypatch, tiny_model):
    monkeypatch.setattr(engines, "import_openvino", lambda: None)
    said = []
    runtimes = bench_compare.Runtimes(tiny_model).available(said.append)
    assert said == [engines.OPENVINO_MISSING] and "[openvino]" in said[0]
    assert runtimes.with_ort and not runtimes.with_openvino
    assert runtimes.foreign() == ("onnxruntime",)
    said.clear()  # asked to leave it out: nothing to say
    bench_compare.Runtimes(tiny_model, with_openvino=False).available(said.append)
    assert said == []


def test_no_openvino_flag_leaves_it_out():
    from korch_tvm.tools.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["bench", "m.onnx"]).openvino is True
    assert parser.parse_args(["bench", "m.onnx", "--no-openvino"]).openvino is False
