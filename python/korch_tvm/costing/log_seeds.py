"""Where tuning logs live, and how a log that is still empty is seeded from logs of other CPUs.

A user's records go to a cache directory of their own (`user_log_root`), never into the
repository: the shipped `tuning_logs/` is read-only here, a seed (`seed_roots`). When a compile
opens its log `<root>/<tag>` and finds no records in it:

* a seed root holding the very same tag (shipped logs of this CPU model) is merged in, records
  and cost model: same machine class, so its records are usable as they are;
* otherwise the nearest *compatible* tag (same target kind and vector instruction set: avx512,
  avx2, avx, sse, sve or neon as LLVM knows the tag's CPU; the same major arch on CUDA), in the
  seed roots or beside the log in the user's own root, becomes the log's `Seed`. Its records
  are only ever predictions and starting points: a kernel's default-schedule time there,
  calibrated to this machine, predicts its default time here (what planning compares), and
  when a kernel is measured here its best schedule there is measured too, beside the default
  ones, and kept when faster (costing/measure.py). Nothing from a foreign
  tag is used as a cost without being measured here. Which seed a log took is remembered in
  the log (`SEED_FILE`), so later compiles keep using it once the log has records of its own.

A foreign log is read through a validating merge (`log_merge.merge_log_directory`) into a
private copy (`<log>/.seeds/<tag>`, or a temporary directory when the log is read-only): it is
untrusted data, and the seed root itself is never written.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # TVM loads in a second; the CLI asks `user_log_root` before it needs TVM
    import tvm

    from .tuning_log import TuningLog

logger = logging.getLogger("korch_tvm.log_seeds")

CACHE_VARIABLE = "KORCH_TVM_CACHE_DIR"
SEED_VARIABLE = "KORCH_TVM_SEED_LOGS"  # seed roots, separated by os.pathsep; "" for none
SEED_FILE = "seeded_from.json"
WORKLOAD_FILE = "database_workload.json"  # tuning_log's, named here without importing TVM
RECORD_FILE = "database_tuning_record.json"
COST_MODEL_FILES = ("cost_model.json", "cost_model.json.meta.json")
MIN_CALIBRATION_KERNELS = 3  # kernels timed in both logs before their ratio is trusted
# A log directory's tag: its CPU and cores, and the cache state its records were timed from
# (costing/cache_state.py: "-l3" or none)
_LLVM_TAG = re.compile(r"llvm-(?P<cpu>[A-Za-z0-9._-]+)-(?P<cores>[0-9]+)c(?P<state>-l3)?")
_CUDA_TAG = re.compile(r"cuda-sm_(?P<arch>[0-9]+)[af]?")


def user_log_root() -> str:
    """The default root of a user's tuning logs: `$KORCH_TVM_CACHE_DIR/tuning_logs`, else
    `$XDG_CACHE_HOME/korch_tvm/tuning_logs`, else `~/.cache/korch_tvm/tuning_logs`."""
    if os.environ.get(CACHE_VARIABLE):
        return os.path.join(os.environ[CACHE_VARIABLE], "tuning_logs")
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "korch_tvm", "tuning_logs")


def seed_roots() -> list[str]:
    """The read-only roots of seed logs: `$KORCH_TVM_SEED_LOGS` (os.pathsep-separated; empty:
    none), else the repository's shipped `tuning_logs/` when there is one."""
    if SEED_VARIABLE in os.environ:
        return [root for root in os.environ[SEED_VARIABLE].split(os.pathsep) if root]
    import korch_tvm

    shipped = Path(korch_tvm.__file__).resolve().parents[2] / "tuning_logs"
    return [str(shipped)] if shipped.is_dir() else []


def target_isa(target) -> str:
    """The vector instruction set code for `target` uses: "avx512", ..., "neon", "generic";
    for CUDA "sm_<major>x" (an sm_90 log serves an sm_90a GPU, not an sm_80 one)."""
    from ..backend.target import parse_target
    from ..backend.tile_shape import cpu_isa

    target = parse_target(target)
    if target.kind.name == "cuda":
        match = _CUDA_TAG.fullmatch("cuda-" + str(target.attrs.get("arch", "")))
        return f"sm_{match['arch'][:-1]}x" if match else "unknown"
    if target.kind.name != "llvm":
        return target.kind.name
    return cpu_isa(target)


def tag_target(tag: str):
    """A target whose code and tag are those of a log directory named `tag`; None for a tag
    this LLVM cannot read (an unknown CPU, another architecture)."""
    from ..backend.target import parse_target
    from ..errors import KorchError

    llvm, cuda = _LLVM_TAG.fullmatch(tag), _CUDA_TAG.fullmatch(tag)
    try:
        if llvm:
            return parse_target({"kind": "llvm", "mcpu": llvm["cpu"],
                                 "num-cores": int(llvm["cores"])})
        if cuda:
            return parse_target({"kind": "cuda", "arch": tag[len("cuda-"):]})
    except KorchError:
        return None
    return None


