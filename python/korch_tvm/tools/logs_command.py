"""`korch-tvm logs DIR`: what a tuning-log root holds, and checking, merging, training it.

`logs DIR` (or `--stats`) prints a table per tag; `--json` the same as JSON. The counts read
the JSON lines only and never write, but they apply the same `trace_policy` a compile does, so
a record a compile would refuse is counted as refused, not as a record. `--check` opens each
log (which sets refused lines aside, with reasons) and runs the fastest tuned records of the
log of `--target` against their kernels as written. `--merge SRC` merges another root's tags
into DIR (`merge_log_directory`). `--train` fits the cost model of `--target`'s log.
"""

from __future__ import annotations

import json
import math
import os
import sys

from ..costing.log_stats import log_stats, log_tags, read_log_lines
from ..errors import KorchError


def add_arguments(parser) -> None:
    """Declare the logs command's flags on `parser` (the sub-command's argparse parser)."""
    parser.add_argument("directory", help="root of the tuning logs (holding one directory per "
                                          "target tag)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--stats", action="store_true",
                        help="print workloads, records and best times per tag (the default)")
    action.add_argument("--check", action="store_true",
                        help="check every record against the trace policy (refused ones are "
                             "set aside), then run each kernel's fastest tuned records of "
                             "--target's log against the kernel as written and set aside the "
                             "wrong ones")
    action.add_argument("--merge", metavar="SRC_DIR", default=None,
                        help="merge the tuning logs under SRC_DIR (every tag, or --target's) "
                             "into DIR, without duplicates; refused records are not copied")
    action.add_argument("--train", action="store_true",
                        help="(re)train the cost model of --target's log from its records "
                             "and save it beside them")
    parser.add_argument("--target", default=None,
                        help="target whose log to check, train on or merge (default: llvm, "
                             "this CPU; --stats and --merge default to every tag)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args) -> int:
    """Summarise, check, merge or train on the log directory `args` names."""
    if args.merge is None and not os.path.isdir(args.directory):
        raise KorchError(f"tuning-log directory '{args.directory}' does not exist")
    if args.train:
        return _train(args)
    if args.check:
        return _check(args)
    if args.merge is not None:
        return _merge(args)
    stats = log_stats(args.directory)
    print(json.dumps(stats, indent=2, sort_keys=True) if args.json else stats_table(stats))
    return 0


# ---- --stats --------------------------------------------------------------------------------
_COLUMNS = [("tag", None), ("workloads", "workloads"), ("records", "records"),
            ("failed", "failed_records"), ("refused", "refused_records"),
            ("set aside", "set_aside_records"), ("tuned", "tuned_workloads")]
_TIMES = ("min", "median", "max", "total")


def stats_table(stats: dict[str, dict]) -> str:
    """`log_stats` as an aligned table; best times per workload in ms, 3 significant digits."""
    if not stats:
        return "no tuning logs here (a log is a directory <target tag>/ holding " \
               "database_workload.json)"
    header = [name for name, _ in _COLUMNS] + [f"best {name} ms" for name in _TIMES]
    rows = [[tag] + [str(entry[key]) for _, key in _COLUMNS[1:]]
            + [_milliseconds(entry["best_seconds"][name]) for name in _TIMES]
            for tag, entry in stats.items()]
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                       for i, (cell, width) in enumerate(zip(row, widths)))
             for row in [header] + rows]
    notes = ["tuned: workloads with a schedule found by search besides their default one; "
             "refused: records a compile will set aside (logs DIR --check does it now)"]
    return "\n".join(lines + notes)


def _milliseconds(seconds) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3g}"


