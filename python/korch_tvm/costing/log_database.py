"""MetaSchedule's view of a `TuningLog`: the `PyDatabase` that tuning writes to and builds read.

MetaSchedule's tuners and `MetaScheduleApplyDatabase` speak only to a database object, so this
adapter hands their writes to the log (under its lock, policy-checked) and answers their reads
from the log's index. Also here: the trace korch_tvm logs for a kernel's default schedule, and
how such a record is recognised, since the database's answers leave those records out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload

from ..errors import EnvironmentFault


def default_trace(kernel_mod: tvm.IRModule):
    """A trace that leaves `kernel_mod` as written: one harmless `get_sblock("root")`.

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
    """Whether `trace` only looks blocks up (as `default_trace` does): it schedules nothing."""
    return all(inst.kind.name == "GetSBlock" for inst in trace.insts)


@derived_object
class _LogDatabase(PyDatabase):
    """MetaSchedule's view of a TuningLog: writes go through the log's lock, reads to its table."""

    def __init__(self, log) -> None:  # log: the TuningLog (not imported: it imports this)
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


