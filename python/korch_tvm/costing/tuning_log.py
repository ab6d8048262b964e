"""The on-disk tuning log: one directory per target, in MetaSchedule's own JSON database format.

Layout: `<root>/<target_tag>/database_workload.json` and `database_tuning_record.json`, one JSON
value per line, exactly what `ms.database.JSONDatabase` reads and writes, so stock MetaSchedule
can use, merge and share the files. Three things the stock database does not do, and this does:

* **Concurrency.** A record line names its workload by *line number* in the workload file, so two
  processes appending with their own in-memory numbering would corrupt each other. Every write
  here happens under an exclusive `fcntl` lock on `<dir>/.korch.lock`, after catching up with
  lines other processes appended, and is one `O_APPEND` write of a whole line.
* **Corruption.** The stock loader aborts on one bad line. Here a bad line is logged, copied
  verbatim to `<file>.corrupt` (never silently destroyed) and removed; a bad workload line in the
  middle is replaced by a copy of a good one so that every other line keeps its number. A
  record's schedule trace is replayed only when the record is used (8 ms a record); one that
  does not apply to its kernel is then warned about and skipped.
* **Read-only directories.** Records already there are used; new ones are kept in memory and a
  warning says they will not be saved (a shared, committed log stays usable, never half-written).
* **Wrong records.** A record found to compute something other than its kernel
  (`costing/record_check.py`) is moved out of the record file into `<file>.rejected` (`set_aside`),
  so neither korch_tvm nor stock MetaSchedule builds it again.
* **Untrusted records.** Every line is checked against `trace_policy` (pure JSON, before TVM
  reads it): a refused workload or record, or a record timed implausibly fast, is moved to
  `<file>.rejected` as well. A record sets a cost only once its trace has been applied to its
  workload (lazily, the best candidates only); one that does not apply is set aside too. The
  reason for every line set aside is appended to `<file>.rejected.reasons`, one line each.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import statistics
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload

from ..backend.target import inside_root, parse_target, target_tag
from ..errors import EnvironmentFault, KorchError
from .metaschedule_setup import SAMPLES
from .trace_policy import Refused, check_record, check_workload

logger = logging.getLogger("korch_tvm.tuning_log")

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
LOCK_FILE = ".korch.lock"
# Trials asked of MetaSchedule per workload line, one JSON line [workload line, trials] per
# tuning round. A kernel whose search space is small yields fewer records than trials asked;
# without this it would look under-tuned, and be searched again, on every compile.
ATTEMPTS_FILE = "tuning_attempts.json"
# MetaSchedule records a failed build/run with this mean time (kMaxMeanTime in its C++ code).
FAILED_RUN_SECONDS = 1e10
# No kernel launch, even an empty one, returns faster: a record timed below it is not a timing.
IMPLAUSIBLE_SECONDS = 1e-8
REJECTED_SUFFIX = ".rejected"
REASONS_SUFFIX = ".rejected.reasons"
_WARNED_TIMED_WARM: set[str] = set()  # directories whose warm-timed records were reported


class _Run:
    """One record of a workload: its mean time, its line in the record file, and the record,
    read from its JSON only when asked for.

    Reading a record replays its schedule trace on the workload (about 8 ms each): a log
    shared by a few models holds thousands, and a compile needs the best of a few hundred.
    """

    __slots__ = ("seconds", "file_line", "json", "workload", "_record", "problem")

    def __init__(self, json_value: list, workload: Workload, file_line: int) -> None:
        self.json = json_value  # [trace, run_secs, target, args_info], as in the file
        self.workload = workload
        self.file_line = file_line
        self.seconds = record_seconds(json_value[1])
        self._record: TuningRecord | None = None
        self.problem: str | None = None  # why the trace does not apply, once found

    @property
    def samples(self) -> int:
        return len(self.json[1] or [])

    @property
    def schedule(self) -> str:
        """The record's trace as text: equal for the same schedule, whoever measured it."""
        return json.dumps(self.json[0])

    @property
    def key(self) -> str:
        """The record's schedule and times: equal for the same line, whichever table read it."""
        return json.dumps(self.json[:2])

    def readable_record(self) -> TuningRecord | None:
        """The record, or None (with a warning, and the run counted as failed from then on)
        when its trace does not apply to its workload: a record no build can use."""
        if self._record is not None or self.problem is not None:
            return self._record
        try:
            self._record = TuningRecord.from_json(self.json, self.workload)
            return self._record
        except Exception as err:  # noqa: BLE001 - TVM raises its own error types
            self.problem = f"its trace does not apply to its kernel ({_short(err)})"
            logger.warning("tuning log: record line %d does not apply to its kernel (%s); it is "
                           "not used, and set aside", self.file_line + 1, _short(err))
            self.seconds = math.inf
            return None

    def moved_to(self, file_line: int) -> _Run:
        run = _Run(self.json, self.workload, file_line)
        run._record, run.seconds, run.problem = self._record, self.seconds, self.problem
        return run


