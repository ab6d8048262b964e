"""The README's claims that code can check: its load-and-run snippet runs as written, every flag
it names exists, and it stays a guide short enough to read (the deep dives live in docs/)."""

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from korch_tvm import compile_model
from korch_tvm.tools.cli import build_parser

README = Path(__file__).resolve().parents[1] / "README.md"


def _snippet() -> str:
    """The Python block of the README that loads a library."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    loading = [block for block in blocks if "tvm.runtime.load_module" in block]
    assert len(loading) == 1, "the README should have one load-and-run snippet"
    return loading[0]


def _demo_shaped_model() -> onnx.ModelProto:
    """A small model with the demo model's input (hidden_states, 1x64x256 float32)."""
    rng = np.random.default_rng(0)
    bias = numpy_helper.from_array(rng.standard_normal(256).astype("float32"), "bias")
    nodes = [helper.make_node("Add", ["hidden_states", "bias"], ["a"]),
             helper.make_node("Softmax", ["a"], ["output"], axis=-1)]
    graph = helper.make_graph(
        nodes, "demo_shaped",
        [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, [1, 64, 256])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 64, 256])],
        initializer=[bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_the_readme_snippet_runs_a_library_as_written(tmp_path, monkeypatch):
    model = _demo_shaped_model()
    executable, _ = compile_model(model, "llvm", korch=True, verify=False)
    (tmp_path / "out").mkdir()
    executable.export_library(str(tmp_path / "out" / "demo.so"))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_snippet(), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert printed.getvalue().splitlines()[-1] == "(1, 64, 256)"
    shifted = namespace["hidden_states"] + numpy_helper.to_array(model.graph.initializer[0])
    expected = np.exp(shifted - shifted.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(namespace["output"], expected, rtol=1e-5, atol=1e-6)


def _all_flags() -> set[str]:
    parser = build_parser()
    flags = {s for action in parser._actions for s in action.option_strings}
    for action in parser._actions:
        for command in getattr(action, "choices", None) or {}:
            sub = action.choices[command]
            for sub_action in sub._actions:
                flags.update(s for s in sub_action.option_strings if s.startswith("--"))
    return flags


def test_every_flag_the_readme_names_exists():
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", README.read_text()))
    named -= {"--upgrade", "--force-reinstall", "--no-deps"}  # pip's, in the install notes
    unknown = sorted(named - _all_flags())
    assert not unknown, f"README names flags no korch-tvm command has: {unknown}"


@pytest.mark.parametrize("limit", [250])
def test_the_readme_is_a_short_guide(limit):
    assert len(README.read_text().splitlines()) <= limit
