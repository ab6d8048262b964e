# usage: python probe_kinds.py MODEL.onnx LOG_DIR (a copy of the log is used)
"""Per kernel kind: each layout's stock kernels' logged time (x uses) and FLOPs; which the probe measures."""
import sys, collections, shutil, tempfile
import korch_tvm.pipeline.korch as K
from korch_tvm import compile_model
from korch_tvm.kernels.kinds import kernel_kind
from korch_tvm.pipeline.layout_probe import stock_kernels, layout_specific, probe_set

def dump(prepared, session):
    kernels = {layout: stock_kernels(each) for layout, each in prepared.items()}
    specific = layout_specific(kernels)
    for layout, stock in kernels.items():
        probe = set(probe_set(specific[layout]))
        agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
        for key, k in stock.items():
            s = session.tuning_log.best_seconds(k.module)
            kind = kernel_kind(k.module["main"])
            a = agg[kind]
            a[0] += 1; a[1] += (s or 0) * k.uses * 1e3; a[2] += k.flops * k.uses / 1e9
            if key in probe: a[3] += (s or 0) * k.uses * 1e3
        print(layout, "total ms", round(sum(a[1] for a in agg.values()), 3))
        for kind, a in sorted(agg.items(), key=lambda x: -x[1][1]):
            print(f"  {kind:16s} n={a[0]:3d} ms={a[1]:8.3f} GFLOP={a[2]:7.3f} probed_ms={a[3]:.3f}")
    raise SystemExit(0)

K.screen_layouts = dump
logs = tempfile.mkdtemp()
shutil.copytree(sys.argv[2], logs, dirs_exist_ok=True)
compile_model(sys.argv[1], korch=True, tuning_logs=logs, trials=0)
