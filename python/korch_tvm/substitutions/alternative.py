"""What a substitution rule offers: another way to compute some tensors of the primitive program.

Rules never rewrite the program. Each returns `Alternative`s: a small Relax function that reads
some values of `main` and computes values equal to others. The graph stage adds an
alternative's primitives beside the originals, and the orchestration program may produce each
replaced tensor either way (tensors as equivalence classes), so a rewrite is used only where its
kernels are cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tvm import relax


@dataclass(frozen=True)
class Alternative:
    """`body(*reads)` returns a tuple equal, element by element, to `replaces`.

    rule:     the rule's name, e.g. "softmax_division_after_matmul".
    reads:    variables of `main` (dataflow vars, activation or weight params) bound, in order,
              to `body`'s parameters, whose struct info they share.
    replaces: variables of `main` bound by ordinary (non-tuple) bindings, each equal to the
              matching element of `body`'s result tuple, with the same shape and dtype.
    body:     a Relax function of primitive ops only (the ops lowering/fission emits), whose
              result is a tuple with one field per replaced variable; each field is bound by
              its own non-tuple binding (a strided_slice, not a split's tuple item), so every
              replaced tensor has one producing primitive.
    """

    rule: str
    reads: tuple[relax.Var, ...]
    replaces: tuple[relax.Var, ...]
    body: relax.Function


class SubstitutionRule(Protocol):
    """One semantics-preserving rewrite, searched for in the primitive program's `main`."""

    name: str

    def find(self, main: relax.Function) -> list[Alternative]:
        """Every place the rule applies in `main`, as alternatives (empty where it does not)."""
        ...
