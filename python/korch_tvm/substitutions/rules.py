"""The substitution rules, in the fixed order their alternatives are offered, and the search.

The order only fixes the order of the returned alternatives (so plans and reports are
reproducible); every rule looks at the unmodified `main`, never at another rule's output.
"""

from __future__ import annotations

import logging
from typing import Sequence

from tvm import relax

from .alternative import Alternative, SubstitutionRule
from .division_after_matmul import DivisionAfterMatmul, ScaleBeforeMatmul
from .layout_chain import FoldLayoutChain
from .merge_shared_input import MergeConvolutionsSharingInput, MergeMatmulsSharingInput
from .ones_column_split import OnesColumnSplit
from .split_fused_projection import SplitFusedProjection
from .sum_as_matmul import MatmulAsSum, SumAsMatmul
from .sum_in_value_matmul import SumInValueMatmul

logger = logging.getLogger("korch_tvm.substitutions")

ALL_RULES: tuple[SubstitutionRule, ...] = (
    DivisionAfterMatmul(),
    ScaleBeforeMatmul(),
    SumAsMatmul(),
    MatmulAsSum(),
    SumInValueMatmul(),
    OnesColumnSplit(),
    MergeMatmulsSharingInput(),
    MergeConvolutionsSharingInput(),
    SplitFusedProjection(),
    FoldLayoutChain(),
)


def find_alternatives(main: relax.Function,
                      rules: Sequence[SubstitutionRule] = ALL_RULES) -> list[Alternative]:
    """Every alternative each rule finds in `main`, rule by rule in `rules`' order."""
    found = []
    for rule in rules:
        alternatives = list(rule.find(main))
        if alternatives:
            logger.info("substitution %s: %d site(s)", rule.name, len(alternatives))
        found += alternatives
    return found
