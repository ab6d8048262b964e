"""Time TVM's default exp/sigmoid/tanh/erf against the fast-math legalization, side by side.

    .venv/bin/python bench/fast_math.py [--shape 1x64x104x104] [--threads 2]

Each function is legalized both ways (korch_tvm.lowering.fast_math.legalize_ops), given the same
simple schedule (all loops fused, outer part parallel, inner 16 lanes vectorised) and timed on the
same tensor; a plain multiply of that tensor is the memory-bound floor. Prints ms, the ratio and
the largest relative error of each against float64 references. The figures quoted in
lowering/fast_math.py come from this script.
"""

from __future__ import annotations

import argparse
import math
import os

import numpy as np

FUNCTIONS = {  # name -> (relax op, float64 reference)
    "exp": ("exp", np.exp),
    "sigmoid": ("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x))),
    "tanh": ("tanh", np.tanh),
    "erf": ("erf", np.vectorize(math.erf)),
    "multiply (floor)": (None, lambda x: x * x),
}


def one_op(op_name, shape):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            value = getattr(relax.op, op_name)(x) if op_name else relax.op.multiply(x, x)
            out = bb.emit_output(value)
        bb.emit_func_output(out)
    return bb.get()


def vectorised(mod, target):
    """Legalized module -> every PrimFunc fused, parallel and 16-wide vectorised."""
    import tvm
    from tvm.s_tir import Schedule

    with target:
        mod = tvm.transform.Sequential([tvm.relax.transform.FuseOps(),
                                        tvm.relax.transform.FuseTIR()])(
            tvm.relax.transform.AnnotateTIROpPattern()(mod))
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        sch = Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        for block in blocks[:-1]:
            sch.compute_inline(block)
        outer, inner = sch.split(sch.fuse(*sch.get_loops(blocks[-1])), [None, 16])
        sch.parallel(outer)
        sch.vectorize(inner)
        mod[gv] = sch.mod["main"]
    return mod


def time_function(op_name, fast, shape, target, data):
    import tvm
    from tvm import relax

    from korch_tvm.lowering.fast_math import legalize_ops

    mod = vectorised(legalize_ops(fast)(one_op(op_name, shape)), target)
    vm = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())
    x = tvm.runtime.tensor(data, tvm.cpu())
    out = vm["main"](x).numpy()
    timer = vm.time_evaluator("main", tvm.cpu(), number=50, repeat=7)
    return timer(x).median * 1e3, out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="1x64x104x104")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    from korch_tvm.backend.target import parse_target

    target = parse_target("llvm")
    shape = tuple(int(d) for d in args.shape.split("x"))
    data = np.random.default_rng(0).normal(0.0, 4.0, shape).astype("float32")
    reference_input = data.astype("float64")
    print(f"{'function':18s} {'default ms':>10s} {'fast ms':>8s} {'speed-up':>8s} "
          f"{'default err':>11s} {'fast err':>9s}   (target {target}, shape {args.shape})")
    for name, (op_name, reference) in FUNCTIONS.items():
        want = reference(reference_input)
        row = []
        for fast in (False, True):
            ms, out = time_function(op_name, fast, shape, target, data)
            error = np.max(np.abs(out - want) / np.maximum(np.abs(want), 1e-30))
            row.append((ms, error))
        (slow_ms, slow_err), (fast_ms, fast_err) = row
        print(f"{name:18s} {slow_ms:10.3f} {fast_ms:8.3f} {slow_ms / fast_ms:7.2f}x "
              f"{slow_err:11.1e} {fast_err:9.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