# ---- --check --------------------------------------------------------------------------------
def _check(args) -> int:
    """Open every log (refused lines go aside), then check --target's records by running them."""
    from ..backend.target import parse_target, target_tag
    from ..costing.log_merge import target_of_tag
    from ..costing.tuning_log import TuningLog

    target = parse_target(args.target or "llvm")
    tag = target_tag(target)
    refused, opened = {}, None
    for name in log_tags(args.directory):
        before = _reasons(args.directory, name)
        log = TuningLog(args.directory, target if name == tag else target_of_tag(name), tag=name)
        if name == tag:
            opened = log  # its records are run below: opened once, its warnings said once
        refused[name] = _reasons(args.directory, name) - before
    if tag not in refused:
        summary = {"refused": refused, "checked_kernels": 0, "wrong_records": 0}
        _print_check(args, summary, f"no log for this target ({tag}) to run; pass --target")
        return 0
    checked, wrong = _check_records(opened)
    summary = {"refused": refused, "checked_kernels": checked, "wrong_records": wrong}
    _print_check(args, summary, None)
    return 0


def _reasons(root: str, tag: str) -> int:
    from ..costing.log_files import REASONS_SUFFIX, RECORD_FILE, WORKLOAD_FILE

    return sum(len(read_log_lines(os.path.join(root, tag, name + REASONS_SUFFIX)))
               for name in (RECORD_FILE, WORKLOAD_FILE))


def _print_check(args, summary: dict, note: str | None) -> None:
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return
    for tag, count in summary["refused"].items():
        print(f"{tag}: {count} line(s) refused by the trace policy and set aside"
              + (" (reasons in database_tuning_record.json.rejected.reasons)" if count else ""))
    print(note or f"{summary['checked_kernels']} kernels checked; {summary['wrong_records']} "
                  "wrong record(s) set aside")


def _check_records(log) -> tuple[int, int]:
    """Every kernel's records, fastest first, until one is right (record_check)."""
    from ..costing.measure import set_aside_wrong_records
    from ..costing.record_check import can_check
    from ..kernels.fused import structural_key

    if not can_check(log.target):
        raise KorchError(f"records for {log.target} cannot run on this machine; check them "
                         "where they were tuned")
    kernels = [logged for logged in log.kernels() if math.isfinite(logged.best_seconds)]
    wrong = 0
    for number, logged in enumerate(kernels, 1):
        wrong += set_aside_wrong_records(log, logged.kernel, log.target,
                                         f"kernel {structural_key(logged.kernel)}")
        if number % 20 == 0 or number == len(kernels):
            print(f"checked {number}/{len(kernels)} kernels, {wrong} wrong record(s) so far",
                  file=sys.stderr, flush=True)
    return len(kernels), wrong


# ---- --merge and --train --------------------------------------------------------------------
def _merge(args) -> int:
    from ..backend.target import inside_root, parse_target, target_tag
    from ..costing.log_merge import merge_log_directory

    source = args.merge
    if not os.path.isdir(source):
        raise KorchError(f"tuning-log directory '{source}' to merge from does not exist")
    tags = [target_tag(parse_target(args.target))] if args.target else log_tags(source)
    missing = [tag for tag in tags if tag not in log_tags(source)]
    if missing or not tags:
        raise KorchError(f"no tuning log {' '.join(missing) or '(no tag at all)'} in {source}")
    os.makedirs(args.directory, exist_ok=True)
    counts = {tag: merge_log_directory(os.path.join(source, tag),
                                       inside_root(args.directory, tag)) for tag in tags}
    if args.json:
        print(json.dumps(counts, indent=2, sort_keys=True))
        return 0
    for tag, entry in counts.items():
        print(f"{tag}: {entry['workloads_added']} workload(s) and {entry['records_added']} "
              f"record(s) added, {entry['duplicates']} duplicate(s) skipped, "
              f"{entry['refused']} refused and {entry['corrupt']} corrupt line(s) not copied")
    return 0


def _train(args) -> int:
    from ..costing.cost_model import model_path, train_log_model
    from ..costing.tuning_log import TuningLog

    log = TuningLog(args.directory, args.target or "llvm")
    _, stats = train_log_model(log)
    print(f"cost model saved to {model_path(log)}: held-out Spearman "
          f"{stats['spearman']:.3f}, median relative error "
          f"{stats['median_relative_error']:.2f} on {stats['count']} kernels")
    return 0
