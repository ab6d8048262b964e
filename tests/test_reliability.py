"""The reliability matrix: every kind of bad input or failure gives one clear line or a safe
fallback, never a traceback, and never loses a tuning record already written."""

import json
import logging
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

from conftest import MODELS, make_tiny_onnx
from korch_tvm.config import KorchConfig
from korch_tvm.errors import KorchError
from korch_tvm.kernels.fused import build_partition_module
from korch_tvm.tools import cli

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "python" / "korch_tvm"
RECORDS = "database_tuning_record.json"


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "korch_tvm.tools.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TVM_NUM_THREADS": "1"})


def cli_in_process(capsys, *args):
    """(exit code, stdout, stderr) of `korch-tvm ARGS` run in this process (no TVM re-import)."""
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, stderr, *fragments):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("korch-tvm: error: "), stderr
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def record_lines(root):
    (directory,) = [d for d in pathlib.Path(root).iterdir() if d.is_dir()]
    return (directory / RECORDS).read_text().splitlines()


# ----------------------------------------------------------------------------- bad models
def test_malformed_onnx_is_one_line(tmp_path, capsys):
    model = make_tiny_onnx()
    model.graph.node[1].input[0] = "no_such_tensor"  # reads a value nothing produces
    path = tmp_path / "bad.onnx"
    path.write_bytes(model.SerializeToString())
    assert_one_line_error(*cli_in_process(capsys, "explain", path, "--predict-only")[::2],
                          "malformed")


def test_truncated_file_is_one_line(tmp_path, capsys):
    data = make_tiny_onnx().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    assert_one_line_error(*cli_in_process(capsys, "explain", path)[::2], "cut.onnx")


def test_operator_tvm_cannot_import_is_named(tmp_path, capsys):
    node = helper.make_node("Det", ["x"], ["y"])
    graph = helper.make_graph([node], "det", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "det.onnx"
    onnx.save(model, str(path))
    code, _, err = cli_in_process(capsys, "explain", path, "--predict-only")
    assert_one_line_error(code, err, "Det")


@tvm.register_global_func("korch_test.double", override=True)
def _double(x, out):
    out.copyfrom(x.numpy() * 2)


def test_op_korch_cannot_fuse_stays_as_in_the_stock_path():
    from korch_tvm.pipeline.compile import compile_model
    from korch_tvm.report.text import summary_lines

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.exp(x))
            b = bb.emit(relax.call_dps_packed("korch_test.double", [a],
                                              out_ty=relax.TensorType((8, 16), "float32")))
            out = bb.emit_output(bb.emit(relax.op.nn.softmax(b)))
        bb.emit_func_output(out)
    _, report = compile_model(bb.get(), korch=True, time_budget=0)
    assert report["plan"]["opaque_ops"] == ["relax.call_dps_packed"]
    assert report["verification"]["passed"]
    assert any("opaque ops kept as in the stock path: relax.call_dps_packed" in line
               for line in summary_lines(report))


def test_symbolic_shape_needs_a_static_one(tmp_path, capsys):
    model = make_tiny_onnx()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dynamic.onnx"
    onnx.save(model, str(path))
    code, _, err = cli_in_process(capsys, "explain", path, "--predict-only")
    assert_one_line_error(code, err, "dynamic shape", "--input-shape x:")
    code, out, _ = cli_in_process(capsys, "explain", path, "--predict-only", "--input-shape",
                                  "x:16x32", "-q")
    assert code == 0 and "kernels (execution order)" in out


# ----------------------------------------------------------------------------- tuning logs
@pytest.fixture(scope="module")
def shared_log(tmp_path_factory):
    """A log two `explain` runs measured into at the same time (the same kernels, lazily)."""
    root = tmp_path_factory.mktemp("shared") / "logs"
    model = tmp_path_factory.mktemp("model") / "tiny.onnx"
    onnx.save(make_tiny_onnx(), str(model))
    env = {**os.environ, "TVM_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "korch_tvm.tools.cli", "explain", str(model), "--tuning-logs",
               str(root), "--format", "json"]
    writers = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env) for _ in range(2)]
    results = [writer.communicate(timeout=300) for writer in writers]
    assert [writer.returncode for writer in writers] == [0, 0], [err for _, err in results]
    return model, root, [json.loads(out) for out, _ in results]


def test_two_writers_on_one_log_lose_and_corrupt_nothing(shared_log):
    model, root, explanations = shared_log
    lines = record_lines(root)
    assert all(json.loads(line) for line in lines)  # every line is whole JSON
    assert not list(pathlib.Path(root).glob("*/*.corrupt"))
    first = explanations[0]["tuning"]
    assert len(lines) >= first["measured"] + first["from_log"] > 0
    assert all(k["cost_source"] in ("measured", "log") for e in explanations for k in e["kernels"])
    again = run_cli("explain", model, "--tuning-logs", root, "--format", "json")
    assert again.returncode == 0, again.stderr
    tuning = json.loads(again.stdout)["tuning"]
    assert tuning["measured"] == 0 and tuning["from_log"] > 0  # nothing measured again
    assert tuning["from_log"] + tuning["predicted"] == tuning["kernels"]


