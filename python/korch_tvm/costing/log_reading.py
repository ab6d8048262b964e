"""Reading a log directory into its index, and cleaning the files of lines no reader can use.

The stock MetaSchedule loader aborts on one bad line. Here a corrupt line is warned about,
copied verbatim to `<file>.corrupt` and removed; a line the policy refuses is moved to
`<file>.rejected`, its reason to `<file>.rejected.reasons`. A bad workload line in the middle
is replaced by a copy of a good one, so that every record keeps naming its workload by the
same line number. Lines other processes append are read as they come (`sync_table`); anything
unusual about them means a full, cleaning reload (`load_table`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .log_files import RECORD_FILE, WORKLOAD_FILE, LogDirectory, _split_lines
from .log_lines import LineVerdicts, _parse_record, _parse_workload, _short
from .log_table import _Table
from .trace_policy import Refused

logger = logging.getLogger("korch_tvm.tuning_log")  # the log's one voice, whichever part speaks


@dataclass
class _Sorted:
    """One file's lines as parsing sorted them: kept (by line number), corrupt, refused."""

    good: dict[int, bytes] = field(default_factory=dict)
    bad: list[bytes] = field(default_factory=list)
    bad_reasons: list[str] = field(default_factory=list)
    refused: list[tuple[bytes, str]] = field(default_factory=list)  # (line, reason)


def load_table(files: LogDirectory, verdicts: LineVerdicts) -> _Table:
    """The index of both files of `files`, parsed from scratch, each line judged through
    `verdicts`; where a line had to be left out and the directory is writable, the files are
    first rewritten clean (and read again)."""
    table = _Table()
    workload_lines, workload_tail = _split_lines(files.read(WORKLOAD_FILE))
    record_lines, record_tail = _split_lines(files.read(RECORD_FILE))
    workloads = _add_workloads(table, workload_lines + ([workload_tail] if workload_tail else []),
                               verdicts)
    records = _add_records(table, record_lines + ([record_tail] if record_tail else []), verdicts)
    # A complete last line without its newline would swallow the next append: rewrite too.
    needs_rewrite = bool(workloads.bad or records.bad or workload_tail or record_tail
                         or records.refused or workloads.refused)
    for entries in (workloads.refused, records.refused):
        for _, reason in entries:
            logger.warning("tuning log %s: set aside %s, refused: %s", files.directory,
                           reason.split(":")[0], reason.split(": ", 1)[1])
    if needs_rewrite and files.writable:
        _rewrite_clean(files, workloads, records)
        return load_table(files, verdicts)
    if needs_rewrite:
        for reason in workloads.bad_reasons + records.bad_reasons:
            logger.warning("tuning log %s: skipped a corrupt line (%s)", files.directory, reason)
    table.workload_lines = len(workload_lines) + (1 if workload_tail else 0)
    table.workload_bytes = len(files.read(WORKLOAD_FILE))
    table.record_bytes = len(files.read(RECORD_FILE))
    table.file_ids = files.file_ids()
    return table


def _add_workloads(table: _Table, lines: list[bytes], verdicts: LineVerdicts) -> _Sorted:
    """Add the workload lines `table` can use; a refused one keeps its number in
    `table.refused_workloads` (its records are refused with it)."""
    found = _Sorted()
    for line_no, line in enumerate(lines):
        try:
            table.add_workload(line_no, _parse_workload(line, verdicts))
            found.good[line_no] = line
        except Refused as err:  # kept in place of a filler until the files are rewritten
            table.refused_workloads.add(line_no)
            found.refused.append((line, f"workload line {line_no + 1}: {err}"))
        except Exception as err:  # noqa: BLE001 - any parse failure means a bad line
            found.bad.append(line)
            found.bad_reasons.append(f"workload line {line_no + 1}: {_short(err)}")
    return found


def _add_records(table: _Table, lines: list[bytes], verdicts: LineVerdicts) -> _Sorted:
    """Add the record lines whose workload `table` holds and that the policy allows."""
    found = _Sorted()
    for line_no, line in enumerate(lines):
        try:
            table.add_record(*_parse_record(line, table, verdicts))
            found.good[line_no] = line
        except Refused as err:
            found.refused.append((line, f"record line {line_no + 1}: {err}"))
        except Exception as err:  # noqa: BLE001
            found.bad.append(line)
            found.bad_reasons.append(f"record line {line_no + 1}: {_short(err)}")
    return found


def _rewrite_clean(files: LogDirectory, workloads: _Sorted, records: _Sorted) -> None:
    """Set the left-out lines aside, then rewrite both files with the kept ones."""
    files.set_aside_corrupt(RECORD_FILE, records.bad, records.bad_reasons)
    files.set_aside_corrupt(WORKLOAD_FILE, workloads.bad, workloads.bad_reasons)
    for name, entries in ((WORKLOAD_FILE, workloads.refused), (RECORD_FILE, records.refused)):
        files.keep_aside(name, [line for line, _ in entries], [reason for _, reason in entries])
    # Records first: a crash between the two rewrites leaves no record pointing at a
    # workload line that is about to change.
    files.replace(RECORD_FILE, list(records.good.values()))
    files.replace(WORKLOAD_FILE, _renumbered(workloads.good))


def sync_table(files: LogDirectory, table: _Table, verdicts: LineVerdicts) -> _Table:
    """`table` with the lines other processes appended to `files` since it was read (judged
    through `verdicts`); a fresh `load_table` when the files were replaced, a line was cut
    short, or a new line is bad."""
    if files.file_ids() != table.file_ids:
        return load_table(files, verdicts)
    new_workloads = files.read(WORKLOAD_FILE, table.workload_bytes)
    new_records = files.read(RECORD_FILE, table.record_bytes)
    if (new_workloads and not new_workloads.endswith(b"\n")) or (
        new_records and not new_records.endswith(b"\n")
    ):
        return load_table(files, verdicts)  # a writer died mid-line
    try:
        for line in _split_lines(new_workloads)[0]:
            table.add_workload(table.workload_lines, _parse_workload(line, verdicts))
            table.workload_lines += 1
            table.workload_bytes += len(line) + 1
        for line in _split_lines(new_records)[0]:
            table.add_record(*_parse_record(line, table, verdicts))
            table.record_bytes += len(line) + 1
    except Exception:  # noqa: BLE001 - a bad appended line: clean everything
        return load_table(files, verdicts)
    return table


def _renumbered(good_lines: dict[int, bytes]) -> list[bytes]:
    """Workload lines with every good line at its old number; trailing bad lines are dropped."""
    if not good_lines:
        return []
    filler = next(iter(good_lines.values()))  # a duplicate workload is harmless to readers
    return [good_lines.get(line_no, filler) for line_no in range(max(good_lines) + 1)]
