"""The on-disk tuning log: one directory per target, in MetaSchedule's own JSON database format.

Layout: `<root>/<target_tag>/database_workload.json` and `database_tuning_record.json`, one JSON
value per line, exactly what `ms.database.JSONDatabase` reads and writes, so stock MetaSchedule
can use, merge and share the files. `TuningLog` is what the rest of korch_tvm asks: lookups by
kernel module, measurements to record, and a MetaSchedule `database` (`log_database`). What the
stock database does not do, and this does, each in its own module:

* **Concurrency** (`log_files`). A record line names its workload by *line number* in the
  workload file, so two processes appending with their own numbering would corrupt each other.
  Every write happens under an exclusive lock, after catching up with lines other processes
  appended, and is one append of whole lines, whole or not at all.
* **Corruption** (`log_reading`). A bad line is warned about, copied verbatim to
  `<file>.corrupt` and removed; every other line keeps its number.
* **Read-only directories.** Records already there are used; new ones are kept in memory and a
  warning says they will not be saved (a shared, committed log stays usable, never half-written).
* **Untrusted records** (`log_lines`). Every line is checked against `trace_policy` (pure
  JSON, before TVM reads it): a refused workload or record, or a record timed implausibly fast,
  is moved to `<file>.rejected`, and why to `<file>.rejected.reasons`, one line each.
* **Wrong records.** A record's trace is replayed only when the record is used (`log_table`);
  one that does not apply to its kernel, or one found to compute something other than its
  kernel (`costing/record_check.py`, then `set_aside`), is moved to `<file>.rejected` too, so
  neither korch_tvm nor stock MetaSchedule builds it again.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from ..backend.target import inside_root, parse_target, target_tag
from ..errors import EnvironmentFault
from .cache_state import tag_suffix
from .log_database import _LogDatabase, default_trace
from .log_files import ATTEMPTS_FILE, RECORD_FILE, WORKLOAD_FILE, LogDirectory, _split_lines
from .log_lines import (FAILED_RUN_SECONDS, LineVerdicts, _check_record_policy,
                        _check_record_shape, _dump_line, _record_json, _record_key, _timed_warm)
from .log_reading import load_table, sync_table
from .log_table import LoggedKernel
from .trace_policy import Refused

logger = logging.getLogger("korch_tvm.tuning_log")


class TuningLog:
    """The tuning log of one target: lookups by kernel module and a MetaSchedule `database`."""

    def __init__(self, root_dir: str | os.PathLike, target="llvm", *,
                 tag: str | None = None, verdicts: LineVerdicts | None = None,
                 cache_state: str = "cold") -> None:
        """The log of `target` under `root_dir`, in `root_dir/<target tag>` (with its suffix for
        records timed from `cache_state`: costing/cache_state.py), or `root_dir/tag` when
        given (a directory of another tag, as `merge_log_directory` opens). Every line is
        judged through `verdicts` (`log_lines.LineVerdicts`; None: the log's own), which
        may be shared with other logs of the process: what was judged once is not again."""
        self.target = parse_target(target)
        self.verdicts = LineVerdicts() if verdicts is None else verdicts
        self.directory = inside_root(os.fspath(root_dir),
                                     tag or target_tag(self.target) + tag_suffix(cache_state))
        self._files = LogDirectory(self.directory)
        self.writable = self._files.writable
        # Trials asked per workload line: the attempts file as far as parsed (it is only ever
        # appended to), plus what a read-only log could not write, for this process.
        self._attempts: dict[int, int] = {}
        self._attempts_parsed = (0, 0)  # (bytes, lines) of the file read so far
        self.pending_fault: EnvironmentFault | None = None
        with self._locked():
            self._table = load_table(self._files, self.verdicts)
        self._warn_if_timed_warm()

    @property
    def database(self) -> _LogDatabase:
        """MetaSchedule's view of this log, made on each use: it holds the log, and the log
        does not hold it. (A log holding its database would be a cycle through TVM's side,
        which Python's collector cannot see: every log, its table and its throw-away folder,
        would stay for the life of the process.)"""
        return _LogDatabase(self)

    # ---- public lookups -------------------------------------------------------------------
    def has_record(self, kernel_mod: tvm.IRModule) -> bool:
        """Whether `kernel_mod` has any record (even a failed one): it needs no more work."""
        return self.record_count(kernel_mod) > 0

    def record_count(self, kernel_mod: tvm.IRModule) -> int:
        """How many records `kernel_mod` has, failed ones and unread ones included."""
        self.refresh()
        return len(self._table.runs(kernel_mod))

    def schedule_count(self, kernel_mod: tvm.IRModule) -> int:
        """Distinct schedules among the records of `kernel_mod`: two compiles sharing the log may
        both measure its default schedule, which is still one schedule, not a tuning trial."""
        self.refresh()
        runs = self._table.runs(kernel_mod)
        return len({run.schedule for run in runs})

    def best_seconds(self, kernel_mod: tvm.IRModule) -> float | None:
        """Best time of a record of `kernel_mod` whose trace applies; None without records,
        math.inf when every record failed or none applies."""
        self.refresh()
        runs = self._table.runs(kernel_mod)
        if not runs:
            return None
        best = self._table.best_applied(runs)
        self._settle()
        return best

    def default_seconds(self, kernel_mod: tvm.IRModule) -> float | None:
        """Time of the first successful record of `kernel_mod`: its default-schedule measurement.

        The profiler measures every kernel's default schedule before any tuning, so the first
        successful record never changes once written; budgets split by it stay the same on every
        re-run.
        """
        return self.default_seconds_of([kernel_mod])[0]

    def default_seconds_of(self, kernel_mods: Sequence[tvm.IRModule]) -> list[float | None]:
        """`default_seconds` of each module, the log caught up with other writers once for
        all of them: a seed's calibration looks up every kernel of the log in two logs, once
        per layout or region a compile plans (SSDlite: 21,000 look-ups, about 8 s of catching up
        one by one)."""
        self.refresh()
        found = [self._first_good_seconds(kernel_mod) for kernel_mod in kernel_mods]
        self._settle()
        return found

    def _first_good_seconds(self, kernel_mod: tvm.IRModule) -> float | None:
        runs = self._table.runs(kernel_mod)
        if not runs:
            return None
        # failures before it (a retried kernel) are not its default time, nor unusable records
        return next((run.seconds for run in runs
                     if math.isfinite(run.seconds) and self._table.read(run) is not None),
                    math.inf)

    def best_record(self, kernel_mod: tvm.IRModule) -> TuningRecord | None:
        """The fastest successful record of `kernel_mod` (its trace rebuilds the tuned schedule)."""
        self.refresh()
        best = self._table.top_k(kernel_mod, 1)
        self._settle()
        return best[0] if best else None

    def ranked_records(self, kernel_mod: tvm.IRModule, since: int = 0) -> list[TuningRecord]:
        """Successful records from the `since`-th of the records of `kernel_mod` on (in the
        order they were logged) that are faster than every earlier one, fastest first: the
        records a build would use before any of the earlier ones."""
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
        """Take `records` of `kernel_mod` (found wrong, or implausible) out of the log, so no
        build or plan uses them again.

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
        """Whether the workload file holds `kernel_mod`, with records or without."""
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
            file_lines = _split_lines(self._files.read(RECORD_FILE))[0]
            assert len(file_lines) == self._table.record_lines, "record file out of step"
            self._files.keep_aside(RECORD_FILE, [file_lines[n] for n in sorted(lines)],
                                   [lines[n] for n in sorted(lines)])
            self._files.replace(RECORD_FILE, [line for n, line in enumerate(file_lines)
                                              if n not in lines])
        self._table.drop_records(set(lines))
        if self.writable:  # what was just written, without parsing it all again
            self._table.record_bytes = len(self._files.read(RECORD_FILE))
            self._table.file_ids = self._files.file_ids()

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
        """Trials MetaSchedule has been asked for on `kernel_mod`, over all tuning rounds."""
        self.refresh()
        line = self._table.find(kernel_mod)
        if line is None:
            return 0
        with self._locked():
            self._sync_attempts()
            return self._attempts.get(line, 0)

    def add_tuning_attempts(self, kernel_mod: tvm.IRModule, trials: int) -> None:
        """Note that a tuning round asked MetaSchedule for `trials` more on `kernel_mod` (its
        workload is added if the log lacks it); in memory only, for a read-only log."""
        with self._locked():
            self._sync()
            line = self._table.find(kernel_mod)
            if line is None:
                self._commit_workload(kernel_mod)
                line = self._table.find(kernel_mod)
            if self.writable:
                self._files.append(ATTEMPTS_FILE, _dump_line([line, int(trials)]))
            else:
                self._attempts[line] = self._attempts.get(line, 0) + int(trials)

    def _sync_attempts(self) -> None:
        """Add the whole lines appended to the attempts file since the last look (each corrupt
        line is warned about once, when first read)."""
        offset, number = self._attempts_parsed
        new = self._files.read(ATTEMPTS_FILE, offset)
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
        """Record one measurement of `kernel_mod`: `trace`'s schedule (the default schedule when
        `trace` is None) ran in `run_seconds` (seconds, one per sample).

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
        """Once per log opened: a compile opens its log once (its costing session's)."""
        count = self.warm_timed_records()
        if count:
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
        self._files.append(WORKLOAD_FILE, b"".join(lines))
        for (_, workload), data in zip(new, lines):
            table.add_workload(table.workload_lines, workload)
            table.workload_lines += 1
            table.workload_bytes += len(data) if self.writable else 0

    def _commit_record(self, record: TuningRecord) -> None:
        try:  # what this log would refuse to read back is not written
            plain = json.loads(_dump_line(_record_json(record)))  # TVM strings -> str
            self.commit_records_json([(record.workload.mod, plain)], applied=[record])
        except Refused as err:
            logger.warning("tuning log %s: a new record is not kept: %s", self.directory, err)

    def commit_record_json(self, kernel_mod: tvm.IRModule, record_json: list) -> None:
        """Append a record of `kernel_mod` given as its JSON, `record_json` ([trace, run_secs,
        target, args_info], as in a record file) without replaying it; `Refused` if the policy
        does not allow it."""
        self.commit_records_json([(kernel_mod, record_json)])

    def commit_records_json(self, records: Sequence[tuple[tvm.IRModule, list]],
                            applied: Sequence[TuningRecord] | None = None) -> None:
        """`commit_record_json` for many (kernel, record JSON) pairs, `records`: their new
        workloads in one write, then the records in another (each whole or not at all);
        `Refused`, and nothing written, if the policy refuses any record. The JSON must be
        plain lists and dicts. `applied`: the records as objects, where this process has
        built their schedules (a default measurement, a tuning trial): reading them back
        then replays no trace (12 ms each, 8.6 s of a cold DenseNet-121 compile)."""
        dumped = [_dump_line(record)[:-1] for _, record in records]
        for (_, record), data in zip(records, dumped):
            _check_record_shape(record)
            self.verdicts.judge(data, _check_record_policy, record)
        if not records:
            return
        with self._locked():
            self._sync()
            self._commit_workloads([mod for mod, _ in records])
            table = self._table
            lines = [table.find(mod) for mod, _ in records]
            data = b"".join(b"[%d,%s]\n" % (line, record) for line, record in zip(lines, dumped))
            self._files.append(RECORD_FILE, data)
            for line, (_, record), made in zip(lines, records, applied or [None] * len(records)):
                table.add_record(line, record, made)
            table.record_bytes += len(data) if self.writable else 0

    def record_keys(self, kernel_mod: tvm.IRModule) -> set[str]:
        """The records of `kernel_mod` as [trace, run_secs] text: what makes two duplicates."""
        self.refresh()
        return {run.key for run in self._table.runs(kernel_mod)}

    # ---- the directory ----------------------------------------------------------------------
    def _locked(self):
        """The directory's exclusive lock (`LogDirectory.locked`): hold it across a read and
        the writes that depend on it."""
        return self._files.locked()

    def _sync(self) -> None:
        """Catch up with lines other processes appended (a full, cleaning reload if need be)."""
        self._table = sync_table(self._files, self._table, self.verdicts)
