"""Library implementations as costs: a GEMM or convolution kernel costs the cheaper of TVM's and
the BLAS's time.

A kernel that `library.implementations_for` can compute with a vendor call (an OpenBLAS GEMM,
batched GEMM or im2col convolution, with the kernel's bias / residual / activation epilogue
inside the call) is timed
once in that form, and its cost becomes the lower of the two
(`kernel_costs.cheaper_of`), so the solver weighs "library GEMM plus a separate epilogue
kernel" against "TVM kernel with the epilogue fused". Library times are measured once per
implementation and shape and kept in `library_times.json` beside the tuning log, so a
second compile measures nothing and chooses the same plan. The file is data from outside:
every entry is checked on reading (a known implementation, a well-formed shape, a finite
positive time) and one that is not is refused with a warning and measured again.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Mapping

import tvm
from tvm.runtime import num_threads

from ..errors import KorchError
from ..kernels.fused import structural_key
from ..library import Implementation, implementations_for
from ..library.epilogue_match import MAX_STEPS
from ..support.pool_spin import note_parallel_work
from ..support.safe_io import write_text_atomically
from .cache_state import preprocessing
from .kernel_costs import KernelCost, LibraryTime, cheaper_of
from .metaschedule_setup import SAMPLES

logger = logging.getLogger("korch_tvm.library_costs")

LIBRARY_TIMES_FILE = "library_times.json"
FORMAT_VERSION = 1
KNOWN_IMPLEMENTATIONS = ("openblas.sgemm", "openblas.sbgemm", "openblas.sconv2d", "korch.sgconv2d",
                         "cublas.sgemm", "cublas.sbgemm")
# A library call: implementation, then every spec field its time depends on (GemmSpec.key,
# ConvSpec.key). The name is the routine, then "+<step>" per epilogue step
# (library/epilogue_match.py).
_NUMBER = r"\d{1,10}"
_PAIR = rf"{_NUMBER},{_NUMBER}"
_GEMM_FIELDS = (rf"batch={_NUMBER} m={_NUMBER} n={_NUMBER} k={_NUMBER} ta=[01] tb=[01] ab=[01] "
                r"bb=[01]")
_CONV_FIELDS = (rf"layout=(nchw|nhwc) n={_NUMBER} c={_NUMBER} h={_NUMBER} w={_NUMBER} "
                rf"k={_NUMBER} r={_NUMBER} s={_NUMBER} p={_NUMBER} q={_NUMBER} stride={_PAIR} "
                rf"pad={_PAIR} dilation={_PAIR} groups={_NUMBER}")
_STEP = r"\+[a-z0-9_.:e-]{1,40}"
_ENTRY = re.compile(rf"(?P<name>[a-z]+\.[a-z0-9]+)(?P<steps>(?:{_STEP}){{0,{MAX_STEPS}}}) "
                    rf"(?:{_GEMM_FIELDS}|{_CONV_FIELDS})")
_STEPS = ("bias_n", "bias_m", "residual", "relu", "gelu_erf", "gelu_tanh", "sigmoid", "silu",
          "hardswish")
_MAX_SECONDS = 3600.0
# A time is kept for good, so it is the least of a few medians: a multi-threaded BLAS call
# synchronises its threads many times, so a core another process holds for a moment can
# stretch a whole median many times over.
MEASURE_ROUNDS = 3
# The runner's TVM threads spin on the cores for a while after timing kernels, and a BLAS call
# timed meanwhile waits on its own threads; so a batch of library timings starts after this
# pause.
SETTLE_SECONDS = 0.3


def entry_key(implementation: Implementation) -> str:
    """The file's key of one library call: its name and the shape of what it computes."""
    return f"{implementation.name} {implementation.spec.key()}"


def entry_problem(key, seconds) -> str | None:
    """Why a file entry cannot be used (None: it can)."""
    match = _ENTRY.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        return "not a library call of a known form"
    if match["name"] not in KNOWN_IMPLEMENTATIONS:
        return f"unknown implementation {match['name']!r}"
    for step in match["steps"].split("+")[1:]:
        if not (step in _STEPS or _is_clip(step)):
            return f"unknown epilogue step {step!r}"
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return f"time {seconds!r} is not a number"
    if not (math.isfinite(seconds) and 0 < seconds <= _MAX_SECONDS):
        return f"time {seconds!r} is not a finite positive number of seconds"
    return None


def _is_clip(step: str) -> bool:
    """clip:<low>:<high> with finite bounds, low <= high."""
    parts = step.split(":")
    try:
        low, high = (float(x) for x in parts[1:]) if len(parts) == 3 else (math.nan, math.nan)
    except ValueError:
        return False
    return parts[0] == "clip" and math.isfinite(low) and math.isfinite(high) and low <= high


