"""Per kernel: build, object code, and a link by gcc or ld (the costs a library has once): linkcost.py LOG_DIR."""
import time, sys, tempfile, os, subprocess
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.builder.local_builder import default_build
from korch_tvm.target_spec import parse_target
from korch_tvm.costing.metaschedule_setup import skip_gpu_tensor_intrin
skip_gpu_tensor_intrin()
target = parse_target("llvm")
logdir = sys.argv[1]
db = ms.database.JSONDatabase(f"{logdir}/database_workload.json", f"{logdir}/database_tuning_record.json", allow_missing=False)
recs = db.get_all_tuning_records()[:60:3]
mods = []
for rec in recs:
    s = tvm.s_tir.Schedule(rec.workload.mod); rec.trace.apply_to_schedule(s, remove_postproc=True); mods.append(s.mod)
d = tempfile.mkdtemp()
tb = te = tl1 = tl2 = 0
for i, m in enumerate(mods):
    t0 = time.perf_counter(); b = default_build(m, target, None); t1 = time.perf_counter()
    o = os.path.join(d, f"k{i}.o"); b.write_to_file(o); t2 = time.perf_counter()
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", o[:-2] + "g.so", o], check=True); t3 = time.perf_counter()
    subprocess.run(["ld", "-shared", "-o", o[:-2] + "l.so", o], check=True); t4 = time.perf_counter()
    tb += t1 - t0; te += t2 - t1; tl1 += t3 - t2; tl2 += t4 - t3
n = len(mods)
print(f"{n} kernels: build {tb/n*1e3:.1f} ms, object {te/n*1e3:.1f} ms, gcc link {tl1/n*1e3:.1f} ms, ld link {tl2/n*1e3:.1f} ms")
m = tvm.runtime.load_module(os.path.join(d, "k0l.so")); print("loads:", m)