def test_corrupt_log_line_is_a_warning_and_keeps_the_rest(shared_log, tmp_path, capsys):
    model, root, explanations = shared_log
    copy = tmp_path / "logs"
    shutil.copytree(root, copy)
    code, out, _ = cli_in_process(capsys, "explain", model, "--tuning-logs", copy,
                                  "--predict-only", "--format", "json")
    logged = json.loads(out)["tuning"]["from_log"]
    (directory,) = [d for d in copy.iterdir() if d.is_dir()]
    with open(directory / RECORDS, "a") as handle:
        handle.write('[0, [["not", "a record"\n')
    code, out, err = cli_in_process(capsys, "explain", model, "--tuning-logs", copy,
                                    "--predict-only", "--format", "json")
    assert code == 0 and "Traceback" not in err
    assert re.search(r"WARNING korch_tvm\.tuning_log: .*corrupt", err), err
    assert json.loads(out)["tuning"]["from_log"] == logged > 0  # every good record still read


def test_read_only_log_directory_is_a_warning(shared_log, tmp_path, monkeypatch, capsys):
    import errno

    model, root, _ = shared_log
    copy = tmp_path / "logs"
    shutil.copytree(root, copy)
    before = record_lines(copy)

    def refuse(*args, **kwargs):  # as root, chmod cannot make a directory read-only
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "makedirs", refuse)
    code, out, err = cli_in_process(capsys, "explain", model, "--tuning-logs", copy,
                                    "--predict-only")
    assert code == 0 and "Traceback" not in err
    assert "WARNING korch_tvm.tuning_log" in err and "read-only" in err, err
    assert record_lines(copy) == before


def test_ctrl_c_while_tuning_keeps_records_and_the_rerun_resumes(shared_log, tmp_path):
    model, root, _ = shared_log
    logs = tmp_path / "logs"
    shutil.copytree(root, logs)  # every kernel measured already: tuning starts at once
    measured = len(record_lines(logs))
    command = [sys.executable, "-m", "korch_tvm.tools.cli", "compile", str(model), "--korch",
               "--tuning-logs", str(logs), "--trials", "8", "--no-verify"]
    # a shell may start pytest with SIGINT ignored, and children inherit that: restore it
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TVM_NUM_THREADS": "1"},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while len(record_lines(logs)) == measured and process.poll() is None:
        assert time.time() < deadline, "no tuning record appeared"
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "interrupted; tuning records written so far are kept" in err
    assert "Traceback" not in err
    kept = record_lines(logs)
    assert len(kept) > measured and all(json.loads(line) for line in kept)

    rerun = run_cli("compile", model, "--korch", "--tuning-logs", logs, "--trials", "8",
                    "--no-verify", "--report", tmp_path / "report.json")
    assert rerun.returncode == 0, rerun.stderr
    tuning = json.loads((tmp_path / "report.json").read_text())["tuning"]
    assert tuning["measured"] == 0  # the defaults came from the log
    assert tuning["trials_run"] < 8  # the interrupted run's trials were not redone
    # MetaSchedule's own chatter is routed into korch_tvm.metaschedule, silent by default
    assert all(line.startswith(("INFO korch_tvm.", "WARNING korch_tvm.", "compiled "))
               or line.startswith("  ") for line in
               (rerun.stderr + rerun.stdout).splitlines() if line.strip()), rerun.stderr


# ----------------------------------------------------------------------------- costing
def _tiny_module():
    from korch_tvm.frontend.onnx_import import import_onnx

    return import_onnx(make_tiny_onnx())


def test_kernel_that_fails_costs_infinity_and_a_plan_is_still_found():
    from korch_tvm.costing.cost_model import analytic_estimate
    from korch_tvm.costing.measure import KernelCost
    from korch_tvm.pipeline import korch as passes

    module = _tiny_module()
    first = passes.plan_korch(module, KorchConfig(), predict_only=True)
    victim = next(first.kernel_keys[i] for i in first.chosen if first.kernel_keys[i] is not None
                  and not first.candidates[i].is_stock)

    def measure_with_a_failure(kernels):
        costs = {key: KernelCost(analytic_estimate(module), "measured", 1) for key, module in
                 kernels.items()}
        if victim in costs:
            costs[victim] = KernelCost(math.inf, "failed", 1, "run failed: injected crash")
        return costs

    plan = passes.plan_korch(module, KorchConfig(), measure_with=measure_with_a_failure)
    assert victim not in [plan.kernel_keys[i] for i in plan.chosen]
    assert math.isfinite(plan.report()["plan"]["modelled_ms"])
    assert plan.report()["tuning"]["failed"] == 1
    covered = {node for group in plan.chosen_groups for node in group}
    assert covered == set(range(len(plan.graph.nodes)))


