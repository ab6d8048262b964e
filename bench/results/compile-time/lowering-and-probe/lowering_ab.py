# usage: python lowering_ab.py LOWER_IN.json...: lower_to_primitives now against the same passes with
# relax FoldConstant (the code before a5c8b3c), seconds each and whether the modules are equal.
import sys, time, tvm, tvm_ffi
from tvm import relax
from korch_tvm.lowering.fission import TrimDeadConvTaps, PrimitiveLowering, lower_to_primitives
for path in sys.argv[1:]:
    mod = tvm.ir.load_json(open(path).read())
    t = time.perf_counter(); new = lower_to_primitives(mod); tn = time.perf_counter() - t
    t = time.perf_counter()
    old = tvm.transform.Sequential([TrimDeadConvTaps(), PrimitiveLowering(), relax.transform.CanonicalizeBindings(), relax.transform.FoldConstant(), relax.transform.DeadCodeElimination()])(mod)
    to = time.perf_counter() - t
    print(path, "new", round(tn, 2), "old", round(to, 2), "equal", tvm_ffi.structural_equal(new, old, map_free_vars=True))
