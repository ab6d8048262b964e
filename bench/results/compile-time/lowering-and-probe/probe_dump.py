# usage: python probe_dump.py MODEL.onnx LOG_DIR (a copy of the log is used): each layout's probe,
# kernel by kernel, and the clear wins of the slower layout against the region threshold.
import sys, shutil, tempfile, logging
import korch_tvm.pipeline.korch as K
from korch_tvm.pipeline import layout_probe as P
from korch_tvm import compile_model
real_result = P.probe_result
def result(kernels, seconds):
    probe = real_result(kernels, seconds)
    print("PROBE rate", probe.rate / 1e9, "flops", probe.flops)
    for f, s in sorted(probe.seconds_by_flops.items()):
        kinds = {k.kind for k in kernels.values() if float(f"{k.flops:.3g}") == f}
        print(f"   {f:.3g} {s*1e3:.4f} ms {kinds}")
    return probe
P.probe_result = result
real_may = P.regions_may_pay
def may(probes):
    best = P._fastest(probes)
    for layout, probe in probes.items():
        if probe is not best:
            print("CLEAR WINS", layout, P.clear_wins(probe, best), "threshold", P.REGION_GAIN * best.flops / best.rate)
    raise SystemExit(0)
P.regions_may_pay = may
logs = tempfile.mkdtemp()
shutil.copytree(sys.argv[2], logs, dirs_exist_ok=True)
compile_model(sys.argv[1], korch=True, tuning_logs=logs, trials=0)
