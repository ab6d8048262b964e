"""Where a kernel measurement's time goes: scheduling, building (2 workers), running."""
import random, sys, time
from korch_tvm.config import KorchConfig
from korch_tvm.costing.session import CostingSession
from korch_tvm.costing.tuning_log import TuningLog
from korch_tvm.costing import default_measurement as dm
from korch_tvm.kernels.fused import structural_key

source = TuningLog(sys.argv[1], "llvm", ) if False else None
import korch_tvm.costing.tuning_log as tl
log = tl.TuningLog(sys.argv[1], tag="llvm-icelake-server-2c")
mods = [k.kernel if hasattr(k, "kernel") else k[0] for k in log.kernels()]
random.seed(0); sample = random.sample(mods, int(sys.argv[3]))
import os
if os.environ.get("BEFORE"):
    import korch_tvm.costing.session as S; S.links_here = lambda r, t: False
timers = {"schedule": 0.0, "build": 0.0, "run": 0.0}
orig_sched = dm._schedules_to_measure
def timed_sched(*a, **k):
    t = time.perf_counter(); r = orig_sched(*a, **k); timers["schedule"] += time.perf_counter() - t; return r
dm._schedules_to_measure = timed_sched
n_sched = [0]
with CostingSession.open(KorchConfig(tuning_logs=sys.argv[2], num_threads=2)) as session:
    b = session.builder(); ob = b.build
    def build(inputs):
        n_sched[0] += len(inputs); t = time.perf_counter(); r = ob(inputs); timers["build"] += time.perf_counter() - t; return r
    b.build = build
    r = session.runner(); orun = r.run
    class R:
        def __init__(s, inner): s.inner = inner
        def run(s, inputs):
            t = time.perf_counter(); fs = s.inner.run(inputs); res = [f.result() for f in fs]
            timers["run"] += time.perf_counter() - t
            class F:
                def __init__(s2, x): s2.x = x
                def result(s2): return s2.x
            return [F(x) for x in res]
        def __getattr__(s, name): return getattr(s.inner, name)
    session._runner = R(r)
    t = time.perf_counter()
    costs = session.measure({structural_key(m): m for m in sample})
    total = time.perf_counter() - t
print(f"{len(sample)} kernels, {n_sched[0]} schedules, total {total:.1f} s", {k: round(v, 1) for k, v in timers.items()})
