"""The cache state kernels are timed from (costing/cache_state.py): how it is chosen, the
eviction it runs before each timed call, and the runner, log and library times that follow it."""

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper

from korch_tvm.config import KorchConfig
from korch_tvm.costing import cache_state
from korch_tvm.costing.cache_state import (EVICT_FUNCTION, FLUSH_FUNCTION, L3_VARIABLE,
                                           cache_bytes, choose, for_model, model_footprint,
                                           preprocessing)
from korch_tvm.costing.runners import local_runner, runner_cache_state
from korch_tvm.costing.session import CostingSession
from korch_tvm.backend.target import target_tag
from korch_tvm.errors import KorchError
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.pipeline.compile import compile_model
from korch_tvm.report.text import summary_lines

from conftest import make_tiny_onnx
from test_measure import TARGET, legalized_kernels

WEIGHT_BYTES, ROW_BYTES = 256 * 256 * 4, 256 * 4


def one_matmul_module():
    """x (1x256) @ W (256x256): 1 KiB in, 256 KiB of weight, 1 KiB out."""
    weight = numpy_helper.from_array(np.ones((256, 256), "float32"), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return import_onnx(model)


def fake_caches(tmp_path, sizes):
    """A sysfs cache directory: index0.. with level, type and size as Linux writes them."""
    for index, (level, kind, size) in enumerate(sizes):
        entry = tmp_path / f"index{index}"
        entry.mkdir()
        (entry / "level").write_text(f"{level}\n")
        (entry / "type").write_text(f"{kind}\n")
        (entry / "size").write_text(f"{size}\n")
    return str(tmp_path)


def test_cache_sizes_are_read_from_sysfs_and_none_where_it_says_nothing(tmp_path):
    root = fake_caches(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"),
                                  (2, "Unified", "2048K"), (3, "Unified", "260M")])
    assert cache_bytes(1, root) == 48 << 10 and cache_bytes(2, root) == 2 << 20
    assert cache_bytes(3, root) == 260 << 20 and cache_bytes(4, root) is None
    assert cache_bytes(3, str(tmp_path / "missing")) is None


def relu_chain_module():
    """x -> a = relu(x) -> b = relu(a) -> c = a + b -> d = relu(c), rows of 1 KiB: x, a, b
    and c are alive at once when c is bound; a and b are dead by the time d is."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["d"])]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [1, 256])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return import_onnx(model)


def test_the_footprint_counts_weights_once_and_the_activations_alive_at_the_peak():
    assert model_footprint(one_matmul_module()) == WEIGHT_BYTES + 2 * ROW_BYTES
    assert model_footprint(relu_chain_module()) == 4 * ROW_BYTES  # not all five tensors


def test_a_model_within_a_fifth_of_the_l3_is_timed_from_it_and_a_larger_one_cold(monkeypatch):
    mod = one_matmul_module()
    footprint = model_footprint(mod)
    config = KorchConfig(target=TARGET)
    assert config.cache_state == "auto"
    for l3, state in [(5 * footprint, "l3"), (5 * footprint - 5, "cold"), (0, "cold")]:
        monkeypatch.setenv(L3_VARIABLE, str(l3))
        choice = choose(config, mod)
        assert choice.state == state and for_model(config, mod).cache_state == state
        assert choice.footprint_bytes == footprint and choice.l3_bytes == (l3 or None)
    monkeypatch.setenv(L3_VARIABLE, str(1 << 40))
    assert choose(config, mod).reason == f"the model's 0 MiB fit a fifth of the {1 << 20} MiB L3"
    monkeypatch.setenv(L3_VARIABLE, "")  # not set: what sysfs says
    monkeypatch.setattr(cache_state, "cache_bytes", lambda level: 5 * footprint)
    assert choose(config, mod).state == "l3"
    monkeypatch.setenv(L3_VARIABLE, "32M")
    with pytest.raises(KorchError, match="KORCH_TVM_L3_BYTES must be a whole number of bytes"):
        choose(config, mod)
    # chosen by the user, or measured elsewhere: as before
    assert for_model(config.with_changes(cache_state="cold"), mod).cache_state == "cold"
    remote = config.with_changes(rpc_tracker="h:9", rpc_key="k")
    assert for_model(remote, mod).cache_state == "cold"
    assert choose(remote.with_changes(cache_state="l3"), mod).state == "cold"  # not this CPU
    with pytest.raises(KorchError, match="--cache-state"):
        KorchConfig(cache_state="warm")


def test_the_eviction_reads_every_line_of_its_buffer_on_every_pool_thread():
    sums = cache_state._parallel_reader(2, 4096)()  # one float of 1.0 in each of 64 lines
    assert sums.numpy().tolist() == [64.0, 64.0]
    assert preprocessing("l3", 2) == EVICT_FUNCTION and preprocessing("cold", 2) == FLUSH_FUNCTION
    assert preprocessing("warm", 2) == ""
    tvm.get_global_func(EVICT_FUNCTION)(0, tvm.runtime.tensor(np.zeros(4, "float32")))


def test_a_session_timing_from_the_l3_has_its_runner_and_log(tmp_path):
    config = KorchConfig(target=TARGET, tuning_logs=str(tmp_path), cache_state="l3")
    kernel = legalized_kernels(8)["add"]
    with CostingSession.open(config) as session:
        assert session.tuning_log.directory.endswith("-2c-l3")
        assert runner_cache_state(session.runner()) == "l3"
        [cost] = session.profile({"add": kernel}).costs.values()
        assert session.tuning_log.best_seconds(kernel) == cost.seconds
    assert cost.source == "measured" and 0 < cost.seconds < 1e-2, cost
    with CostingSession.open(config.with_changes(cache_state="cold")) as cold:
        assert runner_cache_state(cold.runner()) == "cold"
        assert not cold.tuning_log.has_record(kernel)  # the l3 record is not a cold one
    assert {runner_cache_state(local_runner(TARGET, cache_state=s)) for s in
            ("cold", "l3", "warm")} == {"cold", "l3", "warm"}


def test_a_compile_of_a_model_within_a_fifth_of_the_l3_times_from_it_and_says_so(
        tmp_path, monkeypatch):
    monkeypatch.setenv(L3_VARIABLE, str(1 << 30))
    executable, report = compile_model(make_tiny_onnx(8, 16), korch=True,
                                       tuning_logs=str(tmp_path), time_budget=30.0)
    assert report["cache_state"]["state"] == "l3" and report["verification"]["passed"]
    assert report["cache_state"]["l3_bytes"] == 1 << 30
    assert [path.name for path in tmp_path.iterdir()] == [target_tag(TARGET) + "-l3"]
    assert report["tuning"]["measured"] > 0
    assert "  kernels timed with their operands in the L3 (the model's 0 MiB fit a fifth of the " \
           "1024 MiB L3)" in summary_lines(report)
