"""Is packed vs plain on small kernels a real difference or noise? Re-measure both, 3 times."""
import sys, json, random, time
import tvm
from tvm.s_tir import meta_schedule as ms
import korch_tvm.costing.tuning_log as tl
from korch_tvm.config import KorchConfig
from korch_tvm.costing.session import CostingSession
from korch_tvm.costing.default_measurement import default_schedules
from korch_tvm.costing.log_lines import record_seconds
from korch_tvm.kernels.fused import kernel_flops
log = tl.TuningLog(sys.argv[1], tag=sys.argv[2] if len(sys.argv) > 2 else "llvm-icelake-server-2c")
mods = [k.kernel for k in log.kernels()]
with CostingSession.open(KorchConfig(tuning_logs=None, num_threads=2)) as session:
    target = session.target
    picked = []
    for mod in mods:
        if kernel_flops(mod) >= 2e7: continue
        s = default_schedules(mod, target)
        if len(s) == 2: picked.append((mod, s))
    random.seed(3); picked = random.sample(picked, min(40, len(picked)))
    inputs = [ms.builder.BuilderInput(m, target) for _, s in picked for m, _ in s]
    built = session.builder().build(inputs)
    runner = session.runner()
    ins = [ms.runner.RunnerInput(b.artifact_path, "cpu", ms.arg_info.ArgInfo.from_entry_func(i.mod, remove_preproc=True)) for b, i in zip(built, inputs)]
    trials = []
    for rep in range(4):
        res = [f.result() for f in runner.run(ins)]
        trials.append([record_seconds([float(x) for x in r.run_secs]) for r in res])
    out = []
    for k in range(len(picked)):
        packed = [t[2 * k] for t in trials]; plain = [t[2 * k + 1] for t in trials]
        out.append((kernel_flops(picked[k][0]), packed, plain))
    json.dump(out, open("/tmp/bo/recheck.json", "w"))
    agree = 0; big = 0
    for f, pk, pl in out:
        ratios = [b / a for a, b in zip(pk, pl)]
        if max(ratios) < 1 or min(ratios) > 1: agree += 1
        if min(ratios) > 1.1 or max(ratios) < 1/1.1: big += 1
        print("%.1e" % f, " ".join("%.2f" % r for r in ratios), "| packed ms %.4f" % (min(pk) * 1e3))
    print("consistent winner", agree, "of", len(out), "; consistently >10%", big)
