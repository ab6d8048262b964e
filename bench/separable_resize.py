"""Time a bilinear resize as one kernel and as the two passes of lowering/separable_resize.py.

    .venv/bin/python bench/separable_resize.py [--threads 2]
        [--out bench/results/separable-resize.txt]

The shapes are the segmentation heads' final upsampling (DeepLabv3 and LR-ASPP on MobileNetV3,
21 classes to 256x256), with the transpose back to the model's NCHW that an NHWC plan ends
with, and the same resize planned in NCHW. "one kernel" is TOPI's resize (+ the transpose);
"passes" are the width pass and the height pass (+ the transpose) as the lowering emits them,
each its own kernel. Every kernel is scheduled by each form `default_schedules` measures and
the fastest is kept (best of 3 x 3 warm calls), as the compiler's profiler does; the passes'
output is checked against the one kernel's.
"""

from __future__ import annotations

from default_schedule import arguments, write_table


def _timed(tensors, inputs, target):
    """(fastest seconds, output) of the TE kernel computing tensors[-1] from `inputs`."""
    import numpy as np
    import tvm
    from tvm import te

    from korch_tvm.backend.schedule_variants import default_schedules

    mod = tvm.IRModule({"main": te.create_prim_func(list(tensors))})
    device = tvm.cpu()
    best, output = float("inf"), None
    for schedule in default_schedules(mod, target):
        library = tvm.tirx.build(schedule.mod, target=target)
        args = [tvm.runtime.tensor(a, device) for a in inputs]
        args.append(tvm.runtime.empty([int(d) for d in tensors[-1].shape], "float32", device))
        timer = library.time_evaluator("main", device, number=3, repeat=3)
        best = min(best, min(timer(*args).results))
        output = args[-1].numpy() if output is None else output
        np.testing.assert_allclose(args[-1].numpy(), output, rtol=1e-6, atol=1e-6)
    return best, output


def _pass(x, axis: int, size_in: int, size_out: int):
    """TE of one pass as the lowering's primitives compute it, with its tables as inputs."""
    from tvm import te, topi

    from korch_tvm.lowering.separable_resize import interpolation_tables

    tables = interpolation_tables(size_in, size_out, "half_pixel")
    shape = [1] * len(x.shape)
    shape[axis] = size_out
    placeholders = [te.placeholder((size_out,), "int32", name="first"),
                    te.placeholder((size_out,), "int32", name="second"),
                    te.placeholder(shape, name="first_weight"),
                    te.placeholder(shape, name="second_weight")]
    out = topi.add(topi.multiply(topi.take(x, placeholders[0], axis, mode="clip"),
                                 placeholders[2]),
                   topi.multiply(topi.take(x, placeholders[1], axis, mode="clip"),
                                 placeholders[3]))
    values = [tables[0], tables[1], tables[2].reshape(shape), tables[3].reshape(shape)]
    return placeholders, values, out


def case(size_in: int, layout: str, target) -> tuple[float, float, float]:
    """(one kernel, width pass, height pass) seconds for a 21-class size_in^2 -> 256^2 map."""
    import numpy as np
    from tvm import te, topi

    shape = (1, 21, size_in, size_in) if layout == "NCHW" else (1, size_in, size_in, 21)
    h_axis, w_axis = layout.index("H"), layout.index("W")
    data = np.random.default_rng(0).standard_normal(shape).astype("float32")
    x = te.placeholder(shape, name="x")
    to_nchw = (lambda t: t) if layout == "NCHW" else (lambda t: topi.transpose(t, (0, 3, 1, 2)))
    whole = to_nchw(topi.image.resize2d(x, (0.0, 0.0, 1.0, 1.0), (256, 256), layout=layout,
                                        method="linear",
                                        coordinate_transformation_mode="half_pixel"))
    one, reference = _timed([x, whole], [data], target)
    tables, values, wide = _pass(x, w_axis, size_in, 256)
    width, wide_value = _timed([x, *tables, wide], [data, *values], target)
    narrow = te.placeholder(wide_value.shape, name="wide")
    tables, values, tall = _pass(narrow, h_axis, size_in, 256)
    height, output = _timed([narrow, *tables, to_nchw(tall)], [wide_value, *values], target)
    np.testing.assert_allclose(output, reference, rtol=1e-5, atol=1e-5)
    return one, width, height


def main(argv=None) -> int:
    args = arguments(__doc__, argv)

    from korch_tvm.backend.target import parse_target

    target = parse_target({"kind": "llvm", "num-cores": args.threads})
    lines = [f"{'resize (21 channels, half_pixel)':44s} {'one kernel ms':>13s} "
             f"{'width ms':>9s} {'height ms':>10s} {'speed-up':>8s}   "
             f"(fastest form of each; target {target}, {args.threads} threads)"]
    for size_in, layout, model in ((16, "NHWC", "DeepLabv3"), (32, "NHWC", "LR-ASPP"),
                                   (16, "NCHW", "DeepLabv3")):
        one, width, height = case(size_in, layout, target)
        name = f"{size_in}x{size_in} -> 256x256 {layout}{' + to NCHW' if layout == 'NHWC' else ''}"
        lines.append(f"{name + f' ({model})':44s} {one * 1e3:13.3f} {width * 1e3:9.3f} "
                     f"{height * 1e3:10.3f} {one / (width + height):7.2f}x")
        print(lines[-1], flush=True)
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
