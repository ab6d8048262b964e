"""Time the CPU default schedule without register tiles, with them, and its three variants.

    .venv/bin/python bench/default_schedule.py [--threads 2] [--out bench/results/default_schedule.txt]

Each kernel (matmuls and convolutions of the shapes that dominate the suite models) is built
from TOPI, scheduled by `korch_tvm.backend.cpu_schedule.default_schedule` with `register_tiles`
off, on, and in the three variants the profiler also measures (`default_schedules`: up to
`WIDE_TILE_ROWS` tile rows; the vector's outer loop outermost; `PAIR_COLUMNS` vectors per tile
row), checked equal, and timed with a warm cache (best of 3 x 3 calls). The figures quoted in
backend/cpu_schedule.py come from this script.
"""

from __future__ import annotations

import argparse
import os


def kernels() -> dict:
    """name -> `{"main": PrimFunc}` module of one linear kernel, as Relax would legalize it."""
    import tvm
    from tvm import te, topi

    def module(*tensors):
        func = te.create_prim_func(list(tensors)).with_attr("global_symbol", "main")
        return tvm.IRModule({"main": func})

    def matmul(m, k, n):
        a, b = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="b")
        r = te.reduce_axis((0, k), "r")
        return module(a, b, te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r)))

    def conv_nhwc(size, cin, cout, kernel, stride, depthwise=False, bias_relu=False):
        x = te.placeholder((1, size, size, cin), name="x")
        if depthwise:
            w = te.placeholder((kernel, kernel, cout, 1), name="w")
            y = topi.nn.depthwise_conv2d_nhwc(x, w, stride, kernel // 2, 1)
        else:
            w = te.placeholder((kernel, kernel, cin, cout), name="w")
            y = topi.nn.conv2d_nhwc(x, w, stride, kernel // 2, 1, out_dtype="float32")
        if not bias_relu:
            return module(x, w, y)
        b = te.placeholder((cout,), name="b")
        return module(x, w, b, te.compute(y.shape, lambda *i: te.max(y(*i) + b[i[-1]], 0.0)))

    def conv_nchw(size, cin, cout, kernel):
        x = te.placeholder((1, cin, size, size), name="x")
        w = te.placeholder((cout, cin, kernel, kernel), name="w")
        return module(x, w, topi.nn.conv2d_nchw(x, w, 1, kernel // 2, 1, out_dtype="float32"))

    return {
        "matmul 128x768x3072 (BERT MLP)": matmul(128, 768, 3072),
        "matmul 128x3072x768 (BERT MLP out)": matmul(128, 3072, 768),
        "matmul 4096x256x1024 (SegFormer MLP)": matmul(4096, 256, 1024),
        "conv 1x1 1024->256 @128 NHWC (SegFormer)": conv_nhwc(128, 1024, 256, 1, 1),
        "conv 1x1 64->64 @80 NHWC +bias+relu (YOLOX)": conv_nhwc(80, 64, 64, 1, 1, bias_relu=True),
        "conv 1x1 256->64 @13 NHWC +bias+relu (YOLOX)": conv_nhwc(13, 256, 64, 1, 1,
                                                                bias_relu=True),
        "matmul 197x192x768 (DeiT MLP)": matmul(197, 192, 768),
        "conv 3x3 64->64 @56 NHWC +bias+relu": conv_nhwc(56, 64, 64, 3, 1, bias_relu=True),
        "conv 3x3 256->256 @14 NHWC +bias+relu (ResNet)": conv_nhwc(14, 256, 256, 3, 1,
                                                                  bias_relu=True),
        "conv 3x3 512->1024 @13 NHWC (YOLOv4)": conv_nhwc(13, 512, 1024, 3, 1),
        "conv 3x3 64->128 @208 NHWC (YOLOv4)": conv_nhwc(208, 64, 128, 3, 1),
        "conv 7x7/4 3->32 @512 NHWC (SegFormer patch)": conv_nhwc(512, 3, 32, 7, 4),
        "depthwise 3x3 128 @56 NHWC": conv_nhwc(56, 128, 128, 3, 1, depthwise=True),
        "conv 3x3 32->32 @224 NCHW (Candy)": conv_nchw(224, 32, 32, 3),
    }


def run(mod, target, seed: int = 0):
    """(best seconds per call, output) of `mod` built for `target` on seeded inputs."""
    import numpy as np
    import tvm

    library = tvm.compile(mod, target=target)
    device = tvm.cpu()
    rng = np.random.default_rng(seed)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.ty.shape]).astype(
        str(p.ty.dtype)), device) for p in mod["main"].params]
    timer = library.mod.time_evaluator("main", device, number=3, repeat=3)
    return min(timer(*args).results), args[-1].numpy()


