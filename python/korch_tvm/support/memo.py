"""A bounded memo for facts that cost a lowering, an analysis or a check to compute.

Its owner decides how long it lives: a costing session keeps the analytic estimates of one
compile (a compile plans a model in two layouts and then region by region, meeting most kernels
three times), a `LineVerdicts` the verdicts on log lines for as long as it is passed on. One
that outlives a compile (a notebook, a service compiling many models) must not grow without
bound, so when full it starts over rather than tracking use.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")


class KeyedMemo(Generic[Value]):
    """`get(key, compute)`: compute's value, computed once per key while the memo holds it."""

    def __init__(self, kept: int = 200_000) -> None:
        self.kept = kept
        self._values: dict[Hashable, Value] = {}

    def get(self, key: Hashable, compute: Callable[[], Value]) -> Value:
        if key not in self._values:
            if len(self._values) >= self.kept:
                self._values.clear()
            self._values[key] = compute()
        return self._values[key]

    def __len__(self) -> int:
        return len(self._values)
