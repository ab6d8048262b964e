"""Wall time of measure_kernels on the distinct kernels of a log (fresh log, cold, no seeds).

    KORCH_TVM_SEED_LOGS="" PYTHONPATH=<korch_tvm python folder> .venv/bin/python measure_ab.py LOG_DIR N
"""
import sys, time, tempfile
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from korch_tvm.target_spec import parse_target
from korch_tvm.costing.measure import measure_kernels
from korch_tvm.costing.tuning_log import TuningLog
target = parse_target("llvm")
logdir, limit = sys.argv[1], int(sys.argv[2])
db = ms.database.JSONDatabase(f"{logdir}/database_workload.json", f"{logdir}/database_tuning_record.json", allow_missing=False)
kernels = {}
for i, wl in enumerate(db.get_all_tuning_records()):
    kernels.setdefault(tvm_ffi.structural_hash(wl.workload.mod), wl.workload.mod)
kernels = {f"k{i}": m for i, m in enumerate(list(kernels.values())[:limit])}
t0 = time.perf_counter()
costs = measure_kernels(kernels, target, TuningLog(tempfile.mkdtemp(), target), progress=False)
print(f"{len(kernels)} kernels measured in {time.perf_counter() - t0:.1f} s; "
      f"{sum(c.source == 'measured' for c in costs.values())} measured, sum {sum(c.seconds for c in costs.values())*1e3:.2f} ms")
