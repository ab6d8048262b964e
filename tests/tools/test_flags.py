"""The shared flags: declared once (tools/flags.py), the same in every sub-command, and turned
into a KorchConfig by one function."""

import argparse

import pytest

from korch_tvm.tools.cli import build_parser
from korch_tvm.tools.flags import FLAGS, config_from_args, config_values, input_shapes

SUBCOMMANDS = ("compile", "tune", "explain", "bench")
# Defaults that differ on purpose (see the comment where bench declares its flags).
DELIBERATE_DEFAULTS = {("bench", "--tuning-logs")}


def _subparsers():
    parser = build_parser()
    choices = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, {name: choices.choices[name] for name in SUBCOMMANDS}


def _actions(subparser):
    return {option: action for action in subparser._actions for option in action.option_strings}


def test_each_shared_flag_is_the_same_wherever_it_appears():
    _, subparsers = _subparsers()
    actions = {name: _actions(sub) for name, sub in subparsers.items()}
    compared = 0
    for flag in FLAGS.values():
        option = flag.options[0]
        having = [name for name in SUBCOMMANDS if option in actions[name]]
        first = actions[having[0]][option]
        for name in having[1:]:
            action = actions[name][option]
            assert action.help == first.help, (option, name)
            assert action.type is first.type, (option, name)
            assert action.choices == first.choices, (option, name)
            assert action.dest == first.dest and type(action) is type(first), (option, name)
            if (name, option) not in DELIBERATE_DEFAULTS:
                assert action.default == first.default, (option, name)
            compared += 1
    assert compared >= 20  # the table is really shared, not one flag per command
    for name in SUBCOMMANDS:  # the flags every command has
        for option in ("--target", "--tuning-logs", "--trials", "--input-shape", "--threads",
                       "--layout", "--time-budget"):
            assert option in actions[name], (name, option)


def test_bench_log_defaults_to_a_fresh_directory_and_compile_to_the_user_cache():
    parser, _ = _subparsers()
    from korch_tvm.costing.log_seeds import user_log_root

    assert parser.parse_args(["bench", "m.onnx"]).tuning_logs is None
    assert parser.parse_args(["compile", "m.onnx"]).tuning_logs == user_log_root()
    assert parser.parse_args(["explain", "m.onnx"]).tuning_logs == user_log_root()


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_a_config_built_from_args_carries_the_values(command, tmp_path):
    parser, _ = _subparsers()
    args = parser.parse_args([command, "m.onnx", "--trials", "12", "--tuning-logs",
                              str(tmp_path), "--layout", "NHWC", "--threads", "2",
                              "--time-budget", "30", "--input-shape", "x:1x3x8x8",
                              "--input-shape", "mask:1,4"])
    config = config_from_args(args)
    assert config.trials == 12
    assert config.tuning_logs == str(tmp_path)
    assert config.layout == "NHWC"
    assert config.num_threads == 2
    assert config.time_budget == 30.0
    assert config.target.kind.name == "llvm"
    assert input_shapes(args) == {"x": [1, 3, 8, 8], "mask": [1, 4]}


def test_flags_only_some_commands_have_reach_the_config():
    parser, _ = _subparsers()
    bench = parser.parse_args(["bench", "m.onnx", "--trials-per-kernel", "4", "--exact-math",
                               "--prune-margin", "inf"])
    config = config_from_args(bench)
    assert config.trials_per_kernel == 4 and config.fast_math is False
    assert config.prune_margin == float("inf")
    # plain values for a child process: the target stays the spec given, None is left out
    values = config_values(bench)
    assert values["target"] == "llvm" and "tuning_logs" not in values
    compile_args = parser.parse_args(["compile", "m.onnx", "--memory-limit", "none",
                                      "--verify-tolerance", "0.01"])
    config = config_from_args(compile_args)
    assert config.memory_limit == "none" and config.verify_tolerance == 0.01
    explain = parser.parse_args(["explain", "m.onnx", "--solver-time-limit", "3"])
    assert config_from_args(explain).solver_time_limit == 3.0
    # what a command sets itself wins; a None override keeps the flag's value
    assert config_from_args(explain, trials=5, layout=None).trials == 5


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_a_bad_shape_is_refused_the_same_way_everywhere(command, capsys):
    parser, _ = _subparsers()
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args([command, "m.onnx", "--input-shape", "x:1xy"])
    assert exit_info.value.code == 2
    assert "'x:1xy' is not NAME:DIMS" in capsys.readouterr().err


def test_a_bad_value_is_refused_where_the_config_is_made():
    from korch_tvm.errors import KorchError

    parser, _ = _subparsers()
    for command in SUBCOMMANDS:
        args = parser.parse_args([command, "m.onnx", "--trials", "-3"])
        with pytest.raises(KorchError, match="--trials must be >= 0"):
            config_from_args(args)
