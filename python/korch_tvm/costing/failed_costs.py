"""A kernel that cannot be measured is costed by its prediction, never by infinity.

A failed measurement (the kernel did not build or its run died, now or in every logged attempt)
used to leave `inf` in the kernel's cost, and a stock FuseOps group so costed went into the
objective at a placeholder of 1000 s, so a whole model modelled at 10^6 ms. Here such a cost
keeps its source "failed" and its error, and takes the kernel's prediction (the log's cost model,
else the roofline) as its seconds, so every modelled latency is a sum of finite, plausible terms
and the report counts the kernels so costed. The orchestration still keeps a failed kernel out of
any plan where a measured alternative exists (orchestration/problems.py): only a stock group,
which the stock build builds anyway, is ever chosen at its prediction.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping

logger = logging.getLogger("korch_tvm.profiler")


def is_failed(cost) -> bool:
    """Whether a KernelCost stands for a failed measurement (whatever seconds it now holds)."""
    return cost.source == "failed" or not math.isfinite(cost.seconds)


def costed_by_prediction(costs: Mapping[str, object],
                         predict: Callable[[str], float]) -> dict[str, object]:
    """`costs` with every failed cost's seconds replaced by `predict(name)` (source "failed").

    A prediction that is itself not finite and positive is a bug of the cost model: refused."""
    result = {}
    for name, cost in costs.items():
        if not math.isfinite(cost.seconds):
            seconds = float(predict(name))
            assert math.isfinite(seconds) and seconds > 0, \
                f"kernel {name}: its prediction {seconds} s cannot stand in for a failed run"
            logger.warning("kernel %s could not be measured (%s); costed at its prediction "
                           "%.4g ms", name, cost.error or "no time", seconds * 1e3)
            cost = dataclasses.replace(cost, seconds=seconds, source="failed",
                                       error=cost.error or "measurement failed")
        result[name] = cost
    return result
