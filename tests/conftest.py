"""Shared test set-up: explicit thread count, the bundled models, small ONNX builders."""

import os
import pathlib
import sys

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import pytest  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# Tests mirror the package's stages (tests/<stage>/test_*.py) and share builders by module name
# (`from test_weight_packing import conv_block_onnx`), which pytest's default import mode allows
# within the folders it puts on sys.path: put every stage folder there before any is collected.
for _folder in sorted(pathlib.Path(__file__).resolve().parent.iterdir()):
    if _folder.is_dir() and any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

REPO = pathlib.Path(__file__).resolve().parents[1]
MODELS = REPO / "models"


def host_has_shipped_logs() -> bool:
    """Whether tuning_logs/ holds this CPU's records (else a compile would measure everything)."""
    from korch_tvm.backend.target import parse_target, target_tag

    return (REPO / "tuning_logs" / target_tag(parse_target("llvm"))).is_dir()


def make_tiny_onnx(rows: int = 16, cols: int = 32, seed: int = 0) -> onnx.ModelProto:
    """Softmax -> MatMul -> Add -> LayerNormalization: a composite op on each side of a matmul."""
    rng = np.random.default_rng(seed)
    weights = [numpy_helper.from_array(a.astype("float32"), n) for n, a in [
        ("W", rng.standard_normal((cols, cols))), ("b", rng.standard_normal(cols)),
        ("gamma", 1 + 0.1 * rng.standard_normal(cols)), ("beta", 0.1 * rng.standard_normal(cols))]]
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
             helper.make_node("MatMul", ["s", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node("LayerNormalization", ["a", "gamma", "beta"], ["y"], axis=-1,
                              epsilon=1e-5)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                           [rows, cols])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture
def tiny_onnx_path(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(make_tiny_onnx(), str(path))
    return path


@pytest.fixture(autouse=True, scope="session")
def _no_seed_logs():
    """No test is seeded from the shipped logs unless it asks (`KORCH_TVM_SEED_LOGS`): whether
    they seed a log depends on this CPU's vector ISA, and tests must behave alike on any CPU."""
    saved = os.environ.get("KORCH_TVM_SEED_LOGS")
    os.environ["KORCH_TVM_SEED_LOGS"] = ""
    yield
    _restore("KORCH_TVM_SEED_LOGS", saved)


@pytest.fixture(autouse=True, scope="session")
def _cold_unless_asked():
    """Kernels are timed cold (operands flushed) unless a test asks for the L3 state: "auto"
    decides by this machine's L3 size (costing/cache_state.py), which names the log directory,
    and tests must behave alike on any machine (subprocesses inherit the setting)."""
    saved = os.environ.get("KORCH_TVM_L3_BYTES")
    os.environ["KORCH_TVM_L3_BYTES"] = "0"  # unknown: cold
    yield
    _restore("KORCH_TVM_L3_BYTES", saved)


@pytest.fixture(autouse=True, scope="session")
def _no_call_overhead_unless_asked():
    """Plans are priced without the VM's time per kernel call unless a test asks for it: the
    measured value (costing/call_overhead.py) differs from machine to machine, and a test's
    plan must not (subprocesses inherit the setting)."""
    saved = os.environ.get("KORCH_TVM_CALL_OVERHEAD_US")
    os.environ["KORCH_TVM_CALL_OVERHEAD_US"] = "0"
    yield
    _restore("KORCH_TVM_CALL_OVERHEAD_US", saved)


@pytest.fixture(autouse=True)
def _private_log_cache(tmp_path_factory):
    """No test writes into the real home cache (the CLI's default log root), and none sees
    another's records there: each test has a cache of its own (subprocesses inherit it)."""
    saved = os.environ.get("KORCH_TVM_CACHE_DIR")
    os.environ["KORCH_TVM_CACHE_DIR"] = str(tmp_path_factory.mktemp("korch-cache"))
    yield
    _restore("KORCH_TVM_CACHE_DIR", saved)


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@pytest.fixture(autouse=True)
def _fresh_korch_logging():
    """A CLI run in-process configures the `korch_tvm` loggers for a terminal; undo that after
    each test so no test sees another's handlers or levels."""
    import logging

    yield
    for name in ("korch_tvm", "korch_tvm.metaschedule"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [h for h in logger.handlers if isinstance(h, logging.NullHandler)]
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


@pytest.fixture(scope="session")
def blas_extension():
    """The BLAS extension built (or reused: a no-op after `make install`) and loaded, once per
    test session; skips where this machine cannot build it. It lives here, not in a conftest
    of tests/library/, because test modules import this conftest by name."""
    from korch_tvm.library import LibraryBuildError, build_blas_extension, load_blas_extension

    try:
        path = build_blas_extension()
    except LibraryBuildError as error:
        pytest.skip(f"the BLAS extension cannot be built here: {error}")
    assert load_blas_extension(), f"built {path} but it did not load"
    return path
