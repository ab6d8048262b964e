"""KorchConfig: validated in one place, and keyword arguments override it only when given."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from korch_tvm.config import KorchConfig
from korch_tvm.errors import KorchError
from korch_tvm.tools import cli

TESTS = pathlib.Path(__file__).resolve().parent


@pytest.mark.parametrize("changes, flag", [
    ({"trials": -1}, "--trials"),
    ({"trials": 2.5}, "--trials"),
    ({"trials_per_kernel": -4}, "--trials-per-kernel"),
    ({"time_budget": -1.0}, "--time-budget"),
    ({"time_budget": float("nan")}, "--time-budget"),
    ({"num_threads": 0}, "--threads"),
    ({"num_threads": -1}, "--threads"),
    ({"verify_tolerance": -1.0}, "--verify-tolerance"),
    ({"verify_tolerance": 0.0}, "--verify-tolerance"),
    ({"verify_tolerance": float("nan")}, "--verify-tolerance"),
    ({"verify_tolerance": float("inf")}, "--verify-tolerance"),
    ({"layout": "NCWH"}, "--layout"),
    ({"memory_limit": "tight"}, "--memory-limit"),
    ({"trials": 8, "trials_per_kernel": 2}, "not both"),
])
def test_every_bad_value_is_refused_where_the_config_is_made(changes, flag):
    with pytest.raises(KorchError, match=flag):
        KorchConfig(**changes)
    with pytest.raises(KorchError, match=flag):  # with_changes goes through the same check
        KorchConfig().with_changes(**changes)


def test_good_values_pass_and_zero_time_budget_means_predict_everything():
    config = KorchConfig(trials=8, time_budget=0.0, num_threads=1, verify_tolerance=1e-3,
                         layout="NHWC", memory_limit="none")
    assert config.time_budget == 0.0 and config.verify_tolerance == 1e-3


def test_keyword_overrides_apply_only_when_given():
    config = KorchConfig(trials=8, tuning_logs="/logs", time_budget=30.0)
    assert config.overridden(trials=None, tuning_logs=None, time_budget=None) == config
    assert config.overridden(trials=4).trials == 4
    assert config.overridden(trials=4).tuning_logs == "/logs"


@pytest.mark.parametrize("flags, message", [
    (["--threads", "-1"], "--threads must be >= 1, got -1"),
    (["--time-budget", "-1"], "--time-budget must be >= 0, got -1"),
    (["--verify-tolerance", "nan"], "--verify-tolerance must be a number, got nan"),
    (["--verify-tolerance", "0"], "--verify-tolerance must be > 0, got 0"),
    (["--verify-tolerance", "-1"], "--verify-tolerance must be > 0, got -1"),
])
def test_cli_refuses_bad_flags_in_one_line_before_loading_the_model(tmp_path, capsys, flags,
                                                                    message):
    # the model does not exist: the flag is refused first
    code = cli.main(["compile", str(tmp_path / "missing.onnx"), *flags])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and lines == [f"korch-tvm: error: {message}"], err


_TUNED_COMPILE = textwrap.dedent("""
    import gc, json, os, sys, tempfile
    sys.path.insert(0, {tests!r})
    from conftest import make_tiny_onnx
    from korch_tvm.pipeline.compile import compile_model
    from korch_tvm.config import KorchConfig
    before = sorted(os.listdir(tempfile.gettempdir()))
    executable, report = compile_model(make_tiny_onnx(4, 8), korch=False,
                                       config=KorchConfig(trials=8, tuning_logs={logs!r}))
    alive = sorted(os.listdir(tempfile.gettempdir()))
    del executable  # its library's folder goes with it, once collected: TVMScript parsed
    gc.collect()    # while tuning keeps its inspect.stack() in a cycle with our frames
    print(json.dumps({{"report": report, "temp_before": before, "temp_alive": alive,
                      "temp_after": sorted(os.listdir(tempfile.gettempdir()))}}, default=str))
