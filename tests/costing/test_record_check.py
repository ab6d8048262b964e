"""Tuned records are checked against their kernel: wrong ones leave the log, the next best serves.

The wrong schedule here is a real one: TVM 0.27's `reverse_compute_at` of a concat into the loop
of the producer of its first half keeps only the iterations that read that producer, so the
copied half is never written (MetaSchedule found and kept this on YOLOX-nano, being fastest).
A TVM that fixes it fails the tests that rely on it: then another wrong schedule is needed.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import te

from korch_tvm.backend.target import parse_target
from korch_tvm.costing.measure import set_aside_wrong_records
from korch_tvm.costing.record_check import TOLERANCE, KernelReference, first_correct
from korch_tvm.costing.tuning_log import RECORD_FILE, TuningLog
from korch_tvm.errors import KorchError
from korch_tvm.kernels.fused import kernel_blocks
from korch_tvm.pipeline.compile import compile_model

TARGET_SPEC = {"kind": "llvm", "mcpu": "generic", "num-cores": 2}
TARGET = parse_target(TARGET_SPEC)


def matmul_then_concat() -> tvm.IRModule:
    """out[:, :4] = A @ W, out[:, 4:] = X: a 1x1 convolution and a concat, as in YOLOX."""
    a = te.placeholder((8, 16), name="A")
    w = te.placeholder((16, 4), name="W")
    x = te.placeholder((8, 4), name="X")
    k = te.reduce_axis((0, 16), name="k")
    product = te.compute((8, 4), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="T")
    out = te.compute((8, 8), lambda i, j: tvm.tirx.if_then_else(
        j < 4, product[i, j], x[i, j - 4]), name="O")
    return tvm.IRModule({"main": te.create_prim_func([a, w, x, out])})


def concat_inside_product_loop(kernel):
    """The wrong schedule: the concat moved under the product's column loop (4 of 8 columns)."""
    schedule = tvm.s_tir.Schedule(kernel)
    _, column, _ = schedule.get_loops(schedule.get_sblock("T"))
    schedule.reverse_compute_at(schedule.get_sblock("O"), column)
    return schedule.trace


def concat_inside_product_loop_unrolled(kernel):
    """The same wrong schedule with its inner loop unrolled: another schedule, as wrong, and
    made only of instructions a tuning log may hold (`trace_policy`)."""
    schedule = tvm.s_tir.Schedule(kernel)
    _, column, _ = schedule.get_loops(schedule.get_sblock("T"))
    schedule.reverse_compute_at(schedule.get_sblock("O"), column)
    schedule.unroll(schedule.get_loops(schedule.get_sblock("O"))[-1])
    return schedule.trace


def rows_in_parallel(kernel):
    """A right schedule: each block's rows in parallel, the concat's columns vectorized."""
    schedule = tvm.s_tir.Schedule(kernel)
    row, _, _ = schedule.get_loops(schedule.get_sblock("T"))
    schedule.parallel(row)
    row, column = schedule.get_loops(schedule.get_sblock("O"))
    schedule.parallel(row)
    schedule.vectorize(column)
    return schedule.trace


def product_kept_in_integers(kernel):
    """A schedule computing wrong values: the product's buffer made int32 (unchecked). Not
    one MetaSchedule makes, so a log refuses it; the check itself is tried on it directly."""
    schedule = tvm.s_tir.Schedule(kernel)
    schedule.unsafe_set_dtype(schedule.get_sblock("T"), 0, "int32")
    return schedule.trace


def test_the_check_finds_unwritten_and_wrong_outputs_and_passes_right_ones():
    kernel = matmul_then_concat()
    reference = KernelReference(kernel)
    a, w, x = reference.inputs
    np.testing.assert_allclose(reference.outputs[0], np.concatenate([a @ w, x], axis=1),
                               rtol=1e-5, atol=1e-5)

    unwritten = reference.check(concat_inside_product_loop(kernel), TARGET)
    assert unwritten.wrong and math.isinf(unwritten.error)
    assert "unwritten" in unwritten.describe()

    truncated = reference.check(product_kept_in_integers(kernel), TARGET)
    assert truncated.wrong and TOLERANCE < truncated.error < math.inf

    right = reference.check(rows_in_parallel(kernel), TARGET)
    assert not right.wrong and right.error < 1e-6


def test_first_correct_stops_at_the_first_right_record():
    kernel = matmul_then_concat()
    traces = [concat_inside_product_loop(kernel), product_kept_in_integers(kernel),
              rows_in_parallel(kernel), concat_inside_product_loop(kernel)]
    records = [type("Record", (), {"trace": trace})() for trace in traces]
    wrong, verdicts = first_correct(kernel, records, TARGET)
    assert wrong == records[:2]  # the fourth, wrong too, is never reached
    assert math.isinf(verdicts[0].error) and math.isfinite(verdicts[1].error)


def log_with_wrong_fastest_records(tmp_path):
    """A log as tuning leaves it: the default record, then two wrong and one right, the wrong
    ones fastest."""
    kernel = matmul_then_concat()
    log = TuningLog(tmp_path, TARGET)
    log.commit_run(kernel, [9e-6] * 3)  # the default schedule
    log.commit_run(kernel, [1e-6] * 3, trace=concat_inside_product_loop(kernel))
    log.commit_run(kernel, [2e-6] * 3, trace=concat_inside_product_loop_unrolled(kernel))
    log.commit_run(kernel, [4e-6] * 3, trace=rows_in_parallel(kernel))
    return kernel, log


