"""A layout left unplanned when its heaviest kernels already lose clearly.

Planning a model with convolutions in both activation layouts measured every kernel either
plan needed, and on a cold CNN compile about half of the time went to the layout that then
lost (NCHW, modelled 1.3-3.7x slower than NHWC on 12 of the zoo's 21 convolution models). The
convolutions decide much of the contest, so the heaviest stock kernels of each layout
(FuseOps' groups, by FLOPs times uses, at least `PROBE_FLOP_SHARE` of the FLOPs of the kernels
that differ between the layouts) are measured first, and a layout whose FLOP rate on them is
`SCREEN_RATIO` times below the best layout's, and which is not that much faster on any
convolution both measured, is not planned.
Where the kernels that differ between the layouts are a small share of the model's FLOPs (a
ViT's patch embedding, under `MINOR_SHARE`), the layout choice can change little, and only the
layout that is faster on them is planned.
A small model, quick to plan twice, is not probed. The probe's measurements go into the
tuning log, and its lowered graphs and candidates go to the plans, so the plan of a layout
kept does neither again. Predictions cannot stand in for the
probe on a new machine: there a fresh log's cost model gives both layouts the same time
within 0.1 %.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Mapping, NamedTuple

import tvm

from ..costing.session import CostingSession
from ..kernels.kernel_facts import kernel_flops
from .layout_plan import Prepared

logger = logging.getLogger("korch_tvm.data_layout")

SCREEN_RATIO = 1.3  # a layout this many times slower on the probe kernels is not planned
PROBE_FLOP_SHARE = 0.5  # of the stock plan's FLOPs, covered by the kernels measured
PROBE_MAX_KERNELS = 8  # per layout, however the FLOPs are spread
# Kernels that differ between the layouts holding less than this share of every layout's stock
# FLOPs leave little to choose: ViT-S/32's patch embedding is about 3 % of its FLOPs, and its
# two plans modelled 0.4 % apart (Swin-T 0.2 %, DeiT-tiny 0.6 %), each planned in full.
MINOR_SHARE = 0.05
# Below this many distinct stock kernels planning both layouts is quick and the probe saves
# little (ResNet-18 has 19, a three-convolution test block 3-5)
PROBE_MIN_KERNELS = 12


class StockKernel(NamedTuple):
    module: tvm.IRModule
    uses: int
    flops: float  # of one use


def stock_kernels(prepared: Prepared) -> dict[str, StockKernel]:
    """The distinct kernels of TVM's fusion groups in one layout's candidates, by key."""
    found = prepared.found
    uses = Counter(found.kernels.keys[i] for i, candidate in enumerate(found.candidates)
                   if candidate.is_stock and found.kernels.keys[i] is not None)
    return {key: StockKernel(found.kernels.modules[key], count,
                             kernel_flops(found.kernels.modules[key]))
            for key, count in uses.items()}


def layout_specific(kernels: Mapping[str, Mapping[str, StockKernel]]
                    ) -> dict[str, dict[str, StockKernel]]:
    """Each layout's stock kernels but those every layout has: a kernel the same in both (a
    matmul on tokens) runs as fast in either and says nothing of which one wins. LeViT-128S's
    heaviest kernels are such matmuls: probed with them, NCHW rated 0.8x NHWC and was planned
    in full; on the kernels that differ, 0.2x."""
    shared = set.intersection(*(set(each) for each in kernels.values())) if kernels else set()
    return {layout: {key: kernel for key, kernel in each.items() if key not in shared}
            for layout, each in kernels.items()}


def differing_share(kernels: Mapping[str, StockKernel],
                    specific: Mapping[str, StockKernel]) -> float:
    """The share of `kernels`' FLOPs (times uses) in `specific`, those no other layout has."""
    total = sum(kernel.flops * kernel.uses for kernel in kernels.values())
    return (sum(kernel.flops * kernel.uses for kernel in specific.values()) / total
            if total > 0 else 1.0)


def probe_set(kernels: Mapping[str, StockKernel]) -> list[str]:
    """The heaviest kernels by FLOPs times uses, until they cover `PROBE_FLOP_SHARE` of all
    (at most `PROBE_MAX_KERNELS`)."""
    total = sum(kernel.flops * kernel.uses for kernel in kernels.values())
    chosen, covered = [], 0.0
    for key in sorted(kernels, key=lambda k: -kernels[k].flops * kernels[k].uses):
        if covered >= PROBE_FLOP_SHARE * total or len(chosen) == PROBE_MAX_KERNELS:
            break
        chosen.append(key)
        covered += kernels[key].flops * kernels[key].uses
    return chosen


