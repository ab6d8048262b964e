"""korch-tvm run: a compiled library loaded, checked against its inputs, run, timed, profiled."""

import re

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import make_tiny_onnx
from korch_tvm import KorchConfig, compile_model
from korch_tvm.tools.cli import main


@pytest.fixture(scope="module")
def tiny_library(tmp_path_factory):
    """(path of a Korch-compiled library of the tiny model, the model). TVM kernels only:
    whether its matmul would run as a BLAS call depends on this machine's measurements."""
    model = make_tiny_onnx()
    executable, _ = compile_model(model, "llvm", korch=True, verify=False,
                                  config=KorchConfig(library="off"))
    path = tmp_path_factory.mktemp("run") / "tiny.so"
    executable.export_library(str(path))
    return str(path), model


def _reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The tiny model in numpy: softmax, matmul, add, layer normalisation."""
    weights = {t.name: numpy_helper.to_array(t).astype("float64") for t in model.graph.initializer}
    exp = np.exp(x - x.max(-1, keepdims=True))
    a = (exp / exp.sum(-1, keepdims=True)) @ weights["W"] + weights["b"]
    normal = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)
    return normal * weights["gamma"] + weights["beta"]


def test_run_prints_shapes_and_latency_and_saves_outputs_equal_to_the_model(
        tiny_library, tmp_path, capsys):
    library, model = tiny_library
    x = np.random.default_rng(3).standard_normal((16, 32)).astype("float32")
    np.savez(tmp_path / "inputs.npz", x=x)
    saved = tmp_path / "outputs.npz"
    assert main(["run", library, "--inputs", str(tmp_path / "inputs.npz"), "--repeat", "7",
                 "--save-outputs", str(saved), "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "input  x: float32[16x32] (from --inputs)" in out
    assert "output output_0: float32[16x32]" in out
    latency = re.search(r"latency over 7 runs \(after 4 untimed runs\): p10 ([\d.e-]+) ms, "
                        r"median ([\d.e-]+) ms, p90 ([\d.e-]+) ms", out)
    assert latency, out
    p10, median, p90 = map(float, latency.groups())
    assert 0 < p10 <= median <= p90
    with np.load(saved) as outputs:
        assert outputs.files == ["output_0"]
        np.testing.assert_allclose(outputs["output_0"], _reference(model, x), rtol=1e-4,
                                   atol=1e-4)


def test_run_with_random_inputs_and_the_kernel_profile(tiny_library, capsys):
    library, _ = tiny_library
    assert main(["run", library, "--repeat", "3", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "input  x: float32[16x32] (random)" in out
    table = out[out.index("kernel "):].splitlines()
    rows = [line.split() for line in table[1:] if re.match(r"^\S+\s+\d+\s+[\d.]+\s+[\d.]+$", line)]
    kernels = [row for row in rows if row[0] not in ("total", "runtime")]
    assert kernels and all(name.startswith("korch_k") for name, *_ in kernels)
    assert all(int(calls) == 1 for _, calls, _, _ in kernels)  # each kernel once per run
    total = next(row for row in rows if row[0] == "total")
    assert int(total[1]) == sum(int(row[1]) for row in rows if row[0] != "total")
    assert sum(float(row[3]) for row in rows if row[0] != "total") == pytest.approx(100, abs=0.5)


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.ones((16, 31), "float32")},
     "input 'x' in '{path}' is float32[16x31]; the library expects float32[16x32]"),
    ({"x": np.ones((16, 32), "float64")},
     "input 'x' in '{path}' is float64[16x32]; the library expects float32"),
    ({"y": np.ones((16, 32), "float32")},
     "'{path}' does not match the library's inputs (x float32[16x32]): missing x; unknown y"),
])
def test_mismatched_inputs_are_named_in_one_line(tiny_library, tmp_path, capsys, arrays, message):
    library, _ = tiny_library
    path = tmp_path / "inputs.npz"
    np.savez(path, **arrays)
    assert main(["run", library, "--inputs", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"korch-tvm: error: {message.format(path=path)}\n"


def test_a_file_that_is_not_a_library_is_refused(tmp_path, capsys):
    fake = tmp_path / "fake.so"
    fake.write_bytes(b"not a shared object")
    assert main(["run", str(fake)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"korch-tvm: error: cannot load '{fake}' as a TVM library: ")
    assert err.count("\n") == 1
    assert main(["run", str(tmp_path / "missing.so")]) == 2
    assert "library" in capsys.readouterr().err


def test_counts_are_checked_before_loading(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.so"), "--repeat", "0"]) == 2
    assert capsys.readouterr().err == "korch-tvm: error: --repeat must be at least 1, not 0\n"
