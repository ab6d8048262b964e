"""What a tuning-log root holds, read from its JSON lines alone: counts and best times per tag.

`korch-tvm logs` prints these; reading them never writes, and applies the same `trace_policy`
a compile does, so a record a compile would refuse is counted as refused, not as a record.
"""

from __future__ import annotations

import json
import math
import os
import statistics


def log_stats(root_dir) -> dict[str, dict]:
    """Per tag directory: workload and record counts and a summary of best times.

    Reads the JSON lines only (no TVM parsing, no cleaning), so it is fast and never writes.
    """
    root = os.fspath(root_dir)
    if not os.path.isdir(root):
        return {}
    return {tag: _directory_stats(os.path.join(root, tag)) for tag in log_tags(root)}


def log_tags(root: str) -> list[str]:
    """The tag directories under a log root: those holding a workload file."""
    from .tuning_log import WORKLOAD_FILE

    return [tag for tag in sorted(os.listdir(root))
            if os.path.isfile(os.path.join(root, tag, WORKLOAD_FILE))]


def _directory_stats(directory: str) -> dict:
    from .trace_policy import Refused, check_workload
    from .log_files import RECORD_FILE, REJECTED_SUFFIX, WORKLOAD_FILE
    from .log_lines import _timed_warm, record_refusal, record_seconds

    corrupt = refused = 0
    workload_hash = {}
    for line_no, line in enumerate(read_log_lines(os.path.join(directory, WORKLOAD_FILE))):
        try:
            value = json.loads(line)
            check_workload(value)
            workload_hash[line_no] = value[0]
        except Refused:
            refused += 1
        except (ValueError, IndexError, TypeError):
            corrupt += 1
    best: dict[str, float] = {}
    schedules: dict[str, set[str]] = {}  # successful schedules per workload
    records = failed = warm_timed = 0
    cpu = os.path.basename(directory).startswith("llvm")  # the tag names the target kind
    for line in read_log_lines(os.path.join(directory, RECORD_FILE)):
        try:
            index, record = json.loads(line)
            key = workload_hash.get(index)
            problem = record_refusal(record) if key is not None else "its workload"
        except (ValueError, IndexError, TypeError, KeyError):
            corrupt += 1
            continue
        if problem is not None:
            refused += 1
            continue
        seconds = record_seconds(record[1])
        records += 1
        failed += math.isinf(seconds)
        warm_timed += _timed_warm(cpu, seconds, len(record[1] or []))
        best[key] = min(best.get(key, math.inf), seconds)
        if math.isfinite(seconds):
            schedules.setdefault(key, set()).add(json.dumps(record[0]))
    finite = sorted(s for s in best.values() if math.isfinite(s))
    return {
        "workloads": len(set(workload_hash.values())),
        "records": records,
        "failed_records": failed,
        "refused_records": refused,  # lines a compile would refuse (trace_policy, times)
        "set_aside_records": len(read_log_lines(os.path.join(directory,
                                                          RECORD_FILE + REJECTED_SUFFIX))),
        "warm_timed_records": warm_timed,  # see TuningLog.warm_timed_records
        "corrupt_lines": corrupt,
        "workloads_with_records": len(best),
        # with a successful schedule besides the default one measured first: searched
        "tuned_workloads": sum(len(found) > 1 for found in schedules.values()),
        "best_seconds": {
            "min": finite[0] if finite else None,
            "median": statistics.median(finite) if finite else None,
            "max": finite[-1] if finite else None,
            "total": sum(finite),
        },
    }


def read_log_lines(path: str) -> list[bytes]:
    """A log file's lines (none when it is missing); a fault to read it in one line."""
    try:
        with open(path, "rb") as file:
            return file.read().splitlines()
    except FileNotFoundError:
        return []
    except OSError as err:
        from ..errors import EnvironmentFault

        raise EnvironmentFault(f"cannot read the tuning log {path}: {err.strerror}") from None
