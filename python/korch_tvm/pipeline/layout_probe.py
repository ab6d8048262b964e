"""A layout left unplanned when its heaviest kernels already lose clearly.

Planning a model with convolutions in both activation layouts measured every kernel either
plan needed, and on a cold CNN compile about half of the time went to the layout that then
lost (NCHW, modelled 1.3-3.7x slower than NHWC on 12 of the zoo's 21 convolution models). The
convolutions decide much of the contest, so the heaviest stock kernels of each layout and
compute kind (FuseOps' groups, by FLOPs times uses, at least `PROBE_FLOP_SHARE` of each kind's
FLOPs among the kernels that differ between the layouts) are measured first; each kind's FLOP
rate on them stands for the whole kind, and a layout whose FLOP rate so estimated is
`SCREEN_RATIO` times below the best layout's, and whose clear wins (convolutions both measured
that it runs that much faster) would save under `REGION_GAIN` of the best layout's time, is
not planned. By kind, because a kind with few FLOPs can hold
much of the time: SSDlite's depthwise convolutions are 8 % of its convolution FLOPs and ran
18.9 ms in NCHW against 4.6 ms in NHWC, while its heaviest 1x1 convolutions, all that a probe
by FLOPs alone measured, ran within 10 % (bench/results/layout-probe-kinds/).
The same clear wins decide whether a layout per region is costed after the plans: where no
layout but the fastest clearly wins a probed convolution, no region is likely to prefer it
(DenseNet-121: NCHW within `SCREEN_RATIO` and planned, its regions costed in both layouts for
a plan all in NHWC).
Where the kernels that differ between the layouts are a small share of the model's FLOPs (a
ViT's patch embedding, under `MINOR_SHARE`), the layout choice can change little, and only the
layout that is faster on them is planned.
A small model, quick to plan twice, is not probed. The probe's measurements go into the
tuning log, its lowered graphs go to the plans, and the kernels it built are built for the
plans too; the rest of a layout's candidates are enumerated and built only once the layout
is kept (DenseNet-121: 2.3 s of kernels for the layout dropped). Predictions cannot stand in
for the probe on a new machine: there a fresh log's cost model gives both layouts the same
time within 0.1 %.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Mapping, NamedTuple

import tvm

from ..costing.session import CostingSession
from ..kernels.fused import distinct_kernels
from ..kernels.kernel_facts import kernel_flops
from ..kernels.kinds import kernel_kind
from ..support.memo import KeyedMemo
from .layout_plan import Lowered

logger = logging.getLogger("korch_tvm.data_layout")

SCREEN_RATIO = 1.3  # a layout this many times slower on the probe kernels is not planned
# ... unless the convolutions it clearly wins would save this share of the fastest layout's
# time: SSDlite's NCHW won one 1x1 convolution 1.35x (0.21 ms, 1.5 % of NHWC's estimate) and was
# planned in full, 40 % of a cold compile, for a plan 1.83x slower and no region in NCHW.
REGION_GAIN = 0.02
PROBE_FLOP_SHARE = 0.5  # of each kind's FLOPs, covered by the kernels measured
PROBE_MAX_KERNELS = 8  # per layout and kind, however the FLOPs are spread
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
    kind: str = "memory"  # kernels/kinds.py


def stock_kernels(lowered: Lowered, built: KeyedMemo | None = None) -> dict[str, StockKernel]:
    """The distinct kernels of TVM's fusion groups in one layout's graph, by key (built
    through `built`, where the layout's plan finds them again)."""
    kernels = distinct_kernels(lowered.graph, lowered.graph.stock_fusion_groups(), built)
    uses = Counter(key for key in kernels.keys if key is not None)
    modules = kernels.modules
    return {key: StockKernel(modules[key], count, kernel_flops(modules[key]),
                             kernel_kind(modules[key]["main"]))
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
    total = sum(_work(kernel) for kernel in kernels.values())
    return sum(_work(kernel) for kernel in specific.values()) / total if total > 0 else 1.0


def probe_set(kernels: Mapping[str, StockKernel]) -> list[str]:
    """Per kind with FLOPs, its heaviest kernels by FLOPs times uses, until they cover
    `PROBE_FLOP_SHARE` of the kind's (at most `PROBE_MAX_KERNELS` of a kind)."""
    chosen = []
    for keys in _by_kind(kernels).values():
        total, covered, taken = sum(_work(kernels[key]) for key in keys), 0.0, 0
        for key in sorted(keys, key=lambda k: -_work(kernels[k])):
            if covered >= PROBE_FLOP_SHARE * total or taken == PROBE_MAX_KERNELS:
                break
            chosen.append(key)
            covered, taken = covered + _work(kernels[key]), taken + 1
    return chosen


def _work(kernel: StockKernel) -> float:
    return kernel.flops * kernel.uses


def _by_kind(kernels: Mapping[str, StockKernel]) -> dict[str, list[str]]:
    """The keys of the kernels with FLOPs, by kind (a layout's own transposes have none)."""
    kinds: dict[str, list[str]] = {}
    for key, kernel in kernels.items():
        if _work(kernel) > 0:
            kinds.setdefault(kernel.kind, []).append(key)
    return kinds


class Probe(NamedTuple):
    """One layout's probe: its FLOP rate, estimated over the `flops` of the kinds it measured,
    and the seconds of each convolution or matmul measured (all its uses) by its FLOPs (the
    same convolution has the same FLOPs in either layout). Memory-bound kernels count in the
    rate but are not compared one by one: a region starts at a convolution and its
    convolutions hold most of its time, and DenseNet-121's pooling and norm kernels, 0.1-0.8 ms
    each and faster in NCHW, had kept NCHW planned (1.7x below NHWC's rate) and its regions
    costed, for a plan all in NHWC."""

    rate: float
    seconds_by_flops: dict[float, float]
    flops: float = 0.0


def probe_result(kernels: Mapping[str, StockKernel], seconds: Mapping[str, float]) -> Probe:
    """The `Probe` of the kernels timed in `seconds` (each counted as often as it is used): the
    FLOPs of every kind probed over its time estimated at the FLOP rate of its probed kernels."""
    flops, time = 0.0, 0.0
    for keys in _by_kind(kernels).values():
        probed = [key for key in keys if key in seconds]
        probed_work = sum(_work(kernels[key]) for key in probed)
        if probed_work > 0:
            kind_work = sum(_work(kernels[key]) for key in keys)
            flops += kind_work
            time += sum(seconds[key] * kernels[key].uses for key in probed) * (
                kind_work / probed_work)
    by_flops: dict[float, float] = {}
    for key, taken in seconds.items():
        if kernels[key].kind == "memory":  # see `Probe`
            continue
        rounded, taken = float(f"{kernels[key].flops:.3g}"), taken * kernels[key].uses
        by_flops[rounded] = min(taken, by_flops.get(rounded, taken))
    return Probe(flops / time if time > 0 else 0.0, by_flops, flops)


def clear_wins(probe: Probe, best: Probe) -> float | None:
    """The seconds `probe`'s layout saves over `best`'s on the convolutions both measured that
    it runs `SCREEN_RATIO` times faster (within that ratio it is a tie, as two measurements of
    one kernel can differ by a few percent): what a region in that layout could win
    (layout/regions.py). None when the probes share no convolution."""
    mine, theirs = probe.seconds_by_flops, best.seconds_by_flops
    shared = theirs.keys() & mine.keys()
    if not shared:
        return None
    return sum(theirs[f] - mine[f] for f in shared if mine[f] * SCREEN_RATIO < theirs[f])


def _fastest(probes: Mapping[str, Probe | None]) -> Probe | None:
    """The probe of the highest FLOP rate; None when a probe is missing (a kernel could not be
    measured) or measured nothing."""
    if any(probe is None or probe.rate <= 0 for probe in probes.values()):
        return None
    return max(probes.values(), key=lambda probe: probe.rate)


def _wins_little(probe: Probe, best: Probe) -> bool:
    """Whether `probe`'s clear wins over `best` would save under `REGION_GAIN` of `best`'s
    estimated time (False when the probes share no convolution: nothing to tell)."""
    wins = clear_wins(probe, best)
    return wins is not None and wins < REGION_GAIN * best.flops / best.rate


def layouts_worth_planning(probes: Mapping[str, Probe | None]) -> list[str]:
    """Every layout but those beaten by the fastest: `SCREEN_RATIO` times below its FLOP rate,
    with `clear_wins` under `REGION_GAIN` of the fastest layout's estimated time. All of them
    when a probe is missing or the probes share no kernel."""
    best = _fastest(probes)
    if best is None:
        return list(probes)
    return [layout for layout, probe in probes.items()
            if not (probe.rate * SCREEN_RATIO < best.rate and _wins_little(probe, best))]


def regions_may_pay(probes: Mapping[str, Probe | None]) -> bool:
    """Whether a layout per region may model faster than the fastest layout alone: unless
    every other layout's `clear_wins` over the fastest is under `REGION_GAIN` of its time
    (DenseNet-121: NCHW within `SCREEN_RATIO` of NHWC's rate, and so planned, but faster on
    no convolution; its regions, costed in both layouts, all chose NHWC). True when a probe
    is missing or shares no convolution with the fastest."""
    best = _fastest(probes)
    return best is None or any(not _wins_little(probe, best)
                               for probe in probes.values() if probe is not best)


def layouts_to_plan(probes: Mapping[str, Probe | None], share: float) -> list[str]:
    """`layouts_worth_planning`, or only the fastest of them where the kernels that differ
    hold `share` < `MINOR_SHARE` of the FLOPs and every probe measured."""
    kept = layouts_worth_planning(probes)
    if len(kept) > 1 and share < MINOR_SHARE and None not in probes.values():
        return [max(kept, key=lambda layout: probes[layout].rate)]
    return kept


class Screened(NamedTuple):
    """`screen_layouts`' answer: the layouts to plan (each `Lowered`, for its plan), and whether
    a layout per region is worth costing after them (`regions_may_pay`; True where no probe
    ran)."""

    lowered: dict[str, Lowered]
    regions_may_pay: bool = True


def screen_layouts(lowered: Mapping[str, Lowered], session: CostingSession) -> Screened:
    """`lowered` (each layout's `lower_layout`) without the layouts the probe finds beaten or
    not worth planning (`layouts_to_plan`), the fastest on the probe first."""
    kernels = {layout: stock_kernels(each, session.built_kernels)
               for layout, each in lowered.items()}
    if len(lowered) < 2 or any(len(each) < PROBE_MIN_KERNELS for each in kernels.values()):
        return Screened(dict(lowered))
    probes = {}
    specific = layout_specific(kernels)
    for layout, stock in specific.items():
        probe = probe_set(stock)
        costs = session.measure({key: stock[key].module for key in probe})
        measured = {key: cost.seconds for key, cost in costs.items()
                    if cost.source in ("measured", "tuned", "log")}
        probes[layout] = probe_result(stock, measured) if len(measured) == len(probe) else None
    share = max(differing_share(kernels[layout], specific[layout]) for layout in lowered)
    kept = layouts_to_plan(probes, share)
    regions = len(kept) < 2 or regions_may_pay(probes)
    # said either way: whether a compile plans one layout or two is most of a CNN's time
    dropped = [layout for layout in lowered if layout not in kept]
    logger.info("layout probe: %s%s (GFLOP/s, from each kind's heaviest kernels: %s; the "
                "layouts differ in %.1f %% of the FLOPs)",
                f"{', '.join(dropped)} not planned" if dropped else "every layout planned",
                "" if regions else ", no layout per region (no layout clearly faster on a "
                "convolution the fastest runs)",
                ", ".join(f"{layout} {probe.rate / 1e9:.1f}" if probe else f"{layout} unmeasured"
                          for layout, probe in probes.items()), share * 100)
    if None not in probes.values():  # the fastest first: a later layout must beat its plan
        kept.sort(key=lambda layout: -probes[layout].rate)
    return Screened({layout: lowered[layout] for layout in kept}, regions)
