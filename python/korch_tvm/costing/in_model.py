"""Kernel time inside the model vs isolated, and an opt-in correction of later plans.

The solver adds up kernel costs measured in isolation, but a kernel runs differently inside a
model: its input is warm from the kernel before it, its weights may or may not be, the worker
threads may be awake or asleep. `korch-tvm bench` times every kernel call in the running model
(`kind_profile.tvm_kernel_times`); here those times are joined with the compile report into
rows (kernel, kind, isolated ms, in-model ms) and summed by kind for the bench's summary.

With `bench --calibrate` each kernel's ratio in-model / isolated is also kept beside the tuning
log (`in_model_times.json`), and later plans (both paths' modelled latency too) scale a
kernel's isolated cost by its own ratio when it was timed in a model, else by the median ratio
of its kind, else leave it. It is off by default because the per-call timing is not faithful
enough to steer plans on this machine: on a busy machine the instrumented runs slow down and
single small kernels come out many times their isolated time (a guess at why: the worker
threads go to sleep while the hook's Python runs, and every call pays their wake-up). What
first motivated it, fused conv + SiLU kernels looking dearer in isolation than in the model,
was mostly libm's scalar sigmoid, which fast math (lowering/fast_math.py) removed.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from ..graph.primitive_graph import KERNEL_PREFIX

logger = logging.getLogger(__name__)

FILE_NAME = "in_model_times.json"
FORMAT_VERSION = 1
# Ratios outside this range are a broken measurement (a kernel timed while the machine was
# swapping, a name joined to the wrong kernel), not a property of the kernel.
PLAUSIBLE_RATIO = (0.1, 10.0)


@dataclass(frozen=True)
class InModelTimes:
    """Per kernel key, in-model / isolated time, and the kind of each timed kernel."""

    ratios: Mapping[str, float]
    kinds: Mapping[str, str]

    def __bool__(self) -> bool:
        return bool(self.ratios)

    def kind_ratios(self) -> dict[str, float]:
        by_kind: dict[str, list[float]] = {}
        for key, ratio in self.ratios.items():
            by_kind.setdefault(self.kinds.get(key, "memory"), []).append(ratio)
        return {kind: statistics.median(values) for kind, values in by_kind.items()}

    def factors(self, kinds_of_keys: Mapping[str, str]) -> dict[str, float]:
        """The factor for each key: its own ratio, else its kind's median ratio, else 1."""
        by_kind = self.kind_ratios()
        return {key: self.ratios.get(key, by_kind.get(kind, 1.0))
                for key, kind in kinds_of_keys.items()}


def scaled_costs(costs: Mapping[str, object], factors: Mapping[str, float]) -> dict:
    """KernelCosts with their seconds multiplied by the key's factor (missing: unchanged)."""
    return {key: cost if factors.get(key, 1.0) == 1.0
            else replace(cost, seconds=cost.seconds * factors[key])
            for key, cost in costs.items()}


# ----------------------------------------------------------------------------- joining
LIBRARY_KIND = "library"  # the kind of a kernel that runs as a library call


def library_call_name(order: int) -> str:
    """The profile's name for a run's `order`-th library call (costing/library_costs.py): one
    packed function serves every GEMM it replaced, so only the order tells the calls apart,
    and the calls run in the plan's kernel order."""
    return f"{LIBRARY_KIND}#{order}"


def is_library_call(name: str) -> bool:
    return name.startswith(f"{LIBRARY_KIND}#")


def kernel_rows(report: Mapping, kernel_ms: Mapping[str, float]) -> list[dict]:
    """One row per kernel of a compile report that ran in the model: name, key, kind, isolated
    ms and in-model ms, both per model run (a stock kernel called twice counts twice).

    `kernel_ms` is `kind_profile.tvm_kernel_times` of the report's library: a Korch kernel
    built as a library call is found under its order among them, and is of the kind "library"
    (its ratio says nothing of TVM's kernels of its compute kind). Kernels with the same key are
    one row: they get the same schedule, and when the pre-packed copies of two are
    identical the build keeps one PrimFunc, called under the first one's name for both.
    """
    kinds = report.get("kernel_kinds") or {}
    by_key: dict[str, dict] = {}
    for name, profiled_as, key, isolated_ms, calls in _report_kernels(report):
        if key is None or isolated_ms is None:
            continue  # opaque or unmeasurable
        row = by_key.setdefault(key, {"names": [], "isolated_ms": 0.0})
        row["names"].append((name, profiled_as))
        row["isolated_ms"] += isolated_ms * calls
    rows = []
    for key, row in by_key.items():
        called = [(name, profiled) for name, profiled in row["names"] if profiled in kernel_ms]
        if not called:
            continue  # not called in this run
        name, profiled = called[0]
        kind = LIBRARY_KIND if is_library_call(profiled) else kinds.get(name, "memory")
        rows.append({"name": name, "key": key, "kind": kind, "isolated_ms": row["isolated_ms"],
                     "in_model_ms": sum(kernel_ms[profiled] for _, profiled in called)})
    return rows


