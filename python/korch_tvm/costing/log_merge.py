"""Merge one tuning-log directory into another without losing or duplicating records.

Logs travel: a user imports the shipped or a colleague's records, a CI job seeds a fresh cache.
The source is only read (never cleaned or locked: it may be a read-only, shared copy); every
line is checked as the destination's own reader would check it (`trace_policy`, times), so a
refused or corrupt line is counted and left behind. A workload is matched by structural
equality, a record by its [trace, run_secs]: merging the same log twice adds nothing.
Records are appended through the destination's `TuningLog`, under its lock, so a compile may
run meanwhile. Trials asked of MetaSchedule (`tuning_attempts.json`) are merged as the larger
of the two counts per workload, which is also idempotent.
"""

from __future__ import annotations

import json
import logging
import os

from ..errors import KorchError
from .trace_policy import Refused
from .log_files import ATTEMPTS_FILE, RECORD_FILE, WORKLOAD_FILE, _split_lines
from .log_lines import LineVerdicts, _parse_record, _parse_workload
from .log_table import _Table
from .tuning_log import TuningLog

logger = logging.getLogger("korch_tvm.log_merge")


def merge_log_directory(source: str, destination: str,
                        verdicts: LineVerdicts | None = None) -> dict:
    """Merge the tag directory `source` (`<root>/<tag>`) into `destination` (created if
    missing), both sides judging lines through `verdicts` (None: one for this merge).
    Returns counts: workloads_added, records_added, duplicates, refused, corrupt."""
    source, destination = os.fspath(source), os.fspath(destination)
    if not os.path.isfile(os.path.join(source, WORKLOAD_FILE)):
        raise KorchError(f"{source} is not a tuning-log directory (it has no {WORKLOAD_FILE})")
    if os.path.realpath(source) == os.path.realpath(destination):
        raise KorchError(f"cannot merge the tuning log {source} into itself")
    verdicts = LineVerdicts() if verdicts is None else verdicts
    table, counts = _read_source(source, verdicts)
    log = TuningLog(os.path.dirname(os.path.abspath(destination)),
                    target_of_tag(os.path.basename(os.path.abspath(destination))),
                    tag=os.path.basename(os.path.abspath(destination)), verdicts=verdicts)
    counts.update(workloads_added=0, records_added=0, duplicates=0)
    with log._locked():
        new = []
        for line, runs in sorted(table.records.items()):
            mod = table.workloads[line].mod
            known = log.record_keys(mod) if log.has_workload(mod) else set()
            counts["workloads_added"] += not known and not log.has_workload(mod)
            for run in runs:
                if run.key in known:
                    counts["duplicates"] += 1
                    continue
                new.append((run.file_line, mod, run.json))
                known.add(run.key)
        # in the source's order; the new workloads in one write, the records in another
        log.commit_records_json([(mod, record) for _, mod, record in sorted(
            new, key=lambda item: item[0])])
        counts["records_added"] = len(new)
        _merge_attempts(source, table, log)
    logger.debug("merged %s into %s: %s", source, destination, counts)
    return counts


def _read_source(source: str, verdicts: LineVerdicts) -> tuple[_Table, dict]:
    """The source's workloads and allowed records, and how many lines were left behind."""
    counts = {"refused": 0, "corrupt": 0}
    table = _Table()
    for number, line in enumerate(_lines(source, WORKLOAD_FILE)):
        try:
            table.add_workload(number, _parse_workload(line, verdicts))
        except Refused:
            table.refused_workloads.add(number)
        except Exception:  # noqa: BLE001 - any parse failure is a corrupt line
            pass
    for line in _lines(source, RECORD_FILE):
        try:
            table.add_record(*_parse_record(line, table, verdicts))
        except Refused as err:
            counts["refused"] += 1
            logger.warning("tuning log %s: a record is not merged: %s", source, err)
        except Exception:  # noqa: BLE001
            counts["corrupt"] += 1
    return table, counts


def _merge_attempts(source: str, table: _Table, log: TuningLog) -> None:
    """Per workload, the destination asks for no fewer trials than the source did."""
    asked: dict[int, int] = {}
    for line in _lines(source, ATTEMPTS_FILE):
        try:
            workload, trials = json.loads(line)
            canonical = table.canonical[int(workload)]
            asked[canonical] = asked.get(canonical, 0) + int(trials)
        except (ValueError, TypeError, KeyError):
            continue
    for canonical, trials in sorted(asked.items()):
        mod = table.workloads[canonical].mod
        missing = trials - log.tuning_attempts(mod)
        if missing > 0 and canonical in table.records:
            log.add_tuning_attempts(mod, missing)


def _lines(directory: str, name: str) -> list[bytes]:
    """Whole lines of a source file (an unterminated last line is a write cut short)."""
    path = os.path.join(directory, name)
    try:
        with open(path, "rb") as file:
            return _split_lines(file.read())[0]
    except FileNotFoundError:
        return []
    except OSError as err:
        from ..errors import EnvironmentFault

        raise EnvironmentFault(f"cannot read the tuning log {path}: {err.strerror}") from None


def target_of_tag(tag: str) -> dict:
    """A target of the tag's kind: the destination log only needs to know CPU from GPU."""
    if tag.startswith("cuda"):
        return {"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm", "mcpu": "generic"}}
    return {"kind": "llvm", "mcpu": "generic", "num-cores": 1}