def test_runner_time_out_costs_its_time_out_not_a_crash(tmp_path, caplog):
    """A kernel too slow for the runner is slow, not broken: it costs at least the time-out, so
    a plan that has nothing else covering its primitives stays feasible."""
    from tvm.s_tir import meta_schedule as ms

    from korch_tvm.backend.schedule_variants import default_schedules
    from korch_tvm.backend.target import parse_target
    from korch_tvm.costing.measure import measure_kernels
    from korch_tvm.costing.metaschedule_setup import evaluator_config
    from korch_tvm.costing.tuning_log import TuningLog

    target = parse_target("llvm")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((512, 512), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, x)))
        bb.emit_func_output(out)
    (kernel,) = [tvm.IRModule({"main": f.with_attr("global_symbol", "main")})
                 for _, f in relax.transform.LegalizeOps()(bb.get()).functions_items()
                 if isinstance(f, tvm.tirx.PrimFunc)]
    runner = ms.runner.LocalRunner(timeout_sec=60, evaluator_config=evaluator_config(
        enable_cpu_cache_flush=False))
    # only now the 1 ms time-out: the runner's start-up check of its worker must not hit it
    runner.timeout_sec = runner.pool._timeout = 0.001
    log = TuningLog(tmp_path, target)
    with caplog.at_level(logging.WARNING, logger="korch_tvm.profiler"):
        costs = measure_kernels({"matmul": kernel}, target, log, runner=runner, progress=False)
    assert costs["matmul"].source == "measured"
    assert costs["matmul"].seconds == pytest.approx(0.001)
    assert any("timed out" in record.getMessage() for record in caplog.records)
    # every default schedule recorded, so a re-run does not wait for them again
    assert log.record_count(kernel) == len(default_schedules(kernel, target)) >= 4
    assert TuningLog(tmp_path, target).best_seconds(kernel) == pytest.approx(0.001)


# ----------------------------------------------------------------------------- solver
def test_solver_time_limit_reports_status_and_keeps_a_valid_plan():
    from korch_tvm.frontend.onnx_import import import_onnx, load_onnx
    from korch_tvm.pipeline.korch import plan_korch
    from korch_tvm.report.text import explain_lines
    from korch_tvm.tools.explain import describe_plan

    module = import_onnx(load_onnx(str(MODELS / "bert_layer.onnx")))
    plan = plan_korch(module, KorchConfig(solver_time_limit=1e-4), predict_only=True)
    explanation = describe_plan(plan)
    assert explanation["solver_status"] == "time_limit"
    assert all(piece["status"] == "time_limit" for piece in explanation["solver"])
    text = "\n".join(explain_lines(explanation))
    assert "solver: time_limit" in text and ": time_limit, gap" in text
    assert explanation["modelled_ms"] <= explanation["stock_modelled_ms"] + 1e-9
    build_partition_module(plan.graph, plan.chosen_groups)  # the best plan so far is valid


# ----------------------------------------------------------------------------- verification
@pytest.fixture
def wrong_kernel(monkeypatch):
    """Make the plan's kernels scale the outputs of the chosen kernel holding primitive `exp`
    (`korch.partition_module` is where every build of a plan, the diagnosis's too, starts)."""
    from korch_tvm.pipeline import korch

    original = korch.partition_module
    state = {}

    def partition(plan, groups=None):
        module = original(plan, groups)
        bad = state.get("nodes")
        if bad is None:
            return module
        for index, group in enumerate(plan.chosen_groups if groups is None else groups):
            if frozenset(group) == bad:
                return _scale_kernel_outputs(module, f"korch_k{index}")
        return module

    monkeypatch.setattr(korch, "partition_module", partition)
    return state


