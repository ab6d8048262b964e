"""Wall time of PooledBuilder(linked) over the scheduled kernels of a log: PYTHONPATH=... builder_ab.py LOG_DIR N."""
import sys, time, tempfile
import tvm
from tvm.s_tir import meta_schedule as ms
from korch_tvm.target_spec import parse_target
from korch_tvm.costing.pooled_builder import PooledBuilder
from korch_tvm.costing.metaschedule_setup import skip_gpu_tensor_intrin
skip_gpu_tensor_intrin()
target = parse_target("llvm")
logdir, limit = sys.argv[1], int(sys.argv[2])
db = ms.database.JSONDatabase(f"{logdir}/database_workload.json", f"{logdir}/database_tuning_record.json", allow_missing=False)
mods = []
for rec in db.get_all_tuning_records()[:limit]:
    s = tvm.s_tir.Schedule(rec.workload.mod)
    rec.trace.apply_to_schedule(s, remove_postproc=False)
    mods.append(s.mod)
inputs = [ms.builder.BuilderInput(m, target) for m in mods]
with PooledBuilder(target, max_workers=2, scratch=tempfile.mkdtemp(), linked=True) as b:
    b.build(inputs[:4])  # workers up
    for chunk in (64, 8):
        t0 = time.perf_counter()
        results = []
        for i in range(0, len(inputs), chunk):
            results += b.build(inputs[i:i + chunk])
        print(f"chunks of {chunk}: {len(inputs)} kernels in {time.perf_counter() - t0:.1f} s, "
              f"{sum(r.error_msg is not None for r in results)} failed")