def read_library_times(path: str, warn: bool = True) -> dict[str, float]:
    """The valid entries of the file at `path` ({} when it is absent or unreadable as a whole);
    each refused entry, or a refused file, is one warning line (with `warn`)."""
    report = logger.warning if warn else logger.debug
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        report("library times %s are unreadable (%s); measuring them again", path,
               str(err).splitlines()[0] if str(err) else type(err).__name__)
        return {}
    if not (isinstance(content, dict) and content.get("format") == FORMAT_VERSION
            and isinstance(content.get("seconds"), dict)):
        report("library times %s are not a format-%d library times file; measuring them "
               "again", path, FORMAT_VERSION)
        return {}
    times = {}
    for key, seconds in content["seconds"].items():
        problem = entry_problem(key, seconds)
        if problem is None:
            times[key] = float(seconds)
        else:
            report("library times %s: entry %.80r refused (%s); measuring it again", path,
                   key, problem)
    return times


class LibraryTimes:
    """Library call times kept in `directory/library_times.json`, measured where missing, on
    the CPU from `cache_state` (costing/cache_state.py; the log directory is the state's)."""

    def __init__(self, directory: str, cache_state: str = "cold") -> None:
        self.cache_state = cache_state
        self.path = os.path.join(directory, LIBRARY_TIMES_FILE)
        self._times = read_library_times(self.path)
        self.measured = 0  # calls this object timed (a warm second compile times none)
        self._measured_keys: set[str] = set()
        self._last_measured = -math.inf

    def seconds(self, implementation: Implementation, measure: bool = True
                ) -> tuple[float, bool] | None:
        """(seconds of one call, whether it was measured now rather than read); None when it
        is not recorded and `measure` is False (a spent time budget measures nothing)."""
        key = entry_key(implementation)
        if key in self._times:
            return self._times[key], key in self._measured_keys
        if not measure:
            return None
        if time.perf_counter() - self._last_measured > 1.0:   # the first of a batch
            time.sleep(SETTLE_SECONDS)
        if implementation.name.startswith("cublas."):
            rounds = (implementation.measure() for _ in range(MEASURE_ROUNDS))
        else:  # the CPU's calls: from the cache state TVM kernels are timed from, as many
            # runs a round as the runner times of a TVM kernel
            preprocess = preprocessing(self.cache_state, num_threads())
            rounds = (implementation.measure(repeats=SAMPLES, preprocess=preprocess)
                      for _ in range(MEASURE_ROUNDS))
        seconds = min(rounds)
        note_parallel_work()  # the call ran on this process's TVM pool
        assert entry_problem(key, seconds) is None, f"{key}: measured {seconds!r}"
        self._times[key] = seconds
        self._measured_keys.add(key)
        self._last_measured = time.perf_counter()
        self.measured += 1
        self._save(key, seconds)
        return seconds, True

    def _save(self, key: str, seconds: float) -> None:
        """The whole file rewritten with this entry added (another compile may have added
        others since it was read); a log that cannot be written keeps them in memory."""
        merged = {**read_library_times(self.path, warn=False), key: seconds}
        text = json.dumps({"format": FORMAT_VERSION, "seconds": dict(sorted(merged.items()))},
                          indent=1)
        try:
            write_text_atomically(self.path, text + "\n")
        except KorchError as err:
            logger.warning("library times not kept: %s", err)


class LibraryCosts:
    """The library side of one costing session: which kernels have a library implementation
    (`device` "cpu": OpenBLAS, "cuda": cuBLAS), their times, and costs made the cheaper."""

    def __init__(self, directory: str, device: str = "cpu", cache_state: str = "cold") -> None:
        self.device = device
        self.times = LibraryTimes(directory, cache_state)
        self._implementations: dict[str, Implementation | None] = {}

    def implementation(self, kernel_mod: tvm.IRModule) -> Implementation | None:
        key = structural_key(kernel_mod)
        if key not in self._implementations:
            try:
                found = implementations_for(kernel_mod, self.device)
            except Exception as err:  # noqa: BLE001 - a matcher's bug costs the kernel its
                # library form, never the compile: TVM's kernel stays its only implementation
                logger.warning("kernel %s: library matching failed (%s: %s); TVM's kernel only",
                               key, type(err).__name__, str(err).splitlines()[0] if str(err)
                               else "")
                found = []
            self._implementations[key] = found[0] if found else None
        return self._implementations[key]

    def library_time(self, kernel_mod: tvm.IRModule, measure: bool = True
                     ) -> LibraryTime | None:
        implementation = self.implementation(kernel_mod)
        found = None if implementation is None else self.times.seconds(implementation, measure)
        return None if found is None else LibraryTime(implementation.name, *found)

    def cheaper(self, kernels: Mapping[str, tvm.IRModule], costs: Mapping[str, KernelCost],
                measure: bool = True) -> dict[str, KernelCost]:
        """`costs` with each kernel's cost the lower of TVM's and its library implementation's
        (without `measure`: only where the library's time is recorded)."""
        return {name: cheaper_of(cost, self.library_time(kernels[name], measure))
                if name in kernels else cost for name, cost in costs.items()}