def _scale_kernel_outputs(module, name):
    """`main` with the result of kernel `name` multiplied by 1.5 (a wrong kernel, in effect)."""
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @relax.expr_functor.mutator
    class Scale(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            if not (isinstance(value, relax.Call) and value.op.same_as(call_tir)
                    and value.args[0].name_hint == name):
                return super().visit_var_binding_(binding)
            raw = self.builder_.emit(value, "raw")
            wrong = self.builder_.normalize(relax.op.multiply(raw, relax.const(1.5, "float32")))
            self.builder_.emit_normalized(relax.VarBinding(binding.var, wrong))

    mutator = Scale(module)
    main = module.get_global_var("main")
    mutator.builder_.update_func(main, mutator.visit_expr(module["main"]))
    return mutator.builder_.get()


def _chosen_multi_primitive_kernel():
    from korch_tvm.pipeline.korch import plan_korch

    plan = plan_korch(_tiny_module(), KorchConfig(time_budget=0))
    index = next(i for i, group in enumerate(plan.chosen_groups)  # one tensor out, fused
                 if len(group) > 1 and len(plan.candidates[plan.chosen[i]].outputs) == 1)
    return index, plan.chosen_groups[index]


def test_mismatch_names_the_first_wrong_kernel(wrong_kernel):
    from korch_tvm.pipeline.compile import compile_model

    index, nodes = _chosen_multi_primitive_kernel()
    wrong_kernel["nodes"] = nodes
    with pytest.raises(KorchError) as error:
        compile_model(make_tiny_onnx(), korch=True, time_budget=0)
    message = str(error.value)
    assert "\n" not in message
    assert f"the first kernel whose output differs is k{index} (" in message, message
    assert "--fallback-on-mismatch" in message


def test_fallback_on_mismatch_uses_the_stock_plan(wrong_kernel):
    from korch_tvm.pipeline.compile import compile_model
    from korch_tvm.report.text import summary_lines

    index, nodes = _chosen_multi_primitive_kernel()
    wrong_kernel["nodes"] = nodes
    _, report = compile_model(make_tiny_onnx(), korch=True, time_budget=0,
                              fallback_on_mismatch=True)
    assert report["fallback"]["path"] == "stock"
    assert f"k{index}" in report["fallback"]["reason"]
    assert not report["fallback"]["korch_verification"]["passed"]
    assert report["verification"]["passed"]
    assert any("FELL BACK to the stock plan" in line for line in summary_lines(report))


# ----------------------------------------------------------------------------- hygiene
def test_no_user_file_is_read_with_eval_or_unpickling():
    pattern = re.compile(r"\beval\(|\bexec\(|import (cloud)?pickle|pickle\.loads?\("
                         r"|allow_pickle\s*=\s*True|yaml\.load\(|marshal\.loads?\(|import shelve")
    offenders = [f"{path.name}:{number}" for path in sorted(PACKAGE.rglob("*.py"))
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line.split("#")[0])]
    assert not offenders, offenders


def test_quiet_shows_only_errors_and_verbose_shows_debug(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    onnx.save(make_tiny_onnx(), str(path))
    _, _, quiet = cli_in_process(capsys, "explain", path, "--predict-only", "-q")
    assert quiet == ""
    _, _, normal = cli_in_process(capsys, "explain", path, "--predict-only")
    assert "INFO korch_tvm.passes" in normal and "DEBUG" not in normal
    _, _, verbose = cli_in_process(capsys, "explain", path, "--predict-only", "-v")
    assert "DEBUG korch_tvm." in verbose
    names = set(re.findall(r"^\w+ (\S+):", normal + verbose, re.M))
    assert names and all(name.startswith("korch_tvm.") for name in names), names


def test_ctrl_c_that_tvm_turned_into_a_runtime_error_still_exits_as_interrupted(monkeypatch,
                                                                               capsys):
    """Ctrl-C inside a Python callback that TVM called from C++ comes back as a bare
    RuntimeError; the command line must still report an interruption (exit 130), not a bug."""
    import signal

    from korch_tvm.support import interrupts
    from korch_tvm.tools import cli

    def interrupted_inside_tvm(args):
        interrupts.note()  # what the SIGINT handler does when Ctrl-C arrives
        raise RuntimeError("")

    monkeypatch.setitem(cli.COMMANDS, "logs", interrupted_inside_tvm)
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert cli.main(["logs", "somewhere"]) == 130
        assert signal.getsignal(signal.SIGINT) is interrupts.note_and_raise
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "interrupted" in capsys.readouterr().err

    class TornDownOnCtrlC:
        def __del__(self):
            raise KeyboardInterrupt  # where Python can only report it and go on

    def interrupted_where_python_ignores_it(args):
        TornDownOnCtrlC()  # a pool torn down as Ctrl-C arrives (seen in CI: exit 0)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "logs", interrupted_where_python_ignores_it)
    capsys.readouterr()
    try:
        assert cli.main(["logs", "somewhere"]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err and "Exception ignored" not in err

    def a_real_bug(args):
        raise RuntimeError("boom")

    monkeypatch.setitem(cli.COMMANDS, "logs", a_real_bug)
    try:
        assert cli.main(["logs", "somewhere"]) == 3  # no Ctrl-C this time: an internal error
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "internal error: RuntimeError: boom" in capsys.readouterr().err