@dataclass(frozen=True)
class LoggedKernel:
    """One workload of the log and what its records say about it."""

    kernel: tvm.IRModule
    best_seconds: float  # math.inf when every record is a failure
    records: int


def record_seconds(run_secs) -> float:
    """A record's time: the median of its samples; math.inf for a failed build or run.

    Not the mean: one sample stalled by another process (a page fault, a descheduled thread)
    would set the cost, as [2.79, 0.015, 0.015] ms once logged a 0.94 ms kernel. Not the minimum
    either: under frequency boost and warm caches it is biased low, below what a model's run
    sees. The median of the (three) samples ignores one outlier either way.
    """
    values = [float(s) for s in run_secs or []]
    if not values or min(values) >= FAILED_RUN_SECONDS:
        return math.inf
    return statistics.median(values)


mean_seconds = record_seconds  # its former name, still imported elsewhere


def _timed_warm(cpu: bool, seconds: float, samples: int) -> bool:
    """Whether a successful CPU record was timed the old way: fewer samples than a run gives
    now (`SAMPLES`, each call after its own cache flush), so two of its calls ran warm."""
    return cpu and math.isfinite(seconds) and samples < SAMPLES


def _dump_line(value) -> bytes:
    return (json.dumps(value, separators=(",", ":")) + "\n").encode()


def _record_json(record: TuningRecord):
    """`record.as_json()`, also for traces holding an IndexMap (a layout rewrite of a weight).

    TVM's Python `as_json` rejects IndexMap; its C++ JSONDatabase writes one as the string of
    `tvm.ir.save_json`, which `TuningRecord.from_json` reads back, so the same is written here.
    """
    from tvm.s_tir.meta_schedule.database.database import _ffi_api as database_api

    def plain(value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, tvm.tirx.IndexMap):
            return tvm.ir.save_json(value)
        if isinstance(value, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return value.value
        if isinstance(value, tvm_ffi.Array):
            return [plain(item) for item in value]
        if isinstance(value, tvm_ffi.Map):
            return {plain(key): plain(item) for key, item in value.items()}
        raise TypeError(f"cannot write {type(value).__name__} into the tuning log")

    return plain(database_api.TuningRecordAsJSON(record))


def _record_key(record: TuningRecord) -> str:
    """A record's schedule and times as one string: equal for the same line read twice."""
    trace, run_secs = _record_json(record)[:2]
    return json.dumps([trace, run_secs])


def _split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without newline) and the unterminated tail, if any."""
    *lines, tail = data.split(b"\n")
    return lines, tail


class _Table:
    """The parsed contents of one log directory: workloads by line number and their records.

    Queries are answered here rather than by a MetaSchedule MemoryDatabase, whose `GetTopK`
    matches workloads by object identity and so misses records loaded from the files.
    """

    def __init__(self) -> None:
        self.workload_lines = 0  # line count of the workload file
        self.workload_bytes = 0  # bytes of each file consumed so far
        self.record_bytes = 0
        self.file_ids: tuple = ()
        self.workloads: dict[int, Workload] = {}  # line number -> workload
        self.canonical: dict[int, int] = {}  # line number -> first line of an equal workload
        self.by_hash: dict[int, list[int]] = {}  # structural hash -> canonical line numbers
        self.records: dict[int, list[_Run]] = {}  # canonical line -> runs, in file order
        self.record_lines = 0  # records added so far: the next one's line in the record file
        self.refused_workloads: set[int] = set()  # workload lines the policy refused
        self.unappliable: list[_Run] = []  # runs whose trace was found not to apply

    def find(self, mod: tvm.IRModule) -> int | None:
        """Canonical line number of the workload structurally equal to `mod`."""
        for line in self.by_hash.get(tvm_ffi.structural_hash(mod), []):
            if tvm_ffi.structural_equal(self.workloads[line].mod, mod):
                return line
        return None

    def add_workload(self, line: int, workload: Workload) -> None:
        found = self.find(workload.mod)
        if found is None:
            self.by_hash.setdefault(tvm_ffi.structural_hash(workload.mod), []).append(line)
            found = line
        self.workloads[line] = workload
        self.canonical[line] = found

    def add_record(self, line: int, record_json: list) -> None:
        runs = self.records.setdefault(self.canonical[line], [])
        runs.append(_Run(record_json, self.workloads[line], self.record_lines))
        self.record_lines += 1

    def runs(self, mod: tvm.IRModule) -> list[_Run]:
        line = self.find(mod)
        return [] if line is None else self.records.get(line, [])

    def drop_records(self, file_lines: set[int]) -> None:
        """Forget the records at these lines; later lines move up as in the rewritten file."""
        def moved(line: int) -> int:
            return line - sum(gone < line for gone in file_lines)

        for canonical, runs in self.records.items():
            self.records[canonical] = [run.moved_to(moved(run.file_line))
                                       for run in runs if run.file_line not in file_lines]
        self.record_lines -= len(file_lines)

    def read(self, run: _Run) -> TuningRecord | None:
        """The run's record, its trace applied to its workload; an unappliable run is noted for
        `TuningLog` to set aside."""
        known = run.problem is not None
        record = run.readable_record()
        if record is None and not known:
            self.unappliable.append(run)
        return record

    def best_applied(self, runs: list[_Run]) -> float:
        """The best time among `runs` whose trace applies (math.inf if none does): a record
        is costed only once it has been shown to schedule its kernel."""
        for run in sorted((run for run in runs if math.isfinite(run.seconds)),
                          key=lambda run: run.seconds):
            if self.read(run) is not None:
                return run.seconds
        return math.inf

    def top_k(self, mod: tvm.IRModule, k: int, keep=lambda record: True) -> list[TuningRecord]:
        """The `k` fastest readable records that `keep` accepts (only those are read)."""
        best = []
        for run in sorted((run for run in self.runs(mod) if math.isfinite(run.seconds)),
                          key=lambda run: run.seconds):
            if len(best) == k:
                break
            record = self.read(run)
            if record is not None and keep(record):
                best.append(record)
        return best

    def size(self) -> int:
        return sum(len(runs) for runs in self.records.values())


# Policy verdicts by a digest of the checked bytes: a compile opens its log several times, and a
# merge reads the same records twice (source, destination); each line is judged once a process.
_VERDICTS: dict[bytes, str | None] = {}


def _judged(data: bytes, check, value) -> None:
    """Run `check(value)` unless these exact bytes were judged before; `Refused` either way."""
    digest = hashlib.blake2b(data, digest_size=16).digest()
    if digest not in _VERDICTS:
        if len(_VERDICTS) > 200_000:
            _VERDICTS.clear()
        try:
            check(value)
            _VERDICTS[digest] = None
        except Refused as err:
            _VERDICTS[digest] = str(err)
    if _VERDICTS[digest] is not None:
        raise Refused(_VERDICTS[digest])


def _parse_workload(line: bytes) -> Workload:
    """The workload of a line; `Refused` when the policy does not allow its TIR."""
    value = json.loads(line)
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise ValueError("not a [hash, module] pair")
    _judged(line, check_workload, value)
    return Workload.from_json(value)


def _parse_record(line: bytes, table: _Table) -> tuple[int, list]:
    """(workload line, the record's JSON), its shape checked; the trace is read when used."""
    value = json.loads(line)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)):
        raise ValueError("not a [workload index, record] pair")
    if value[0] in table.refused_workloads:
        raise Refused(f"its workload (line {value[0] + 1}) was refused")
    if value[0] not in table.workloads:
        raise ValueError(f"workload index {value[0]} is missing or corrupt")
    _check_record_shape(value[1])
    # judged by the record's own bytes, whatever its workload index: as commit_records_json does
    _judged(line[line.index(b",") + 1:line.rindex(b"]")], _check_record_policy, value[1])
    return value[0], value[1]


