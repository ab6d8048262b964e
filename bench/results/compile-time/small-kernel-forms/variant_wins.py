"""Which default-schedule variant is the fastest, per kernel of a log, and by how much."""
import sys, json, collections, math
import tvm, tvm_ffi
import korch_tvm.costing.tuning_log as tl
from korch_tvm.backend import cpu_schedule as cs
from korch_tvm.kernels.fused import kernel_flops
log = tl.TuningLog(sys.argv[1], tag=sys.argv[2])
target = tvm.target.Target({"kind": "llvm", "mcpu": "icelake-server", "num-cores": 2})
names = ["packed", "plain", "wide", "vouter", "pair"]
wins = collections.Counter(); rows = []
for k in log.kernels():
    mod = k.kernel
    recs = log.ranked_records(mod)
    if len(recs) < 2: continue
    cs_list = []
    plain = cs.default_schedule(mod, target, pack_weights=False)
    if plain is None: continue
    labelled = [("packed", cs._with_packed_weights(plain, target)), ("plain", plain)]
    if kernel_flops(mod) >= cs.VARIANT_MIN_FLOPS:
        for name, args in (("wide", (cs.WIDE_TILE_ROWS, False, 1)), ("vouter", (cs.TILE_ROWS, True, 1)), ("pair", (cs.TILE_ROWS, False, cs.PAIR_COLUMNS))):
            try:
                labelled.append((name, cs._with_packed_weights(cs._scheduled(mod, cs._cores(target), args[0], args[1], True, args[2]), target)))
            except Exception:
                pass
    times = {}
    for rec in recs:
        sch = tvm.s_tir.Schedule(mod)
        try:
            rec.trace.apply_to_schedule(sch, remove_postproc=False)
        except Exception:
            continue
        for name, s in labelled:
            if name not in times and tvm_ffi.structural_equal(sch.mod, s.mod):
                from korch_tvm.costing.log_lines import record_seconds; times[name] = record_seconds([float(x) for x in rec.run_secs])
                break
    rows.append((kernel_flops(mod), times))
print(len(rows), "kernels with >= 2 records")
json.dump([[f, t] for f, t in rows], open(sys.argv[3], "w"))
