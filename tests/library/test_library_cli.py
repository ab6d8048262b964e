"""--library on explain and bench, and the report line about library kernels."""

from korch_tvm.report.text import _plan_lines
from korch_tvm.tools.cli import build_parser
from korch_tvm.tools.flags import config_values


def test_explain_and_bench_take_library_like_compile():
    parser = build_parser()
    for command in ("compile", "explain", "bench"):
        args = parser.parse_args([command, "model.onnx", "--library", "off"])
        assert args.library == "off", command
        assert config_values(args)["library"] == "off", command
        assert parser.parse_args([command, "model.onnx"]).library == "auto", command


def test_the_plan_lines_count_library_calls_and_their_modelled_time():
    plan = {"kernels_chosen": 3, "candidates": 9, "modelled_ms": 1.5, "kernels": [
        {"implementation": "openblas.sgemm+bias_n+gelu_erf", "ms": 0.25},
        {"implementation": "tvm", "ms": 1.0},
        {"implementation": "openblas.sbgemm", "ms": 0.125}]}
    lines = [line for line in _plan_lines(plan) if "library kernels" in line]
    assert lines == ["  library kernels: 2 of 3 are library calls, modelled 0.375 ms "
                     "(openblas.sbgemm, openblas.sgemm+bias_n+gelu_erf)"]
    plan["kernels"] = [{"implementation": "tvm", "ms": 1.0}]
    assert not [line for line in _plan_lines(plan) if "library" in line]