def _check_record_value(record) -> None:
    """`ValueError` for a malformed record, `Refused` for one the policy does not allow."""
    _check_record_shape(record)
    _check_record_policy(record)


def _check_record_policy(record) -> None:
    check_record(record)
    check_times(record[1])


def _check_record_shape(record) -> None:
    if not (isinstance(record, list) and len(record) == 4):
        raise ValueError("not a [trace, run_secs, target, args_info] record")
    trace, run_secs = record[:2]
    if not (isinstance(trace, list) and len(trace) == 2 and all(isinstance(t, list) for t in trace)):
        raise ValueError("the trace is not an [instructions, decisions] pair")
    if run_secs is not None and not (isinstance(run_secs, list) and all(
            isinstance(t, (int, float)) and not isinstance(t, bool) for t in run_secs)):
        raise ValueError("run_secs is not a list of numbers")


def record_refusal(record) -> str | None:
    """Why a log would refuse this record JSON, or None; `ValueError` if it is malformed."""
    try:
        _check_record_value(record)
    except Refused as err:
        return str(err)
    return None


def check_times(run_secs) -> None:
    """Refuse samples no measurement yields: not finite, not positive, or a time below
    `IMPLAUSIBLE_SECONDS` (a record that would make its kernel look free)."""
    values = [float(t) for t in run_secs or []]
    if not all(math.isfinite(t) and t > 0 for t in values):
        raise Refused("its run times are not all positive and finite")
    if values and record_seconds(values) < IMPLAUSIBLE_SECONDS:
        raise Refused(f"its time {record_seconds(values):.3g} s is below any kernel's "
                      f"({IMPLAUSIBLE_SECONDS:g} s)")


