"""Which default-schedule form won on each kernel of a cold compile's log, grouped by anchor.

    .venv/bin/python variant_wins.py LOG_DIR OUT.json   (LOG_DIR: .../tuning_logs/llvm-<cpu>-2c)

Each record's trace is applied to its kernel and matched to the forms `named_default_schedules`
gives it; kernels with at least two forms timed are written with their anchor and times (s).
Run on the log of a compile that measured every form (before variant anchors).
"""
import json
import sys
from collections import defaultdict

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from korch_tvm.backend.schedule_variants import named_default_schedules, variant_anchor
from korch_tvm.target_spec import parse_target

logdir, out = sys.argv[1], sys.argv[2]
target = parse_target("llvm")
database = ms.database.JSONDatabase(f"{logdir}/database_workload.json",
                                    f"{logdir}/database_tuning_record.json", allow_missing=False)
records = defaultdict(list)
for record in database.get_all_tuning_records():
    records[record.workload.mod].append(record)
rows = []
for kernel, kept in records.items():
    anchor = variant_anchor(kernel)
    if anchor is None:
        continue
    forms = named_default_schedules(kernel, target)
    times = {}
    for record in kept:
        schedule = tvm.s_tir.Schedule(kernel)
        try:
            record.trace.apply_to_schedule(schedule, remove_postproc=False)
        except Exception:  # noqa: BLE001 - a record of another form than these
            continue
        for name, form in forms:
            if tvm_ffi.structural_equal(schedule.mod, form.mod):
                times.setdefault(name, min(float(s) for s in record.run_secs))
                break
    if len(times) >= 2:
        rows.append({"anchor": repr(anchor), "times": times})
json.dump(rows, open(out, "w"), indent=1)
print(f"{len(rows)} kernels with forms timed, {len({r['anchor'] for r in rows})} anchors")