def test_wrong_records_leave_the_log_and_the_next_best_is_used(tmp_path):
    kernel, log = log_with_wrong_fastest_records(tmp_path)
    assert [float(r.run_secs[0]) for r in log.ranked_records(kernel, 1)] == [1e-6, 2e-6, 4e-6]
    assert log.ranked_records(kernel, 4) == []  # nothing newer

    assert set_aside_wrong_records(log, kernel, TARGET, "concat", since=1) == 2
    for view in (log, TuningLog(tmp_path, TARGET)):  # this process and a later one
        assert view.best_seconds(kernel) == pytest.approx(4e-6)
        assert view.record_count(kernel) == 2
        assert float(view.best_record(kernel).run_secs[0]) == pytest.approx(4e-6)
        assert view.database.get_top_k(view.database.commit_workload(kernel), 5)[0] \
            .run_secs[0].value == pytest.approx(4e-6)
    rejected = os.path.join(log.directory, RECORD_FILE + ".rejected")
    kept = [json.loads(line)[1][1] for line in open(rejected)]  # the lines, verbatim
    assert kept == [[1e-6] * 3, [2e-6] * 3]
    reasons = open(rejected + ".reasons").read().splitlines()  # one each, in the same order
    assert len(reasons) == 2 and all("concat: it leaves part of its output unwritten" in reason
                                     for reason in reasons)

    # a record logged after the rejection lands on the right line and is checked in turn
    log.commit_run(kernel, [5e-7] * 3, trace=concat_inside_product_loop(kernel))
    assert set_aside_wrong_records(log, kernel, TARGET, "concat", since=2) == 1
    assert TuningLog(tmp_path, TARGET).best_seconds(kernel) == pytest.approx(4e-6)


def test_records_older_than_the_tuning_round_are_not_checked_again(tmp_path):
    kernel, log = log_with_wrong_fastest_records(tmp_path)
    assert set_aside_wrong_records(log, kernel, TARGET, "concat", since=4) == 0
    assert log.best_seconds(kernel) == pytest.approx(1e-6)


def test_a_second_log_object_sees_the_records_set_aside(tmp_path):
    kernel, log = log_with_wrong_fastest_records(tmp_path)
    other = TuningLog(tmp_path, TARGET)  # another process, opened before the rejection
    assert other.best_seconds(kernel) == pytest.approx(1e-6)
    set_aside_wrong_records(log, kernel, TARGET, "concat", since=1)
    assert other.best_seconds(kernel) == pytest.approx(4e-6)
    other.commit_run(kernel, [3e-6] * 3)  # and writes on the rewritten file
    assert TuningLog(tmp_path, TARGET).record_count(kernel) == 3


def test_logs_check_sets_aside_the_wrong_records_of_an_older_log(tmp_path):
    kernel, _ = log_with_wrong_fastest_records(tmp_path)
    result = subprocess.run([sys.executable, "-m", "korch_tvm.tools.cli", "logs", str(tmp_path),
                             "--check", "--target", json.dumps(TARGET_SPEC)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "1 kernels checked; 2 wrong record(s)" in result.stdout
    assert result.stderr.count("leaves part of its output unwritten") == 2
    assert TuningLog(tmp_path, TARGET).best_seconds(kernel) == pytest.approx(4e-6)


def test_a_read_only_log_drops_wrong_records_from_its_view_only(tmp_path, monkeypatch):
    kernel, written = log_with_wrong_fastest_records(tmp_path)
    before = {name: open(os.path.join(written.directory, name), "rb").read()
              for name in os.listdir(written.directory)}
    monkeypatch.setattr("korch_tvm.costing.log_files.LogDirectory._make_directory",
                        lambda self: False)  # as if read-only
    log = TuningLog(tmp_path, TARGET)
    assert set_aside_wrong_records(log, kernel, TARGET, "concat", since=1) == 2
    assert log.best_seconds(kernel) == pytest.approx(4e-6)
    assert {name: open(os.path.join(log.directory, name), "rb").read()
            for name in os.listdir(log.directory)} == before


def matmul_concat_relu_onnx():
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((16, 4)).astype("float32"), "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["product"]),
             helper.make_node("Concat", ["product", "y"], ["joined"], axis=1),
             helper.make_node("Relu", ["joined"], ["out"])]
    graph = helper.make_graph(
        nodes, "matmul_concat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [8, 8])], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_compile_that_fails_verification_sets_aside_the_wrong_record_it_used(tmp_path):
    """A log tuned before records were checked: the whole-model check fails, names the kernel,
    and takes its wrong record out, so the next compile is right."""
    model, logs = matmul_concat_relu_onnx(), str(tmp_path)
    compile_model(model, "llvm", korch=True, tuning_logs=logs)
    log = TuningLog(logs, "llvm")
    # TVM's fusion group of all three, always costed; with the record below the plan takes it
    kernel = next(k.kernel for k in log.kernels() if [b.name_hint for b in
                  kernel_blocks(k.kernel)] == ["matmul", "T_concat", "compute"])
    default_ms = 1e3 * log.best_seconds(kernel)
    schedule = tvm.s_tir.Schedule(kernel)
    _, column = schedule.get_loops(schedule.get_sblock("matmul"))[:2]
    schedule.reverse_compute_at(schedule.get_sblock("T_concat"), column)
    log.commit_run(kernel, [1e-7] * 3, trace=schedule.trace)  # wrong, and fastest

    with pytest.raises(KorchError, match=r"k\d+ .*set aside in the log, so compile again"):
        compile_model(model, "llvm", korch=True, tuning_logs=logs)
    _, report = compile_model(model, "llvm", korch=True, tuning_logs=logs)
    assert report["verification"]["passed"]
    assert TuningLog(logs, "llvm").best_seconds(kernel) * 1e3 == pytest.approx(default_ms)