class TuningLog:
    """The tuning log of one target: lookups by kernel module and a MetaSchedule `database`."""

    def __init__(self, root_dir: str | os.PathLike, target="llvm", *,
                 tag: str | None = None) -> None:
        """The log of `target` under `root_dir`, in `root_dir/<target tag>` (or `root_dir/tag`
        when given: a directory of another tag, as `merge_log_directory` opens)."""
        self.target = parse_target(target)
        self.directory = inside_root(os.fspath(root_dir), tag or target_tag(self.target))
        self.writable = self._make_directory()
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        # Trials asked per workload line: the attempts file as far as parsed (it is only ever
        # appended to), plus what a read-only log could not write, for this process.
        self._attempts: dict[int, int] = {}
        self._attempts_parsed = (0, 0)  # (bytes, lines) of the file read so far
        self._table = _Table()
        self.pending_fault: EnvironmentFault | None = None
        with self._locked():
            self._load_all()
        self.database = _LogDatabase(self)
        self._warn_if_timed_warm()

    # ---- public lookups -------------------------------------------------------------------
    def has_record(self, kernel_mod: tvm.IRModule) -> bool:
        """Whether any record (even a failed one) exists: such a kernel needs no more work."""
        return self.record_count(kernel_mod) > 0

    def record_count(self, kernel_mod: tvm.IRModule) -> int:
        self.refresh()
        return len(self._table.runs(kernel_mod))

    def schedule_count(self, kernel_mod: tvm.IRModule) -> int:
        """Distinct schedules among the kernel's records: two compiles sharing the log may
        both measure its default schedule, which is still one schedule, not a tuning trial."""
        self.refresh()
        runs = self._table.runs(kernel_mod)
        return len({run.schedule for run in runs})

    def best_seconds(self, kernel_mod: tvm.IRModule) -> float | None:
        """Best time of a record whose trace applies; None without records, math.inf when
        every record failed or none applies."""
        self.refresh()
        runs = self._table.runs(kernel_mod)
        if not runs:
            return None
        best = self._table.best_applied(runs)
        self._settle()
        return best

    def default_seconds(self, kernel_mod: tvm.IRModule) -> float | None:
        """Time of the kernel's first record: its default-schedule measurement.

        The profiler measures every kernel's default schedule before any tuning, so the first
        successful record never changes once written; budgets split by it stay the same on every
        re-run.
        """
        self.refresh()
        runs = self._table.runs(kernel_mod)
        if not runs:
            return None
        # failures before it (a retried kernel) are not its default time, nor unusable records
        seconds = next((run.seconds for run in runs
                        if math.isfinite(run.seconds) and self._table.read(run) is not None),
                       math.inf)
        self._settle()
        return seconds

    def best_record(self, kernel_mod: tvm.IRModule) -> TuningRecord | None:
        """The fastest successful record (its trace rebuilds the tuned schedule)."""
        self.refresh()
        best = self._table.top_k(kernel_mod, 1)
        self._settle()
        return best[0] if best else None

    def ranked_records(self, kernel_mod: tvm.IRModule, since: int = 0) -> list[TuningRecord]:
        """Successful records from the `since`-th of the kernel's records on (in the order they
        were logged) that are faster than every earlier one, fastest first: the records a
        build would use before any of the earlier ones."""
        self.refresh()
        runs = self._table.runs(kernel_mod)
        earlier = min((run.seconds for run in runs[:since]), default=math.inf)
        later = [run for run in runs[since:] if run.seconds < earlier]
        records = (self._table.read(run) for run in sorted(later, key=lambda run: run.seconds))
        ranked = [record for record in records if record is not None]
        self._settle()
        return ranked

    def set_aside(self, kernel_mod: tvm.IRModule, records: Sequence[TuningRecord],
                  reasons: Sequence[str] | None = None) -> None:
        """Take `records` (found wrong, or implausible) out of the log, so no build or plan uses
        them again.

        Their lines move verbatim to `<record file>.rejected`, with `reasons` (one each) in
        `.rejected.reasons`; nothing is destroyed. The record file is rewritten under the lock
        (other processes see a new file and reload it). In a read-only log they are only
        dropped from this process's view.
        """
        if not records:
            return
        reasons = list(reasons or ["set aside by a check that gave no reason"] * len(records))
        # by content: the table may have been reloaded (new objects) since they were read
        why = {_record_key(record): reason for record, reason in zip(records, reasons)}
        with self._locked():
            self._sync()
            lines = {run.file_line: why[_record_key(record)]
                     for run in self._table.runs(kernel_mod)
                     if (record := run.readable_record()) is not None
                     and _record_key(record) in why}
            self._move_aside(lines)

    def has_workload(self, kernel_mod: tvm.IRModule) -> bool:
        self.refresh()
        return self._table.find(kernel_mod) is not None

    def _settle(self) -> None:
        """Set aside the records whose traces were just found not to apply, so no later
        compile tries (and warns about) them again."""
        runs, self._table.unappliable = self._table.unappliable, []
        if not runs:
            return
        with self._locked():
            self._sync()
            lines = {}
            for found in runs:  # by workload and content: the table may have been reloaded
                lines.update({run.file_line: found.problem
                              for run in self._table.runs(found.workload.mod)
                              if run.key == found.key})
            self._move_aside(lines)

    def _move_aside(self, lines: dict[int, str]) -> None:
        """Move record lines (file line -> reason) to `.rejected`; call under the lock."""
        if not lines:  # another process set them aside first
            return
        for line, reason in sorted(lines.items()):  # whoever found them has warned
            logger.debug("tuning log %s: record line %d set aside: %s", self.directory,
                         line + 1, reason)
        if self.writable:
            file_lines = _split_lines(self._read(RECORD_FILE))[0]
            assert len(file_lines) == self._table.record_lines, "record file out of step"
            self._keep_aside(RECORD_FILE, [file_lines[n] for n in sorted(lines)],
                             [lines[n] for n in sorted(lines)])
            self._replace(RECORD_FILE, [line for n, line in enumerate(file_lines)
                                        if n not in lines])
        self._table.drop_records(set(lines))
        if self.writable:  # what was just written, without parsing it all again
            self._table.record_bytes = len(self._read(RECORD_FILE))
            self._table.file_ids = self._file_ids()

    def kernels(self) -> list[LoggedKernel]:
        """Every workload with at least one record, in file order, costed by its best record
        that applies (one trace replayed per workload, more only where the best does not)."""
        self.refresh()
        table = self._table
        best = {line: table.best_applied(runs) for line, runs in table.records.items() if runs}
        self._settle()
        records = self._table.records
        return [LoggedKernel(table.workloads[line].mod, seconds, len(records.get(line, [])))
                for line, seconds in sorted(best.items())]

    def tuning_attempts(self, kernel_mod: tvm.IRModule) -> int:
        """Trials MetaSchedule has been asked for on this kernel, over all tuning rounds."""
        self.refresh()
        line = self._table.find(kernel_mod)
        if line is None:
            return 0
        with self._locked():
            self._sync_attempts()
            return self._attempts.get(line, 0)

    def add_tuning_attempts(self, kernel_mod: tvm.IRModule, trials: int) -> None:
        with self._locked():
            self._sync()
            line = self._table.find(kernel_mod)
            if line is None:
                self._commit_workload(kernel_mod)
                line = self._table.find(kernel_mod)
            if self.writable:
                self._append(ATTEMPTS_FILE, _dump_line([line, int(trials)]))
            else:
                self._attempts[line] = self._attempts.get(line, 0) + int(trials)

    def _sync_attempts(self) -> None:
        """Add the whole lines appended to the attempts file since the last look (each corrupt
        line is warned about once, when first read)."""
        offset, number = self._attempts_parsed
        new = self._read(ATTEMPTS_FILE, offset)
        whole = new[: new.rfind(b"\n") + 1]  # a line still being written waits for next time
        for line in whole.splitlines():
            number += 1
            try:
                workload, trials = json.loads(line)
                self._attempts[int(workload)] = self._attempts.get(int(workload), 0) + int(trials)
            except (ValueError, TypeError):
                logger.warning("tuning log %s: %s line %d is corrupt; ignored", self.directory,
                               ATTEMPTS_FILE, number)
        self._attempts_parsed = (offset + len(whole), number)

    def commit_run(self, kernel_mod: tvm.IRModule, run_seconds: Sequence[float] | None,
                   trace=None) -> None:
        """Record one measurement of `kernel_mod` (default schedule when `trace` is None).

        `run_seconds=None` records a failure the way MetaSchedule does, so a kernel that cannot
        build is not retried on every compile (the profiler retries it a bounded number of times).
        """
        if trace is None:
            trace = default_trace(kernel_mod)
        workload = self._commit_workload(kernel_mod)  # directly: a fault keeps its type
        secs = list(run_seconds) if run_seconds else [FAILED_RUN_SECONDS]
        args = ms.arg_info.ArgInfo.from_prim_func(kernel_mod["main"])
        self._commit_record(TuningRecord(trace, workload, secs, self.target, args))

    def warm_timed_records(self) -> int:
        """CPU records timed before every timed call had its own cache flush (one sample of
        three back-to-back calls, two of them on warm caches): they read faster than a new
        measurement of the same kernel would."""
        cpu = self.target.kind.name == "llvm"
        return sum(_timed_warm(cpu, run.seconds, run.samples)
                   for runs in self._table.records.values() for run in runs)

    def _warn_if_timed_warm(self) -> None:
        """Once per directory and process: a compile opens its log several times."""
        if self.directory in _WARNED_TIMED_WARM:
            return
        count = self.warm_timed_records()
        if count:
            _WARNED_TIMED_WARM.add(self.directory)
            logger.warning("tuning log %s: %d of %d records were timed by an older korch_tvm "
                           "with warm caches after the first call; they look faster than new "
                           "measurements, so plans and tuning favour them. Start this log "
                           "afresh (move the directory away) to compare like with like.",
                           self.directory, count, self._table.size())

    def refresh(self) -> None:
        """Catch up with lines other processes appended since the last look.

        A write that failed inside MetaSchedule (which turns every error into a RuntimeError)
        is raised here as what it was, at the next lookup."""
        fault, self.pending_fault = self.pending_fault, None
        if fault is not None:
            raise fault
        with self._locked():
            self._sync()

    # ---- files ----------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        """A file of the log, refused if it resolves outside the directory (a symbolic link
        planted in a shared log must not make us write elsewhere)."""
        return inside_root(self.directory, name)

    def _make_directory(self) -> bool:
        for name in ("", WORKLOAD_FILE, RECORD_FILE):  # what is not a file cannot be a log
            path = self._path(name) if name else self.directory
            if os.path.exists(path) and os.path.isdir(path) != (not name):
                kind = "a directory" if name else "not a directory"
                raise KorchError(f"tuning log {path} is {kind}; move it away to start afresh")
        try:
            os.makedirs(self.directory, exist_ok=True)
            for name in (WORKLOAD_FILE, RECORD_FILE, LOCK_FILE):
                with open(self._path(name), "ab"):
                    pass
            return True
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise _fault("cannot create the tuning log", err.filename or self.directory,
                             err) from None
            logger.warning("tuning log %s is read-only (%s); new records stay in memory and are "
                           "lost at exit", self.directory, err.strerror)
            return False

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive lock across processes and threads, re-entrant within this object.

        (`flock` on a second descriptor of the same file would block this very process.)
        A read-only log has no writers to exclude.
        """
        with self._thread_lock:
            if not self.writable or self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            with open(self._path(LOCK_FILE), "ab") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                    fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _read(self, name: str, offset: int = 0) -> bytes:
        try:
            with open(self._path(name), "rb") as file:
                file.seek(offset)
                return file.read()
        except FileNotFoundError:
            return b""
        except OSError as err:  # unreadable, or a directory in its place
            raise _fault("cannot read the tuning log", self._path(name), err) from None

    def _file_ids(self) -> tuple:
        ids = []
        for name in (WORKLOAD_FILE, RECORD_FILE):
            try:
                stat = os.stat(self._path(name))
                ids.append((stat.st_ino, stat.st_dev))
            except FileNotFoundError:
                ids.append(None)
        return tuple(ids)

    def _set_aside(self, name: str, bad_lines: list[bytes], reasons: list[str]) -> None:
        """Keep bad lines verbatim in `<file>.corrupt` so nothing the user had is destroyed."""
        for line, reason in zip(bad_lines, reasons):
            logger.warning("tuning log %s: skipped a corrupt line (%s)", self._path(name), reason)
        if self.writable and bad_lines:
            self._write_whole(name + ".corrupt", b"".join(line + b"\n" for line in bad_lines))

    def _keep_aside(self, name: str, lines: list[bytes], reasons: list[str]) -> None:
        """Append refused or wrong lines verbatim to `<file>.rejected` and why, one line each,
        to `<file>.rejected.reasons` (line n of one matches line n of the other)."""
        if not (self.writable and lines):
            return
        self._write_whole(name + REJECTED_SUFFIX, b"".join(line + b"\n" for line in lines))
        self._write_whole(name + REASONS_SUFFIX, b"".join(
            " ".join(reason.split()).encode() + b"\n" for reason in reasons))

    def _replace(self, name: str, lines: list[bytes]) -> None:
        temporary = self._path(f".{name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb") as file:
                file.write(b"".join(line + b"\n" for line in lines))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self._path(name))
        except OSError as err:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise _fault("cannot rewrite the tuning log", self._path(name), err) from None

    def _load_all(self) -> None:
        """Parse both files from scratch; set bad lines aside and rewrite the files clean."""
        table = _Table()
        workload_lines, workload_tail = _split_lines(self._read(WORKLOAD_FILE))
        record_lines, record_tail = _split_lines(self._read(RECORD_FILE))
        bad_workloads, bad_workload_reasons, good_workload_lines = [], [], {}
        workload_lines_all = workload_lines + ([workload_tail] if workload_tail else [])
        refusals: dict[int, str] = {}
        for line_no, line in enumerate(workload_lines_all):
            try:
                table.add_workload(line_no, _parse_workload(line))
                good_workload_lines[line_no] = line
            except Refused as err:  # kept in place of a filler until the rewrite below
                table.refused_workloads.add(line_no)
                refusals[line_no] = f"workload line {line_no + 1}: {err}"
            except Exception as err:  # noqa: BLE001 - any parse failure means a bad line
                bad_workloads.append((line_no, line))
                bad_workload_reasons.append(f"workload line {line_no + 1}: {_short(err)}")
        bad_records, bad_record_reasons, good_records = [], [], []
        refused: dict[str, list] = {WORKLOAD_FILE: [], RECORD_FILE: []}  # (line, reason) each
        for line_no, line in enumerate(record_lines + ([record_tail] if record_tail else [])):
            try:
                table.add_record(*_parse_record(line, table))
                good_records.append(line)
            except Refused as err:
                refused[RECORD_FILE].append((line, f"record line {line_no + 1}: {err}"))
            except Exception as err:  # noqa: BLE001
                bad_records.append(line)
                bad_record_reasons.append(f"record line {line_no + 1}: {_short(err)}")
        for line_no in sorted(table.refused_workloads):
            refused[WORKLOAD_FILE].append((workload_lines_all[line_no], refusals[line_no]))
        # A complete last line without its newline would swallow the next append: rewrite too.
        needs_rewrite = bool(bad_workloads or bad_records or workload_tail or record_tail
                             or refused[RECORD_FILE] or refused[WORKLOAD_FILE])
        for name, entries in refused.items():
            for _, reason in entries:
                logger.warning("tuning log %s: set aside %s, refused: %s", self.directory,
                               reason.split(":")[0], reason.split(": ", 1)[1])
        if needs_rewrite and self.writable:
            self._set_aside(RECORD_FILE, bad_records, bad_record_reasons)
            self._set_aside(WORKLOAD_FILE, [line for _, line in bad_workloads],
                            bad_workload_reasons)
            for name, entries in refused.items():
                self._keep_aside(name, [line for line, _ in entries],
                                 [reason for _, reason in entries])
            # Records first: a crash between the two rewrites leaves no record pointing at a
            # workload line that is about to change.
            self._replace(RECORD_FILE, good_records)
            self._replace(WORKLOAD_FILE, _renumbered(good_workload_lines))
            return self._load_all()
        if needs_rewrite:
            for reason in bad_workload_reasons + bad_record_reasons:
                logger.warning("tuning log %s: skipped a corrupt line (%s)", self.directory, reason)
        table.workload_lines = len(workload_lines) + (1 if workload_tail else 0)
        table.workload_bytes = len(self._read(WORKLOAD_FILE))
        table.record_bytes = len(self._read(RECORD_FILE))
        table.file_ids = self._file_ids()
        self._table = table

    def _sync(self) -> None:
        """Parse lines appended by others; anything unusual triggers a full, cleaning reload."""
        table = self._table
        if self._file_ids() != table.file_ids:
            return self._load_all()
        new_workloads = self._read(WORKLOAD_FILE, table.workload_bytes)
        new_records = self._read(RECORD_FILE, table.record_bytes)
        if (new_workloads and not new_workloads.endswith(b"\n")) or (
            new_records and not new_records.endswith(b"\n")
        ):
            return self._load_all()  # a writer died mid-line
        try:
            for line in _split_lines(new_workloads)[0]:
                table.add_workload(table.workload_lines, _parse_workload(line))
                table.workload_lines += 1
                table.workload_bytes += len(line) + 1
            for line in _split_lines(new_records)[0]:
                table.add_record(*_parse_record(line, table))
                table.record_bytes += len(line) + 1
        except Exception:  # noqa: BLE001 - a bad appended line: clean everything
            self._load_all()

    def _append(self, name: str, line: bytes) -> None:
        if self.writable:
            self._write_whole(name, line)

    def _write_whole(self, name: str, data: bytes) -> None:
        """Append `data` whole or not at all: on a short write or an error (no space, say) the
        file is cut back to its old size, and the fault is raised naming the file."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise _fault("cannot write the tuning log", path, err) from None
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, f"short write, {written} of {len(data)} bytes")
                os.fsync(fd)
            except OSError as err:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise _fault("cannot write the tuning log", path, err) from None
        finally:
            os.close(fd)

    # ---- the MetaSchedule database's writes ---------------------------------------------------
    def _commit_workload(self, mod: tvm.IRModule) -> Workload:
        with self._locked():
            self._sync()
            self._commit_workloads([mod])
            return self._table.workloads[self._table.find(mod)]

    def _commit_workloads(self, mods: Sequence[tvm.IRModule]) -> None:
        """Add the modules the log lacks, in one write; call under the lock, after `_sync`."""
        table = self._table
        new: list[tuple[tvm.IRModule, Workload]] = []
        for mod in mods:
            if table.find(mod) is None and not any(
                    tvm_ffi.structural_equal(mod, other) for other, _ in new):
                new.append((mod, Workload(mod)))
        if not new:
            return
        lines = [_dump_line(workload.as_json()) for _, workload in new]
        self._append(WORKLOAD_FILE, b"".join(lines))
        for (_, workload), data in zip(new, lines):
            table.add_workload(table.workload_lines, workload)
            table.workload_lines += 1
            table.workload_bytes += len(data) if self.writable else 0

    def _commit_record(self, record: TuningRecord) -> None:
        try:  # what this log would refuse to read back is not written
            plain = json.loads(_dump_line(_record_json(record)))  # TVM strings -> str
            self.commit_record_json(record.workload.mod, plain)
        except Refused as err:
            logger.warning("tuning log %s: a new record is not kept: %s", self.directory, err)

    def commit_record_json(self, kernel_mod: tvm.IRModule, record_json: list) -> None:
        """Append a record given as its JSON ([trace, run_secs, target, args_info], as in a
        record file) without replaying it; `Refused` if the policy does not allow it."""
        self.commit_records_json([(kernel_mod, record_json)])

    def commit_records_json(self, records: Sequence[tuple[tvm.IRModule, list]]) -> None:
        """`commit_record_json` for many (kernel, record JSON) pairs: their new workloads in one
        write, then the records in another (each whole or not at all); `Refused`, and nothing
        written, if the policy refuses any record. The JSON must be plain lists and dicts."""
        dumped = [_dump_line(record)[:-1] for _, record in records]
        for (_, record), data in zip(records, dumped):
            _check_record_shape(record)
            _judged(data, _check_record_policy, record)
        if not records:
            return
        with self._locked():
            self._sync()
            self._commit_workloads([mod for mod, _ in records])
            table = self._table
            lines = [table.find(mod) for mod, _ in records]
            data = b"".join(b"[%d,%s]\n" % (line, record) for line, record in zip(lines, dumped))
            self._append(RECORD_FILE, data)
            for line, (_, record) in zip(lines, records):
                table.add_record(line, record)
            table.record_bytes += len(data) if self.writable else 0

    def record_keys(self, kernel_mod: tvm.IRModule) -> set[str]:
        """The kernel's records as [trace, run_secs] text: what makes two records duplicates."""
        self.refresh()
        return {run.key for run in self._table.runs(kernel_mod)}


