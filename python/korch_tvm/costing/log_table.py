"""The in-memory index of one log directory: workloads by line number, and their records.

The files number workloads by line, and a record names its workload by that number, so the
index keeps both numberings (a record's own line too, for setting it aside). Records are kept
as their JSON and read into TVM objects only when a query needs them: reading one replays its
schedule trace, and a compile needs only the best few of a log's many records.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from ..kernels.keys import module_hash
from .log_lines import _short, record_seconds

logger = logging.getLogger("korch_tvm.tuning_log")  # the log's one voice, whichever part speaks


class _Run:
    """One record of a workload: its time (`record_seconds`), its line in the record file, and
    the record, read from its JSON only when asked for.

    Reading a record replays its schedule trace on the workload (milliseconds each): a log
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
        for line in self.by_hash.get(module_hash(mod), []):
            if tvm_ffi.structural_equal(self.workloads[line].mod, mod):
                return line
        return None

    def add_workload(self, line: int, workload: Workload) -> None:
        found = self.find(workload.mod)
        if found is None:
            self.by_hash.setdefault(module_hash(workload.mod), []).append(line)
            found = line
        self.workloads[line] = workload
        self.canonical[line] = found

    def add_record(self, line: int, record_json: list,
                   applied: TuningRecord | None = None) -> None:
        """`applied`: the record itself where its writer has just built its schedule (so its
        trace is known to apply and need not be replayed when read)."""
        run = _Run(record_json, self.workloads[line], self.record_lines)
        run._record = applied
        self.records.setdefault(self.canonical[line], []).append(run)
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