class Probe(NamedTuple):
    """One layout's probe: its FLOP rate over the kernels measured, and the seconds of each
    of them by its FLOPs (the same convolution has the same FLOPs in either layout)."""

    rate: float
    seconds_by_flops: dict[float, float]


def probe_result(kernels: Mapping[str, StockKernel], seconds: Mapping[str, float]) -> Probe:
    """The `Probe` of the kernels timed in `seconds` (each counted as often as it is used)."""
    flops = sum(kernels[key].flops * kernels[key].uses for key in seconds)
    time = sum(seconds[key] * kernels[key].uses for key in seconds)
    by_flops: dict[float, float] = {}
    for key, taken in seconds.items():
        rounded = float(f"{kernels[key].flops:.3g}")
        by_flops[rounded] = min(taken, by_flops.get(rounded, taken))
    return Probe(flops / time if time > 0 else 0.0, by_flops)


def layouts_worth_planning(probes: Mapping[str, Probe | None]) -> list[str]:
    """Every layout but those beaten by the fastest: `SCREEN_RATIO` times below its FLOP rate
    and nowhere `SCREEN_RATIO` times faster on a convolution both probes measured (a layout
    that clearly wins one of them may win a region: layout/regions.py; within that ratio it is
    a tie, as two measurements of one kernel can differ by a few percent). All of them when a
    probe is missing (None: a kernel could not be measured) or the probes share no kernel."""
    if any(probe is None or probe.rate <= 0 for probe in probes.values()):
        return list(probes)
    best = max(probes.values(), key=lambda probe: probe.rate)

    def beaten(probe: Probe) -> bool:
        shared = best.seconds_by_flops.keys() & probe.seconds_by_flops.keys()
        return (probe.rate * SCREEN_RATIO < best.rate and bool(shared)
                and all(probe.seconds_by_flops[f] * SCREEN_RATIO > best.seconds_by_flops[f]
                        for f in shared))

    return [layout for layout, probe in probes.items() if not beaten(probe)]


def layouts_to_plan(probes: Mapping[str, Probe | None], share: float) -> list[str]:
    """`layouts_worth_planning`, or only the fastest of them where the kernels that differ
    hold `share` < `MINOR_SHARE` of the FLOPs and every probe measured."""
    kept = layouts_worth_planning(probes)
    if len(kept) > 1 and share < MINOR_SHARE and None not in probes.values():
        return [max(kept, key=lambda layout: probes[layout].rate)]
    return kept


def screen_layouts(prepared: Mapping[str, Prepared],
                   session: CostingSession) -> dict[str, Prepared]:
    """`prepared` (each layout's `prepare_layout`) without the layouts the probe finds beaten
    or not worth planning (`layouts_to_plan`), the fastest on the probe first."""
    kernels = {layout: stock_kernels(each) for layout, each in prepared.items()}
    if len(prepared) < 2 or any(len(each) < PROBE_MIN_KERNELS for each in kernels.values()):
        return dict(prepared)
    probes = {}
    specific = layout_specific(kernels)
    for layout, stock in specific.items():
        probe = probe_set(stock)
        costs = session.measure({key: stock[key].module for key in probe})
        measured = {key: cost.seconds for key, cost in costs.items()
                    if cost.source in ("measured", "tuned", "log")}
        probes[layout] = probe_result(stock, measured) if len(measured) == len(probe) else None
    share = max(differing_share(kernels[layout], specific[layout]) for layout in prepared)
    kept = layouts_to_plan(probes, share)
    # said either way: whether a compile plans one layout or two is most of a CNN's time
    dropped = [layout for layout in prepared if layout not in kept]
    logger.info("layout probe: %s (GFLOP/s on the heaviest kernels: %s; the layouts differ in "
                "%.1f %% of the FLOPs)",
                f"{', '.join(dropped)} not planned" if dropped else "every layout planned",
                ", ".join(f"{layout} {probe.rate / 1e9:.1f}" if probe else f"{layout} unmeasured"
                          for layout, probe in probes.items()), share * 100)
    if None not in probes.values():  # the fastest first: a later layout must beat its plan
        kept.sort(key=lambda layout: -probes[layout].rate)
    return {layout: prepared[layout] for layout in kept}