def default_trace(kernel_mod: tvm.IRModule):
    """A trace that leaves the kernel as written: one harmless `get_sblock("root")`.

    Stock MetaSchedule ignores records whose trace is empty, so an empty one would make the
    default-schedule measurement invisible to `JSONDatabase` and `MetaScheduleApplyDatabase`.
    """
    schedule = tvm.s_tir.Schedule(kernel_mod)
    try:
        schedule.get_sblock("root", func_name="main")
    except Exception:  # noqa: BLE001 - no root block: keep the (empty) trace
        pass
    return schedule.trace


def leaves_kernel_as_written(trace) -> bool:
    """Whether a trace only looks blocks up (`default_trace`): it schedules nothing."""
    return all(inst.kind.name == "GetSBlock" for inst in trace.insts)


def _renumbered(good_lines: dict[int, bytes]) -> list[bytes]:
    """Workload lines with every good line at its old number; trailing bad lines are dropped."""
    if not good_lines:
        return []
    filler = next(iter(good_lines.values()))  # a duplicate workload is harmless to readers
    return [good_lines.get(line_no, filler) for line_no in range(max(good_lines) + 1)]


def _fault(what: str, path: str, err: OSError) -> EnvironmentFault:
    """One line naming the file and the cause (errno's text)."""
    return EnvironmentFault(f"{what} {path}: {err.strerror or err}")


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]


