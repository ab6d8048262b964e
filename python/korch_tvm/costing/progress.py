"""The costing stage's progress line: work done, trials, elapsed time and an ETA on stderr."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable


class Progress:
    """One self-overwriting stderr line: work done of `total`, trials, elapsed time and an ETA.

    It moves once per measurement (`tick`); what the log answers is counted at once (`skip`)
    and left out of the rate, so the ETA is the time the measurements so far took, per
    measurement, times the ones left ("ETA --" before the first). `unit` names what is counted:
    kernels when measuring, trials when tuning. Off when stderr is no terminal, unless asked.
    """

    def __init__(self, total: int, enabled: bool | None, *, unit: str = "kernels",
                 stream=None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.stream = stream or sys.stderr
        self.enabled = _is_terminal(self.stream) if enabled is None else enabled
        self.total, self.unit, self.clock = total, unit, clock
        self.done = self.worked = self.trials = self.kernels = 0
        self.start = clock()
        self.stage = ""

    def skip(self, count: int, stage: str) -> None:
        """`count` units settled without work (log lookups, predictions)."""
        self.done += count
        self.stage = stage
        self._draw()

    def tick(self, count: int = 1, stage: str | None = None, *, kernels: int = 0) -> None:
        """`count` units measured; `kernels` finished (when the unit is trials)."""
        self.done += count
        self.worked += count
        self.kernels += kernels
        self.stage = stage or self.stage
        self._draw()

    def eta_seconds(self) -> float | None:
        """Seconds left at the rate of the work so far; None before any work is done."""
        if not self.worked:
            return None
        return (self.clock() - self.start) / self.worked * max(0, self.total - self.done)

    def line(self) -> str:
        """The line as drawn: stage, units done of the total, kernels, elapsed time, ETA."""
        elapsed = self.clock() - self.start
        kernels = f"  kernels {self.kernels}" if self.unit != "kernels" else ""
        return (f"[korch] {self.stage:8s} {self.unit} {self.done}/{self.total}{kernels}  "
                f"elapsed {_duration(elapsed)}  ETA {_duration(self.eta_seconds())}")

    def _draw(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + " ")
            self.stream.flush()

    def close(self) -> None:
        """End the line (a newline), so what is printed next starts on its own."""
        if self.enabled:
            self.stream.write("\n")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no file behind it, or closed
        return False


def _duration(seconds: float | None) -> str:
    """12.3s, 4m05s, 1h02m; "--" when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "--"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"
