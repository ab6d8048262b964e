# usage: python probe_check.py MODEL.onnx LOG_DIR (a copy of the log is used)
"""The layout probe's call on a model, from a copy of a compile's log (kernels it lacks are measured)."""
import sys, shutil, tempfile, logging, time
import korch_tvm.pipeline.korch as K
from korch_tvm import compile_model
real = K.screen_layouts

def screened(prepared, session):
    start = time.perf_counter()
    kept, regions = real(prepared, session)
    print("KEPT", list(kept), "regions costed", regions, "probe seconds",
          round(time.perf_counter() - start, 1), flush=True)
    raise SystemExit(0)

K.screen_layouts = screened
logging.basicConfig(level=logging.WARNING)
logging.getLogger("korch_tvm.data_layout").setLevel(logging.INFO)
logs = tempfile.mkdtemp()
shutil.copytree(sys.argv[2], logs, dirs_exist_ok=True)
compile_model(sys.argv[1], korch=True, tuning_logs=logs, trials=0)
