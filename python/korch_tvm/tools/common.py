"""What every korch-tvm sub-command shares: the NAME:DIMS shape flag, -v/-q, logging to stderr.

cli.py, explain.py and bench.py all use these; keeping them here lets the sub-commands leave the
command line's own module alone (nothing imports cli.py).
"""

from __future__ import annotations

import argparse
import logging
import sys


def shape_arg(text: str) -> tuple[str, list[int]]:
    """`name:1x3x224x224` (also `name:1,3,224,224`) -> ("name", [1, 3, 224, 224])."""
    name, sep, dims = text.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        shape = [int(d) for d in dims.replace(",", "x").split("x") if d]
        if not shape or min(shape) <= 0:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not NAME:DIMS, e.g. input:1x3x224x224") from None
    return name, shape


def add_verbosity(parser: argparse.ArgumentParser,
                  verbose_help: str = "more logging (-vv for MetaSchedule's own logs)") -> None:
    """`-v` (repeatable) or `-q`, the same pair on every sub-command."""
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-v", "--verbose", action="count", default=0, help=verbose_help)
    verbosity.add_argument("-q", "--quiet", action="store_true", help="only errors")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record arrives, not the one at set-up time
    (a stream swapped out and closed since, e.g. by a test harness, would raise on every log)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def configure_logging(verbose: int, quiet: bool) -> None:
    """korch_tvm's logs to stderr: `quiet` errors only, `verbose` (a count) debug, 2 and more
    also MetaSchedule's own."""
    level = logging.ERROR if quiet else (logging.DEBUG if verbose else logging.INFO)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("korch_tvm")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    # MetaSchedule logs every batch; keep it out of the terminal unless asked for (-vv).
    logging.getLogger("korch_tvm.metaschedule").setLevel(
        logging.DEBUG if verbose >= 2 else logging.WARNING)