""")


def test_config_trials_and_log_are_used_and_nothing_is_left_outside(tmp_path):
    """`compile_model(m, config=KorchConfig(trials=8, tuning_logs=DIR))` once compiled with 0
    trials and no log (its keyword defaults overwrote the config). The same tuned compile, run
    with its own HOME and TMPDIR, leaves nothing in either: ONNX Runtime's telemetry wrote
    under ~/.cache and MetaSchedule's builders left a folder per candidate in the temp folder
    (the executable's own library stays there while the executable lives)."""
    logs, home, temp = tmp_path / "logs", tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(temp), "TVM_NUM_THREADS": "1",
           "XDG_CACHE_HOME": str(home / ".cache")}
    env.pop("ORT_DISABLE_TELEMETRY", None)
    script = _TUNED_COMPILE.format(tests=str(TESTS), logs=str(logs))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    report = outcome["report"]
    assert report["trials_budget"] == 8 and report["tuning"]["trials_run"] > 0
    records = list(logs.glob("*/database_tuning_record.json"))
    assert records and records[0].read_text().strip()
    assert report["verification"]["passed"] and report["verification"]["reference"] == \
        "onnxruntime"
    assert list(home.iterdir()) == []  # no ~/.cache/Microsoft/DeveloperTools/.onnxruntime
    # while the executable lives, the library it was loaded from is its one folder there
    added = sorted(set(outcome["temp_alive"]) - set(outcome["temp_before"]))
    assert len(added) == 1 and added[0].startswith("korch-tvm-library-"), added
    assert outcome["temp_after"] == outcome["temp_before"]
    assert list(temp.iterdir()) == [], list(temp.iterdir())


def test_the_target_is_resolved_once_when_the_config_is_made():
    import tvm

    from korch_tvm.backend.target import host_core_count, host_cpu_name

    config = KorchConfig(target="llvm")
    assert isinstance(config.target, tvm.target.Target)
    assert str(config.target.attrs["mcpu"]) == host_cpu_name()
    assert int(config.target.attrs["num-cores"]) == host_core_count()
    # every copy keeps the very Target; a new target given to a copy is resolved too
    assert config.with_changes(trials=4).target is config.target
    assert config.overridden(target=None, trials=4).target is config.target
    cuda = config.overridden(target='{"kind": "cuda", "arch": "sm_80"}').target
    assert isinstance(cuda, tvm.target.Target) and str(cuda.attrs["arch"]) == "sm_80"
    ready = tvm.target.Target({"kind": "llvm", "mcpu": "generic", "num-cores": 2})
    assert KorchConfig(target=ready).target is ready  # a Target is taken as it is


@pytest.mark.parametrize("bad, message", [
    ("llvm -mcpu=znver4", "target 'llvm -mcpu=znver4' is not understood; use 'llvm', 'cuda' or "
                          "a JSON dict such as"),
    ({"kind": "llvm", "mcpu": "nosuchcpu"}, "target mcpu 'nosuchcpu' is not a CPU LLVM knows"),
])
def test_a_bad_target_is_refused_in_one_line_where_the_config_is_made(bad, message):
    with pytest.raises(KorchError) as info:
        KorchConfig(target=bad)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    with pytest.raises(KorchError, match="is not understood"):
        KorchConfig().with_changes(target="llvm -num-cores 2")


def test_configs_for_the_same_target_are_equal_values():
    """TVM compares Targets by identity; a config is a value, so two made alike are equal."""
    assert KorchConfig(trials=4) == KorchConfig(trials=4)
    assert hash(KorchConfig(trials=4)) == hash(KorchConfig(trials=4))
    assert KorchConfig(trials=4) != KorchConfig(trials=5)
    assert KorchConfig() != KorchConfig(target={"kind": "llvm", "mcpu": "generic"})


def test_substitutions_are_opt_in_and_the_flag_says_so():
    """Alternatives double a compile's candidates for a modelled gain under 1 % on the zoo, so
    they are off unless asked for; the CLI and the config agree on that default."""
    from korch_tvm.tools.flags import FLAGS

    assert KorchConfig().substitutions == "off"
    flag = FLAGS["substitutions"]
    assert flag.keywords["default"] == "off" and "'off' (default)" in flag.keywords["help"]