def fastest(mod, target, reference) -> float:
    """Best seconds over every form `default_schedules` gives `mod`, each checked."""
    import numpy as np

    from korch_tvm.backend.schedule_variants import default_schedules

    best = float("inf")
    for schedule in default_schedules(mod, target):
        seconds, output = run(schedule.mod, target)
        np.testing.assert_allclose(output, reference, rtol=1e-4, atol=1e-4)
        best = min(best, seconds)
    return best


def fastest_with_and_without(mod, target, rule: str, stubbed_result) -> tuple[float, float]:
    """(seconds with `rule`, a function of the default schedule named by its import path,
    stubbed out to return `stubbed_result`; seconds with it as it is): `fastest` each way,
    both checked against the unscheduled kernel."""
    from unittest import mock

    _, reference = run(mod, target)
    with mock.patch(rule, lambda *_: stubbed_result):
        without = fastest(mod, target, reference)
    return without, fastest(mod, target, reference)


def arguments(doc: str, argv=None) -> argparse.Namespace:
    """--threads (also set as TVM's thread count, before TVM starts its pool) and --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    return args


def write_table(lines: list[str], path: str | None) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")


def main(argv=None) -> int:
    args = arguments(__doc__, argv)

    import numpy as np

    from korch_tvm.backend.cpu_schedule import PAIR_COLUMNS, WIDE_TILE_ROWS, default_schedule
    from korch_tvm.backend.target import parse_target
    from korch_tvm.backend.tile_shape import MAX_TILE_ROWS, TILE_ROWS

    target = parse_target({"kind": "llvm", "num-cores": args.threads})
    lines = [f"{'kernel':46s} {'untiled ms':>11s} {'tiled ms':>9s} {'speed-up':>8s} "
             f"{'wide ms':>8s} {'vector outer ms':>16s} {'pair ms':>8s}   (target {target}, "
             f"{TILE_ROWS} tile rows, up to {MAX_TILE_ROWS}; wide: up to {WIDE_TILE_ROWS}; "
             f"pair: {PAIR_COLUMNS} vectors per row)"]
    for name, mod in kernels().items():
        untiled, reference = run(default_schedule(mod, target, register_tiles=False).mod, target)
        tiled, output = run(default_schedule(mod, target).mod, target)
        np.testing.assert_allclose(output, reference, rtol=1e-4, atol=1e-4, err_msg=name)
        variants = []
        for options in ({"tile_rows": WIDE_TILE_ROWS}, {"vector_outer": True},
                        {"columns": PAIR_COLUMNS}):
            seconds, output = run(default_schedule(mod, target, **options).mod, target)
            np.testing.assert_allclose(output, reference, rtol=1e-4, atol=1e-4, err_msg=name)
            variants.append(seconds)
        lines.append(f"{name:46s} {untiled * 1e3:11.3f} {tiled * 1e3:9.3f} "
                     f"{untiled / tiled:7.2f}x {variants[0] * 1e3:8.3f} {variants[1] * 1e3:16.3f} "
                     f"{variants[2] * 1e3:8.3f}")
        print(lines[-1], flush=True)
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
