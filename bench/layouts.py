"""Tune convolution kernels in NCHW and in NHWC and compare the best schedules.

    .venv/bin/python bench/layouts.py --trials 64 --seeds 0,1

Each case is a Relax conv2d + bias + SiLU, built the way both compile paths build kernels
(data_layout.convert_layout for NHWC, then stock_fusion: fast-math legalization, FuseOps,
FuseTIR, weights marked layout free) and tuned by the project's profiler into a fresh
throw-away log, once per seed. This is the evidence behind --layout (layout/activations.py).
"""

from __future__ import annotations

import argparse
import os
import tempfile

# (name, input channels, output channels, groups, kernel size, stride, image size)
CASES = [
    ("conv1x1 64->128 @52", 64, 128, 1, 1, 1, 52),
    ("conv1x1 128->256 @26", 128, 256, 1, 1, 1, 26),
    ("depthwise3x3 128 @26", 128, 128, 128, 3, 1, 26),
    ("conv3x3 64->64 @26", 64, 64, 1, 3, 1, 26),
]


def conv_block(ci, co, groups, k, stride, size):
    """main(x) = SiLU(conv2d(x, W) + b) in NCHW with constant weights, as an ONNX import gives."""
    import numpy as np
    import tvm
    from tvm import relax

    rng = np.random.default_rng(0)
    weight = relax.const(rng.standard_normal((co, ci // groups, k, k)).astype("float32"))
    bias = relax.const(rng.standard_normal((1, co, 1, 1)).astype("float32"))
    x = relax.Var("x", relax.TensorType((1, ci, size, size), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(relax.op.nn.conv2d(x, weight, strides=stride, padding=k // 2,
                                                   groups=groups))
            biased = builder.emit(relax.op.add(conv, bias))
            out = builder.emit_output(relax.op.nn.silu(biased))
        builder.emit_func_output(out)
    return builder.get()


def conv_kernel(mod, target):
    """The fused kernel holding the convolution, as the tuning log keys it."""
    from korch_tvm.kernels.fused import kernel_module
    from korch_tvm.kernels.kinds import module_kernel_kinds
    from korch_tvm.pipeline.stock import stock_fusion

    fused = stock_fusion(mod, target)
    (name,) = [n for n, kind in module_kernel_kinds(fused).items() if kind != "memory"]
    return kernel_module(fused[name])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--seeds", default="0,1")
    args = parser.parse_args(argv)
    os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

    from korch_tvm.backend.target import parse_target
    from korch_tvm.costing.measure import tune_kernels
    from korch_tvm.costing.tuning_log import TuningLog
    from korch_tvm.layout.activations import convert_layout

    target = parse_target("llvm")
    print(f"conv2d + bias + SiLU, {args.trials} trials per kernel and seed, target {target}")
    for name, ci, co, groups, k, stride, size in CASES:
        source = conv_block(ci, co, groups, k, stride, size)
        out = size // stride
        flops = 2 * (ci // groups) * k * k * co * out * out
        for seed in (int(s) for s in args.seeds.split(",")):
            cells = []
            for layout in ("NCHW", "NHWC"):
                module = conv_kernel(convert_layout(source, layout), target)
                log = TuningLog(tempfile.mkdtemp(prefix="korch-layouts-"), target)
                seconds = tune_kernels({layout: module}, {layout: args.trials}, target, log,
                                       progress=False, seed=seed)[layout].seconds
                cells.append(f"{layout} {seconds * 1e3:7.3f} ms ({flops / seconds / 1e9:5.1f} "
                             "GFLOP/s)")
            print(f"  {name:22s} seed {seed}  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
