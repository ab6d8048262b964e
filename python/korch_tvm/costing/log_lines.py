"""What a tuning-log line may hold: every line is checked here before TVM reads it.

A log may come from anyone (a shared directory, a download), so this is where korch_tvm trusts
or refuses it: a line's JSON shape is checked first, then `trace_policy` judges it (pure JSON,
before any TVM parser sees it), then a record's times must be ones a measurement can yield.
What korch_tvm writes passes the same checks, so a log never holds a line it would refuse to
read back. A record's time (`record_seconds`) is defined here too, since the checks use it.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics

import tvm
import tvm_ffi
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from ..support.memo import KeyedMemo
from .metaschedule_setup import SAMPLES
from .trace_policy import Refused, check_record, check_workload

# MetaSchedule records a failed build/run with this mean time (kMaxMeanTime in its C++ code).
FAILED_RUN_SECONDS = 1e10
# No kernel launch, even an empty one, returns faster: a record timed below it is not a timing.
IMPLAUSIBLE_SECONDS = 1e-8


def record_seconds(run_secs) -> float:
    """The time of a record whose samples are `run_secs` (seconds, as in a record line): their
    median; math.inf for a failed build or run (no samples, or MetaSchedule's failure time).

    Not the mean: one sample stalled by another process (a page fault, a descheduled thread)
    would set the cost. Not the minimum either: under frequency boost and warm caches it is
    biased low, below what a model's run sees. The median of the (three) samples ignores one
    outlier either way.
    """
    values = [float(s) for s in run_secs or []]
    if not values or min(values) >= FAILED_RUN_SECONDS:
        return math.inf
    return statistics.median(values)


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


class LineVerdicts:
    """The policy's verdict on every line judged so far, by a digest of the line's bytes.

    It may outlive a compile: judging every line of a 20 MB log again takes about a second a
    compile, and a process that compiles again (a notebook, a service, the tests) reads the
    same lines; `costing/session.py` passes one object to every compile's logs. A merge reads
    the same records twice (source, destination), so it passes one to both sides.
    """

    def __init__(self, kept: int = 200_000) -> None:
        self._verdicts: KeyedMemo[str | None] = KeyedMemo(kept)

    def judge(self, data: bytes, check, value) -> None:
        """Run `check(value)` unless these exact bytes were judged before; `Refused` either way."""
        digest = hashlib.blake2b(data, digest_size=16).digest()
        verdict = self._verdicts.get(digest, lambda: _verdict(check, value))
        if verdict is not None:
            raise Refused(verdict)

    def __len__(self) -> int:
        return len(self._verdicts)


def _verdict(check, value) -> str | None:
    try:
        check(value)
    except Refused as err:
        return str(err)
    return None


def _parse_workload(line: bytes, verdicts: LineVerdicts) -> Workload:
    """The workload of a line; `Refused` when the policy does not allow its TIR."""
    value = json.loads(line)
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise ValueError("not a [hash, module] pair")
    verdicts.judge(line, check_workload, value)
    return Workload.from_json(value)


def _parse_record(line: bytes, table, verdicts: LineVerdicts) -> tuple[int, list]:
    """(workload line, the record's JSON), its shape checked; the trace is read when used.

    `table` is the log's index so far (a `log_table._Table`): a record must name one of its
    workloads, and one it refused is refused with it. `verdicts` judges the policy's part.
    """
    value = json.loads(line)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)):
        raise ValueError("not a [workload index, record] pair")
    if value[0] in table.refused_workloads:
        raise Refused(f"its workload (line {value[0] + 1}) was refused")
    if value[0] not in table.workloads:
        raise ValueError(f"workload index {value[0]} is missing or corrupt")
    _check_record_shape(value[1])
    # judged by the record's own bytes, whatever its workload index: as commit_records_json does
    verdicts.judge(line[line.index(b",") + 1:line.rindex(b"]")], _check_record_policy, value[1])
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
    if not (isinstance(trace, list) and len(trace) == 2
            and all(isinstance(t, list) for t in trace)):
        raise ValueError("the trace is not an [instructions, decisions] pair")
    if run_secs is not None and not (isinstance(run_secs, list) and all(
            isinstance(t, (int, float)) and not isinstance(t, bool) for t in run_secs)):
        raise ValueError("run_secs is not a list of numbers")


def record_refusal(record) -> str | None:
    """Why a log would refuse `record` (a record's JSON: [trace, run_secs, target, args_info]),
    or None when it would keep it; `ValueError` if it is malformed."""
    try:
        _check_record_value(record)
    except Refused as err:
        return str(err)
    return None


def check_times(run_secs) -> None:
    """`Refused` when the samples `run_secs` (seconds) are ones no measurement yields: not
    finite, not positive, or a time below `IMPLAUSIBLE_SECONDS` (a record that would make its
    kernel look free)."""
    values = [float(t) for t in run_secs or []]
    if not all(math.isfinite(t) and t > 0 for t in values):
        raise Refused("its run times are not all positive and finite")
    if values and record_seconds(values) < IMPLAUSIBLE_SECONDS:
        raise Refused(f"its time {record_seconds(values):.3g} s is below any kernel's "
                      f"({IMPLAUSIBLE_SECONDS:g} s)")


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]