def _report_kernels(report: Mapping) -> list[tuple]:
    """(name, name in the profile, key, isolated ms, calls per run) of each kernel reported."""
    if not report.get("korch"):
        return [(kernel["name"], kernel["name"], kernel.get("key"),
                 kernel.get("isolated_ms", kernel.get("ms")), kernel.get("calls", 1))
                for kernel in report.get("kernels", [])]
    entries, library_calls = [], 0
    for index, kernel in enumerate(report["plan"]["kernels"]):
        name = profiled_as = f"{KERNEL_PREFIX}{index}"
        if kernel.get("implementation", "tvm") != "tvm":
            profiled_as = library_call_name(library_calls)
            library_calls += 1
        entries.append((name, profiled_as, kernel.get("key"),
                        kernel.get("isolated_ms", kernel.get("ms")), 1))
    return entries


def fidelity_by_kind(rows: Sequence[Mapping]) -> dict[str, dict]:
    """Per kind: summed isolated and in-model ms and their ratio, for the bench summary."""
    table: dict[str, dict] = {}
    for row in rows:
        entry = table.setdefault(row["kind"], {"isolated_ms": 0.0, "in_model_ms": 0.0})
        entry["isolated_ms"] += row["isolated_ms"]
        entry["in_model_ms"] += row["in_model_ms"]
    for entry in table.values():
        entry["ratio"] = (entry["in_model_ms"] / entry["isolated_ms"]
                          if entry["isolated_ms"] > 0 else None)
    return table


# ----------------------------------------------------------------------------- the store
def load_in_model_times(directory: str | None) -> InModelTimes:
    """What `record_in_model_times` kept in `directory`; empty when there is nothing (or the
    file is unreadable: it is then moved aside with a warning, and plans use isolated costs)."""
    entries = _read_entries(os.path.join(directory, FILE_NAME)) if directory else {}
    return InModelTimes({key: entry["ratio"] for key, entry in entries.items()
                         if _plausible(entry["ratio"])},
                        {key: entry["kind"] for key, entry in entries.items()})


def _read_entries(path: str) -> dict[str, dict]:
    """The file's entries, each with a float "ratio" and a str "kind"; {} when the file is
    missing or unreadable (moved aside to <file>.corrupt with a warning)."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {data.get('version')!r}, expected {FORMAT_VERSION}")
        return {key: {**entry, "ratio": float(entry["ratio"]), "kind": str(entry["kind"])}
                for key, entry in data["kernels"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        aside = path + ".corrupt"
        logger.warning("%s is unreadable (%s); moved to %s, plans use isolated kernel costs",
                       path, err, aside)
        try:
            os.replace(path, aside)
        except OSError:
            pass
        return {}


def record_in_model_times(directory: str, rows: Sequence[Mapping], model: str) -> int:
    """Keep each row's ratio in `directory` (the target's tuning-log directory), replacing
    an older ratio of the same kernel; returns how many were kept. Rows whose ratio is
    implausible (see PLAUSIBLE_RATIO) are dropped with a warning."""
    entries = {}
    for row in rows:
        ratio = row["in_model_ms"] / row["isolated_ms"] if row["isolated_ms"] > 0 else math.inf
        if not _plausible(ratio):
            logger.warning("in-model time of %s (%s) is %.3g x its isolated time; not kept",
                           row["name"], row["key"], ratio)
            continue
        entries[row["key"]] = {"ratio": ratio, "kind": row["kind"], "model": model,
                               "isolated_ms": row["isolated_ms"],
                               "in_model_ms": row["in_model_ms"],
                               "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if not entries:
        return 0
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, FILE_NAME)
    with open(path + ".lock", "ab") as lock:  # two benches writing at once lose nothing
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        existing = _read_entries(path)
        existing.update(entries)
        handle = tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False,
                                             encoding="utf-8")
        with handle:
            json.dump({"version": FORMAT_VERSION, "kernels": existing}, handle, indent=1,
                      sort_keys=True)
        os.replace(handle.name, path)  # readers see the old file or the new one, never half
    return len(entries)


def _plausible(ratio: float) -> bool:
    return PLAUSIBLE_RATIO[0] <= ratio <= PLAUSIBLE_RATIO[1]
