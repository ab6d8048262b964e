# usage: python capture_lowering_inputs.py MODEL.onnx: saves the first three modules a Korch compile
# lowers (lower_to_primitives) as /tmp/prof/lower_in_N.json, with each lowering's seconds, then stops.
import sys, time, tvm
import korch_tvm.pipeline.layout_plan as lp
from korch_tvm.lowering import fission
n = [0]
orig = lp.lower_to_primitives
def wrapped(mod):
    n[0] += 1
    with open(f"/tmp/prof/lower_in_{n[0]}.json", "w") as f:
        f.write(tvm.ir.save_json(mod))
    t = time.perf_counter(); out = orig(mod); print("LOWER", n[0], time.perf_counter() - t, flush=True)
    if n[0] >= 3:
        sys.exit(0)
    return out
lp.lower_to_primitives = wrapped
from korch_tvm.tools.cli import main
sys.argv = ["korch-tvm", "compile", sys.argv[1], "--korch", "--no-verify", "--tuning-logs", "/tmp/prof/caplogs", "-o", "/tmp/prof/cap.so"]
main()
