"""The flags korch-tvm's sub-commands share, declared once, and the one way args become a config.

compile, tune, explain and bench each take a subset of `FLAGS` with `add_flags`, so that a flag
has the same spelling, type, default and help wherever it appears; `config_from_args` is the only
place parsed arguments turn into a `KorchConfig` (which validates them), and `input_shapes` the
only place the repeated `--input-shape` becomes a mapping. Nothing here imports TVM, so `--help`
stays fast.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..config import (CACHE_STATES, LAYOUT_CHOICES, LIBRARY_CHOICES, MEMORY_LIMITS,
                      SUBSTITUTION_CHOICES)
from .common import shape_arg


@dataclass(frozen=True)
class Flag:
    """One command-line flag: its option strings, argparse keywords, and the KorchConfig field
    it fills (None: the flag is not part of the config)."""

    options: tuple[str, ...]
    keywords: dict = field(default_factory=dict)
    config_field: str | None = None

    @property
    def name(self) -> str:
        """The key in FLAGS: the long option without dashes (`--exact-math` -> exact_math)."""
        return self.options[0].lstrip("-").replace("-", "_")

    @property
    def dest(self) -> str:
        """The attribute argparse stores the value under."""
        return self.keywords.get("dest") or self.name


def _tuning_logs_default() -> str:
    from ..costing.log_seeds import user_log_root  # no TVM import: --help stays fast

    return user_log_root()


_LAYOUT_HELP = (
    "activation layout of convolutions and what follows them: 'auto' (default) plans the model "
    "in both and keeps the faster modelled plan (a model with convolutions is tuned twice); "
    "applies to both paths. With 'auto' Korch also plans a layout per region of the model and "
    "keeps it when it models faster (layout 'mixed')")
_MEMORY_LIMIT_HELP = (
    "'stock' (default): Korch's plan needs no more activation storage than TVM's own fusion "
    "groups (within 1%%): pieces of the graph go back to those groups until it fits; 'none': "
    "the fastest modelled plan whatever its storage")
_LIBRARY_HELP = (
    "'auto' (default): a kernel that is a float32 GEMM or batched GEMM (a matmul, "
    "attention's QK^T and PV, a 1x1 NHWC convolution), alone or followed by a bias or "
    "residual add and relu/clip/gelu/sigmoid/silu/hardswish, costs the cheaper of TVM's kernel "
    "and an "
    "OpenBLAS call (timed once, kept in library_times.json beside the tuning log), and Korch's "
    "plan runs the cheaper; needs the extension `make install` builds (without it: TVM "
    "kernels only). 'off': TVM kernels only")

FLAGS: dict[str, Flag] = {flag.name: flag for flag in (
    Flag(("--target",), dict(
        default="llvm",
        help="'llvm' (this CPU: mcpu and cores detected), 'cuda', or a TVM JSON target dict "
             "(default: llvm)"), "target"),
    Flag(("--tuning-logs",), dict(
        metavar="DIR",
        help="root of the tuning logs; records go to DIR/<target tag>/ and are reused on the "
             "next compile (default: %(default)s, from $KORCH_TVM_CACHE_DIR or "
             "$XDG_CACHE_HOME; '' keeps nothing). An empty log is seeded from the shipped "
             "tuning_logs/ (read only; $KORCH_TVM_SEED_LOGS overrides): this CPU's records as "
             "they are, else those of a CPU with the same vector ISA as predictions and "
             "starting points, measured here"), "tuning_logs"),
    Flag(("--trials",), dict(
        type=int, default=0, metavar="N",
        help="MetaSchedule trials for the model's kernels in all, those the log holds counted "
             "(default 0: no search, kernels without records use default schedules)"),
         "trials"),
    Flag(("--trials-per-kernel",), dict(
        type=int, default=None, metavar="N",
        help="instead of --trials: N trials per kernel that gets tuned (the total, N times the "
             "kernels, is still split by latency share and headroom)"), "trials_per_kernel"),
    Flag(("--time-budget",), dict(
        type=float, default=None, metavar="SECONDS",
        help="bound on the costing stage; kernels not costed in time use the cost model's "
             "prediction"), "time_budget"),
    Flag(("--input-shape",), dict(
        type=shape_arg, action="append", default=[], metavar="NAME:DIMS",
        help="static shape for a dynamic input, e.g. x:1x3x224x224 (repeatable)")),
    Flag(("--threads",), dict(
        type=int, default=None,
        help="threads of TVM's runtime, and of ONNX Runtime and OpenVINO where they run "
             "(default: every available core)"), "num_threads"),
    Flag(("--exact-math",), dict(
        dest="fast_math", action="store_false",
        help="legalize exp/sigmoid/tanh/erf (and powers 2-4) to TVM's per-element libm "
             "calls instead of vectorisable polynomials (within 4e-7 relative) and "
             "multiplications; applies to both paths"),
         "fast_math"),
    Flag(("--layout",), dict(choices=LAYOUT_CHOICES, default="auto", help=_LAYOUT_HELP),
         "layout"),
    Flag(("--memory-limit",), dict(choices=MEMORY_LIMITS, default="stock",
                                   help=_MEMORY_LIMIT_HELP), "memory_limit"),
    Flag(("--library",), dict(choices=LIBRARY_CHOICES, default="auto", help=_LIBRARY_HELP),
         "library"),
    Flag(("--substitutions",), dict(
        choices=SUBSTITUTION_CHOICES, default="off",
        help="'on': graph rewrites (substitutions/) are offered to the solver beside the "
             "original primitives, and used only where their kernels are cheaper (about twice "
             "the compile time); 'off' (default): the graph as lowered"), "substitutions"),
    Flag(("--cache-state",), dict(
        choices=CACHE_STATES, default="auto",
        help="what CPU kernels find in the caches when timed: 'l3' = their operands in the L3 "
             "(private caches evicted), 'cold' = in memory; 'auto' (default): 'l3' for a model "
             "whose weights and peak activations fit a fifth of the L3, as it runs there; each "
             "state keeps its own tuning log"),
         "cache_state"),
    Flag(("--prune-margin",), dict(
        type=float, default=None,
        help="Korch's pruning margin (default: KorchConfig's; 'inf' costs every candidate)"),
         "prune_margin"),
    Flag(("--solver-time-limit",), dict(
        type=float, default=None, metavar="SECONDS",
        help="HiGHS time limit per subproblem (default 10)"), "solver_time_limit"),
    Flag(("--rpc-tracker",), dict(
        metavar="HOST:PORT", default=None, help="measure kernels through a TVM RPC tracker"),
         "rpc_tracker"),
    Flag(("--rpc-key",), dict(default=None, help="device key registered at the tracker"),
         "rpc_key"),
)}


def add_flags(parser: argparse.ArgumentParser, names, **defaults) -> None:
    """Declare the flags `names` (keys of FLAGS) on `parser`.

    `defaults`: a different default for some of them (by name), for a sub-command whose default
    differs on purpose; the help text stays the table's unless the caller declares the flag
    itself.
    """
    for name in names:
        flag = FLAGS[name]
        keywords = dict(flag.keywords)
        if name == "tuning_logs":
            keywords.setdefault("default", _tuning_logs_default())
        if name in defaults:
            keywords["default"] = defaults[name]
        parser.add_argument(*flag.options, **keywords)


def input_shapes(args: argparse.Namespace) -> dict[str, list[int]]:
    """The `--input-shape NAME:DIMS` flags as {name: dims} (the last one given wins)."""
    return dict(getattr(args, "input_shape", None) or [])


def config_values(args: argparse.Namespace, **overrides) -> dict:
    """The KorchConfig fields that `args` carries (flags the sub-command declared and the user or
    its default set), plus `overrides`; plain values, so they can cross a process boundary."""
    values = {}
    for flag in FLAGS.values():
        if flag.config_field is None or not hasattr(args, flag.dest):
            continue
        value = getattr(args, flag.dest)
        if value is not None:  # None: KorchConfig's own default
            values[flag.config_field] = value
    verify_tolerance = getattr(args, "verify_tolerance", None)
    if verify_tolerance is not None:
        values["verify_tolerance"] = verify_tolerance
    values.update({key: value for key, value in overrides.items() if value is not None})
    return values


def config_from_args(args: argparse.Namespace, **overrides):
    """The one KorchConfig of a command, built from its parsed `args` (validated as it is made).

    `overrides`: config fields the command sets itself (None ones are ignored).
    """
    from ..config import KorchConfig

    return KorchConfig(**config_values(args, **overrides))
