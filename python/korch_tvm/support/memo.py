"""A bounded memo for per-kernel facts that cost a lowering or an analysis to compute.

A compile plans a model in two layouts and then region by region, meeting most kernels three
times; a long-lived process (a notebook, a service compiling many models) must not grow it
without bound, so when full it starts over rather than tracking use.
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