def tag_isa(tag: str) -> str:
    target = tag_target(tag)
    return "unknown" if target is None else target_isa(target)


class Seed:
    """Records of a compatible log of another tag: predictions and starting points only."""

    def __init__(self, tag: str, isa: str, log: TuningLog, holder=None) -> None:
        self.tag, self.isa, self.log = tag, isa, log
        self._holder = holder  # the private copy's temporary directory, removed with it
        self.kernel_count = sum(math.isfinite(k.best_seconds) for k in log.kernels())

    def best_seconds(self, kernel_mod: tvm.IRModule) -> float | None:
        """The kernel's best time in the seed log (None when it has no finite one)."""
        best = self.log.best_seconds(kernel_mod)
        return best if best is not None and math.isfinite(best) else None

    def starting_trace(self, kernel_mod: tvm.IRModule):
        """The trace of the kernel's best schedule in the seed log, unless it is the kernel as
        written (which the default schedules already cover); None when there is none."""
        from .log_database import leaves_kernel_as_written

        record = self.log.best_record(kernel_mod)
        if record is None or leaves_kernel_as_written(record.trace):
            return None
        return record.trace

    def calibration(self, local_log: TuningLog) -> float:
        """Median ratio of this machine's default-schedule times to the seed's, over kernels
        timed in both (1 until MIN_CALIBRATION_KERNELS are)."""
        kernels = [kernel.kernel for kernel in local_log.kernels()]
        ratios = []
        for here, there in zip(local_log.default_seconds_of(kernels),
                               self.log.default_seconds_of(kernels)):
            if here and there and math.isfinite(here) and math.isfinite(there):
                ratios.append(math.log(here / there))
        if len(ratios) < MIN_CALIBRATION_KERNELS:
            return 1.0
        return math.exp(statistics.median(ratios))

    def predictions(self, modules: Mapping[str, tvm.IRModule],
                    local_log: TuningLog) -> dict[str, float]:
        """Seconds predicted for each module the seed log has timed: its default-schedule
        time there, times the calibration. Not its best: planning (pruning, lazy costing)
        compares predictions with default-schedule costs measured here, and a tuned time
        beside them made the seed's kernels look far cheaper than anything measured; the best
        schedule enters as a starting point instead, measured here."""
        ratio = self.calibration(local_log)
        found = dict(zip(modules, self.log.default_seconds_of(list(modules.values()))))
        return {key: seconds * ratio for key, seconds in found.items()
                if seconds is not None and math.isfinite(seconds)}


def seed_log(tuning_log: TuningLog, roots: Sequence[str] | None = None) -> Seed | None:
    """Seed `tuning_log` if it is empty (see the module docstring); returns the foreign Seed
    it uses, if any (also the one an earlier compile chose for it)."""
    roots = seed_roots() if roots is None else list(roots)
    own_root = os.path.dirname(os.path.abspath(tuning_log.directory))
    local_tag = os.path.basename(tuning_log.directory)
    remembered = _remembered(tuning_log, [own_root, *roots])
    if remembered is not None:
        return _open_seed(remembered, os.path.basename(remembered), tuning_log)
    if len(tuning_log.database):
        return None
    for root in roots:
        same = os.path.join(root, local_tag)
        if not _same_directory(root, own_root) and _has_records(same):
            return _merge_same_tag(same, tuning_log)
    here = target_isa(tuning_log.target)
    found = [(root, tag) for root in [own_root, *roots] for tag in _tags_in(root)
             if tag != local_tag]
    compatible = [(root, tag) for root, tag in found
                  if tag.split("-")[0] == local_tag.split("-")[0] and tag_isa(tag) == here]
    if not compatible:
        _say_why_not(local_tag, here, found)
        return None
    root, tag = min(compatible, key=lambda entry: _distance(entry, local_tag, own_root))
    seed = _open_seed(os.path.join(root, tag), tag, tuning_log)
    _remember(tuning_log, os.path.join(root, tag))
    logger.info("tuning log %s is empty: seeding from %s (same ISA %s): %d kernels as "
                "predictions and starting points", local_tag, tag, here, seed.kernel_count)
    return seed


