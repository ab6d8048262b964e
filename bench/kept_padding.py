"""Time padded convolutions and pooling with their padding inlined and kept as its own loop nest.

    .venv/bin/python bench/kept_padding.py [--threads 2] [--out bench/results/kept-padding.txt]

Each kernel is built from TOPI and scheduled by every form `default_schedules` measures (the
rule with packed and with unpacked weights and its three variants); "inlined" is the rule as it
was before `backend/kept_padding.py` (every padding inlined into the reduction, which this
script restores by stubbing out `padding_read_by_reductions`), "kept" the rule now (which keeps
the padding of the convolutions it grows little and inlines the rest: there both columns time
the same code). Printed per kernel:
the fastest form's time each way (best of 3 x 3 warm calls) and their ratio. The outputs of
every form are checked against the unscheduled kernel.
"""

from __future__ import annotations

from default_schedule import arguments, fastest_with_and_without, write_table


def kernels() -> dict:
    """name -> `{"main": PrimFunc}` of one padded kernel, shapes from ResNet, MobileNet, SSD."""
    import tvm
    from tvm import te, topi

    def module(*tensors):
        func = te.create_prim_func(list(tensors)).with_attr("global_symbol", "main")
        return tvm.IRModule({"main": func})

    def conv(size, cin, cout, kernel=3, stride=1, layout="NHWC", dilation=1):
        if layout == "NCHW":
            x = te.placeholder((1, cin, size, size), name="x")
            w = te.placeholder((cout, cin, kernel, kernel), name="w")
            return module(x, w, topi.nn.conv2d_nchw(x, w, stride, kernel // 2, 1,
                                                    out_dtype="float32"))
        x = te.placeholder((1, size, size, cin), name="x")
        w = te.placeholder((kernel, kernel, cin, cout), name="w")
        b = te.placeholder((cout,), name="b")
        y = topi.nn.conv2d_nhwc(x, w, stride, kernel // 2 * dilation, dilation,
                                out_dtype="float32")
        return module(x, w, b, te.compute(y.shape, lambda *i: te.max(y(*i) + b[i[-1]], 0.0)))

    def depthwise(size, channels, kernel, stride):
        x = te.placeholder((1, size, size, channels), name="x")
        w = te.placeholder((kernel, kernel, channels, 1), name="w")
        return module(x, w, topi.nn.depthwise_conv2d_nhwc(x, w, stride, kernel // 2, 1))

    def max_pool(size, channels):
        x = te.placeholder((1, size, size, channels), name="x")
        return module(x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max",
                                        layout="NHWC"))

    return {
        "conv 3x3 64->64 @56 NHWC +bias+relu (ResNet)": conv(56, 64, 64),
        "conv 3x3 128->128 @28 NHWC +bias+relu (ResNet)": conv(28, 128, 128),
        "conv 3x3 256->256 @14 NHWC +bias+relu (ResNet)": conv(14, 256, 256),
        "conv 3x3 512->512 @7 NHWC +bias+relu (ResNet)": conv(7, 512, 512),
        "conv 3x3/2 64->128 @56 NHWC +bias+relu (ResNet)": conv(56, 64, 128, stride=2),
        "conv 7x7/2 3->64 @224 NHWC +bias+relu (ResNet stem)": conv(224, 3, 64, 7, 2),
        "conv 3x3 128->128 @28 NCHW": conv(28, 128, 128, layout="NCHW"),
        "conv 3x3 dilated 12 256->256 @32 NHWC (DeepLabv3)": conv(32, 256, 256, dilation=12),
        "depthwise 3x3 128 @56 NHWC (MobileNet)": depthwise(56, 128, 3, 1),
        "depthwise 5x5/2 240 @32 NHWC (MobileNetV3)": depthwise(32, 240, 5, 2),
        "max pool 3x3/2 64 @112 NHWC (ResNet)": max_pool(112, 64),
    }


def main(argv=None) -> int:
    args = arguments(__doc__, argv)

    from korch_tvm.backend.target import parse_target

    target = parse_target({"kind": "llvm", "num-cores": args.threads})
    lines = [f"{'kernel':52s} {'inlined ms':>11s} {'kept ms':>8s} {'speed-up':>8s}   "
             f"(fastest form of each; target {target}, {args.threads} threads)"]
    for name, mod in kernels().items():
        inlined, kept = fastest_with_and_without(
            mod, target, "korch_tvm.backend.cpu_schedule.padding_read_by_reductions", set())
        lines.append(f"{name:52s} {inlined * 1e3:11.3f} {kept * 1e3:8.3f} {inlined / kept:7.2f}x")
        print(lines[-1], flush=True)
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
