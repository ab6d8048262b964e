"""Statistics of interleaved latency samples: percentiles, paired ratios, geomeans, and the
interleaving itself.

Kept free of TVM (and of any runtime) so the arithmetic a benchmark's verdicts rest on is
unit-tested in milliseconds with a fake clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

# Pause before each runtime's sample inside a round: TVM's pool threads (and ORT's and
# OpenVINO's) spin for about 200 ms after a call, and a runtime timed while another's threads
# still spin on the same cores is slowed by them.
GAP_MS = 300.0


@dataclass(frozen=True)
class TimingProtocol:
    """How runtimes are timed together: `repeat` interleaved rounds (fewer when they would take
    over `max_timing_s`, never under 5), `warmup` calls each first, a sample averaging calls
    until it lasts `min_sample_ms`, `gap_ms` of sleep before each runtime's sample and `settle`
    untimed calls at its start."""

    repeat: int = 30
    warmup: int = 3
    min_sample_ms: float = 20.0
    gap_ms: float = GAP_MS
    settle: int = 1
    max_timing_s: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of `values`, `q` in [0, 100]."""
    data = sorted(float(v) for v in values)
    if not data:
        return float("nan")
    position = (len(data) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (position - low)


def summarize_samples(samples: Sequence[float]) -> dict:
    """Median, p10/p90, min/max, count and relative spread of latency `samples` (ms)."""
    median = percentile(samples, 50)
    p10, p90 = percentile(samples, 10), percentile(samples, 90)
    return {"median": median, "p10": p10, "p90": p90, "min": min(samples),
            "max": max(samples), "n": len(samples),
            "spread": (p90 - p10) / median if median > 0 else float("nan")}


def paired_ratio(baseline: Sequence[float], candidate: Sequence[float]) -> dict:
    """How many times faster `candidate` is than `baseline` (> 1: candidate faster).

    `ratio` is median(baseline) / median(candidate); p10/p90 are the percentiles of the
    round-by-round ratios (both were timed in the same interleaved round, so a slow moment of
    the machine hits both). `verdict` says whether the difference exceeds that spread.
    """
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError("paired samples need the same, non-zero length")
    per_round = [b / c for b, c in zip(baseline, candidate)]
    ratio = percentile(baseline, 50) / percentile(candidate, 50)
    p10, p90 = percentile(per_round, 10), percentile(per_round, 90)
    return {"ratio": ratio, "p10": p10, "p90": p90, "verdict": verdict(p10, p90)}


def verdict(p10: float, p90: float) -> str:
    """"faster" when the whole paired p10..p90 range is above 1, "slower" below, else noise."""
    if p10 > 1.0:
        return "faster"
    if p90 < 1.0:
        return "slower"
    return "within noise"


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of the finite positive `values` (None and NaN are left out)."""
    values = [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    if not values:
        return float("nan")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def interleaved_samples(runners: Mapping[str, Callable[[], object]], repeat: int, *,
                        warmup: int = 3, min_sample_s: float = 0.02, gap_s: float = 0.0,
                        settle: int = 0, max_seconds: float | None = None, min_repeat: int = 5,
                        clock: Callable[[], float] = time.perf_counter,
                        sleep: Callable[[float], None] = time.sleep) -> dict[str, list[float]]:
    """Time each runner in rounds A B C A B C ...; returns seconds per call, per sample.

    Each runner first gets `warmup` calls. A sample is the mean of `number` back-to-back calls,
    the same `number` for every runner (so that each runner sees its caches evicted by the
    others equally often), chosen so that the fastest runner's sample lasts about
    `min_sample_s`. Every round runs every runner once, always in the same order, with `gap_s`
    of sleep before each. With `max_seconds`, fewer rounds run when `repeat` rounds would take
    longer (never fewer than `min_repeat`), estimated from the warm-up.

    A sample starts with `settle` untimed calls. The runners before it evicted this runner's
    weights from the caches and its worker threads slept through the gap; the first call pays
    for both. Settled, a sample times calls back to back, as a model serving one request after
    another runs and as the modelled latency counts them.
    """
    slowest = {}
    for name, call in runners.items():
        slowest[name] = 0.0
        for _ in range(max(1, warmup)):
            start = clock()
            call()
            slowest[name] = max(slowest[name], clock() - start)
    fastest = min(slowest.values(), default=0.0)
    number = max(1, int(math.ceil(min_sample_s / fastest))) if fastest > 0 else 1
    numbers = {name: number for name in runners}
    round_seconds = sum((number + settle) * seconds + gap_s for seconds in slowest.values())
    if max_seconds is not None and round_seconds > 0:
        repeat = max(min(repeat, min_repeat), min(repeat, int(max_seconds / round_seconds)))
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(repeat):
        for name, call in runners.items():
            if gap_s > 0:
                sleep(gap_s)
            number = numbers[name]
            for _ in range(settle):
                call()
            start = clock()
            for _ in range(number):
                call()
            samples[name].append((clock() - start) / number)
    return samples


def time_interleaved(runners: Mapping[str, Callable[[], object]],
                     protocol: TimingProtocol) -> dict[str, list[float]]:
    """`interleaved_samples` of `runners` under `protocol`; seconds per call, per sample."""
    return interleaved_samples(runners, protocol.repeat, warmup=protocol.warmup,
                               min_sample_s=protocol.min_sample_ms / 1e3,
                               gap_s=protocol.gap_ms / 1e3, settle=protocol.settle,
                               max_seconds=protocol.max_timing_s)
