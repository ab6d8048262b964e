"""Tune one 1x1 convolution (+ bias + SiLU) written two ways and compare the best schedules.

    .venv/bin/python bench/conv_forms.py --ci 64 --co 128 --size 52 --trials 64 --seeds 0,1,2,3

The same computation as TOPI's conv2d_nchw and as a plain channel contraction (the matmul
form: no padding stage, a 2-D weight), each tuned by the project's profiler into a fresh
throw-away log, once per seed. Prints the default and the tuned time per form and seed: whether
a second implementation of 1x1 candidates would pay, and how much the search seed moves the
result. Measured 2026-11-30 (busy machine): no consistent winner; seeds moved the best of 64
trials by up to 25 %.
"""

from __future__ import annotations

import argparse
import os
import tempfile


def conv2d_form(ci, co, size):
    from tvm import te, topi

    x = te.placeholder((1, ci, size, size), name="x")
    weight = te.placeholder((co, ci, 1, 1), name="w")
    bias = te.placeholder((1, co, 1, 1), name="b")
    return [x, weight, bias], topi.add(topi.nn.conv2d_nchw(x, weight, 1, 0, 1), bias)


def matmul_form(ci, co, size):
    from tvm import te, topi

    x = te.placeholder((1, ci, size, size), name="x")
    weight = te.placeholder((co, ci), name="w")
    bias = te.placeholder((1, co, 1, 1), name="b")
    k = te.reduce_axis((0, ci), name="k")
    product = te.compute((1, co, size, size),
                         lambda n, o, i, j: te.sum(weight[o, k] * x[n, k, i, j], axis=k),
                         name="contract")
    return [x, weight, bias], topi.add(product, bias)


def kernel(form, ci, co, size):
    """The form followed by SiLU (fast-math sigmoid, as the compiler builds it) as a module."""
    import tvm
    from tvm import te, topi

    from korch_tvm.lowering.fast_math import fast_sigmoid

    inputs, pre = form(ci, co, size)
    out = topi.multiply(pre, fast_sigmoid(pre))
    func = te.create_prim_func([*inputs, out]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func.with_attr("layout_free_buffers", [1])})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ci", type=int, default=64)
    parser.add_argument("--co", type=int, default=128)
    parser.add_argument("--size", type=int, default=52)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args(argv)
    os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

    from korch_tvm.backend.target import parse_target
    from korch_tvm.costing.measure import measure_kernels, tune_kernels
    from korch_tvm.costing.tuning_log import TuningLog

    target = parse_target("llvm")
    flops = 2 * args.ci * args.co * args.size * args.size
    print(f"1x1 conv {args.ci}->{args.co} at {args.size}x{args.size} + bias + SiLU "
          f"({flops / 1e6:.1f} MFLOP), {args.trials} trials, target {target}")
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, form in (("conv2d", conv2d_form), ("matmul", matmul_form)):
            module = kernel(form, args.ci, args.co, args.size)
            log = TuningLog(tempfile.mkdtemp(prefix="korch-conv-forms-"), target)
            default = measure_kernels({name: module}, target, log)[name].seconds
            tuned = tune_kernels({name: module}, {name: args.trials}, target, log,
                                 progress=False, seed=seed)[name].seconds
            print(f"  seed {seed}  {name:7s} default {default * 1e3:8.3f} ms  tuned "
                  f"{tuned * 1e3:7.3f} ms  ({flops / tuned / 1e9:5.1f} GFLOP/s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
