"""A compile opens one costing session and both of its paths, fallback included, cost through it."""

import pytest

from conftest import make_tiny_onnx
from korch_tvm.backend.verify import Verification
from korch_tvm.costing.session import CostingSession
from korch_tvm.pipeline import compile as compile_module
from korch_tvm.pipeline import passes
from korch_tvm.pipeline.compile import compile_model, tune_model


@pytest.fixture
def sessions(monkeypatch):
    """Every `CostingSession.open` call, and the session each path pass was handed."""
    opened, used = [], []
    original_open = CostingSession.open

    def counting_open(*args, **kwargs):
        opened.append(args)
        return original_open(*args, **kwargs)

    monkeypatch.setattr(CostingSession, "open", staticmethod(counting_open))
    for name in ("plan_korch", "choose_stock_layout"):
        stage = getattr(passes, name)

        def recording(mod, config, *args, _stage=stage, _name=name, **kwargs):
            used.append((_name, kwargs.get("session", args[0] if args else None)))
            return _stage(mod, config, *args, **kwargs)

        monkeypatch.setattr(passes, name, recording)
    return opened, used


@pytest.mark.parametrize("korch, path", [(True, "plan_korch"), (False, "choose_stock_layout")])
def test_a_compile_opens_one_session(sessions, korch, path):
    opened, used = sessions
    _, report = compile_model(make_tiny_onnx(8, 16), "llvm", korch=korch, time_budget=0)
    assert report["verification"]["passed"]
    assert len(opened) == 1
    assert [name for name, _ in used] == [path]
    assert isinstance(used[0][1], CostingSession)  # handed down, not opened by the pass


def test_tune_opens_one_session(sessions, tmp_path):
    opened, used = sessions
    tune_model(make_tiny_onnx(8, 16), "llvm", korch=False, tuning_logs=str(tmp_path),
               time_budget=0)
    assert len(opened) == 1 and used == []  # tune runs the functions, not the passes


def test_the_stock_fallback_reuses_the_compiles_session(sessions, monkeypatch):
    """A Korch build that fails verification is rebuilt on the stock path within the same
    session (the mismatch is made here: the first verification is reported failed)."""
    opened, used = sessions
    real_verify = compile_module.verify_executable
    verifications = []

    def first_fails(*args, **kwargs):
        result = real_verify(*args, **kwargs)
        verifications.append(result)
        if len(verifications) > 1:
            return result
        return Verification(result.reference, 1.0, 0.5, result.tolerance, False, 0)

    monkeypatch.setattr(compile_module, "verify_executable", first_fails)
    monkeypatch.setattr(compile_module, "_mismatch_message",
                        lambda *args: "verification failed: made so by the test")
    _, report = compile_model(make_tiny_onnx(8, 16), "llvm", korch=True, time_budget=0,
                              fallback_on_mismatch=True)
    assert report["fallback"]["path"] == "stock" and report["verification"]["passed"]
    assert report["fallback"]["reason"] == "verification failed: made so by the test"
    assert len(verifications) == 2 and len(opened) == 1
    assert [name for name, _ in used] == ["plan_korch", "choose_stock_layout"]
    assert used[0][1] is used[1][1]
    assert "kernels_scheduled_from_log" in report["fallback"]["stock"]