def _merge_same_tag(source: str, tuning_log: TuningLog) -> None:
    """Merge a seed of this very tag into the log, with its cost model when the log has none."""
    from .log_merge import merge_log_directory

    counts = merge_log_directory(source, tuning_log.directory, tuning_log.verdicts)
    for name in COST_MODEL_FILES:
        if os.path.isfile(os.path.join(source, name)) and tuning_log.writable and \
                not os.path.exists(os.path.join(tuning_log.directory, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(tuning_log.directory, name))
    tuning_log.refresh()
    logger.info("tuning log %s is empty: seeded with the %d records of %d kernels logged for "
                "this CPU in %s", os.path.basename(tuning_log.directory),
                counts.get("records_added", 0), counts.get("workloads_added", 0),
                os.path.dirname(source))


def _say_why_not(local_tag: str, here: str, found: list[tuple[str, str]]) -> None:
    if not found:
        logger.info("tuning log %s is empty and no other log can seed it; every kernel is "
                    "measured here", local_tag)
        return
    isas = ", ".join(f"{tag} ({tag_isa(tag)})" for _, tag in found)
    logger.info("tuning log %s is empty and no compatible log seeds it: the logs found have "
                "ISA %s, this target %s", local_tag, isas, here)


def _distance(entry: tuple[str, str], local_tag: str, own_root: str) -> tuple:
    """Nearest first: timed from the same cache state, the same core count, the user's own
    logs, the most records, by name."""
    root, tag = entry
    cores = _LLVM_TAG.fullmatch(tag)
    mine = _LLVM_TAG.fullmatch(local_tag)
    core_gap = abs(int(cores["cores"]) - int(mine["cores"])) if cores and mine else 0
    other_state = bool(cores and mine and cores["state"] != mine["state"])
    return (other_state, core_gap, not _same_directory(root, own_root),
            -_line_count(os.path.join(root, tag, RECORD_FILE)), tag)


SEED_COPIES = ".seeds"  # in a writable log: validated copies of its seed, kept between compiles


def _open_seed(directory: str, tag: str, tuning_log: TuningLog) -> Seed:
    """The seed at `directory`, read once per compile: its costing session keeps it
    (costing/session.py), and a writable log keeps the validated copy between compiles."""
    state = [os.path.realpath(directory),
             [[os.stat(path).st_size, os.stat(path).st_mtime_ns]
              for path in (os.path.join(directory, WORKLOAD_FILE),
                           os.path.join(directory, RECORD_FILE))]]
    return _private_copy(directory, tag, tuning_log, state)


def _private_copy(directory: str, tag: str, tuning_log: TuningLog, state: list) -> Seed:
    """The seed read through a validating merge into a copy of its own: kept in the log's
    SEED_COPIES while the seed's files stay as they were (merging takes seconds, reading the
    copy one), else in a temporary directory, removed with the `Seed`. Lines are judged
    through the log's own verdicts (`TuningLog.verdicts`)."""
    from .log_merge import merge_log_directory
    from .tuning_log import TuningLog

    target = tag_target(tag)
    holder = None
    if tuning_log.writable:
        copies = os.path.join(tuning_log.directory, SEED_COPIES)
        stamp = os.path.join(copies, tag + ".source.json")
        if not _stamped(stamp, state):
            shutil.rmtree(os.path.join(copies, tag), ignore_errors=True)
            merge_log_directory(directory, os.path.join(copies, tag), tuning_log.verdicts)
            with open(stamp, "w", encoding="utf-8") as file:
                json.dump(state, file)
    else:
        holder = tempfile.TemporaryDirectory(prefix="korch-tvm-seed-")
        copies = holder.name
        merge_log_directory(directory, os.path.join(copies, tag), tuning_log.verdicts)
    seed_copy = TuningLog(copies, target, tag=tag, verdicts=tuning_log.verdicts)
    return Seed(tag, target_isa(target), seed_copy, holder)


def _stamped(stamp: str, state: list) -> bool:
    try:
        with open(stamp, encoding="utf-8") as file:
            return json.load(file) == state
    except (OSError, ValueError):
        return False


def _remember(tuning_log: TuningLog, directory: str) -> None:
    if not tuning_log.writable:
        return
    path = os.path.join(tuning_log.directory, SEED_FILE)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump({"directory": os.path.abspath(directory)}, file)
    os.replace(temporary, path)


def _remembered(tuning_log: TuningLog, roots: Sequence[str]) -> str | None:
    """The seed directory an earlier compile chose, if it is still a log in one of `roots`
    (the file is data: a directory anywhere else is not read)."""
    try:
        with open(os.path.join(tuning_log.directory, SEED_FILE), encoding="utf-8") as file:
            directory = str(json.load(file)["directory"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.warning("tuning log %s: %s is unreadable (%s); no seed is used",
                       tuning_log.directory, SEED_FILE, err)
        return None
    parent = os.path.dirname(os.path.abspath(directory))
    if any(_same_directory(parent, root) for root in roots) and _has_records(directory) \
            and tag_target(os.path.basename(directory)) is not None:
        return directory
    return None


def _tags_in(root: str) -> list[str]:
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    return [name for name in names if _has_records(os.path.join(root, name))]


def _has_records(directory: str) -> bool:
    try:
        return os.path.getsize(os.path.join(directory, RECORD_FILE)) > 0 and \
            os.path.isfile(os.path.join(directory, WORKLOAD_FILE))
    except OSError:
        return False


def _line_count(path: str) -> int:
    try:
        with open(path, "rb") as file:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: file.read(1 << 20), b""))
    except OSError:
        return 0


def _same_directory(first: str, second: str) -> bool:
    return os.path.realpath(first) == os.path.realpath(second)