@derived_object
class _LogDatabase(PyDatabase):
    """MetaSchedule's view of a TuningLog: writes go through the log's lock, reads to its table."""

    def __init__(self, log: TuningLog) -> None:
        super().__init__()
        self._log = log

    def has_workload(self, mod: tvm.IRModule) -> bool:
        return self._log._table.find(mod) is not None

    def commit_workload(self, mod: tvm.IRModule) -> Workload:
        with self._keeping_fault():
            return self._log._commit_workload(mod)

    def commit_tuning_record(self, record: TuningRecord) -> None:
        with self._keeping_fault():
            self._log._commit_record(record)

    @contextmanager
    def _keeping_fault(self) -> Iterator[None]:
        try:
            yield
        except EnvironmentFault as fault:
            self._log.pending_fault = fault
            raise

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        """The best records, leaving out those that run the kernel as written: a kernel with
        nothing better is then given the current default schedule by the build (a log from
        before korch_tvm scheduled untuned CPU kernels holds such records)."""
        return self._log._table.top_k(workload.mod, top_k,
                                      lambda record: not leaves_kernel_as_written(record.trace))

    def get_all_tuning_records(self) -> list[TuningRecord]:
        table = self._log._table
        records = (run.readable_record() for _, runs in sorted(table.records.items())
                   for run in runs)
        return [record for record in records if record is not None]

    def __len__(self) -> int:
        return self._log._table.size()


