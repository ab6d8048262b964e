"""Time kernels that write their input transposed, in the output's loop order and with the loop
over the input's innermost dimension moved inside (backend/transposed_reads.py).

    .venv/bin/python bench/transposed_reads.py [--threads 2]
        [--out bench/results/transposed-reads.txt]

Each kernel is built from TOPI and scheduled by every form `default_schedules` measures;
"output order" is the rule as it was before (restored by stubbing out `transposed_loop`),
"moved" the rule now. Printed per kernel: the fastest form's time each way (best of 3 x 3 warm
calls) and their ratio; every form's output is checked against the unscheduled kernel.
"""

from __future__ import annotations

from default_schedule import arguments, fastest_with_and_without, write_table


def kernels() -> dict:
    """name -> `{"main": PrimFunc}` of one layout-changing kernel, shapes from the zoo."""
    import tvm
    from tvm import te, topi

    def module(*tensors):
        func = te.create_prim_func(list(tensors)).with_attr("global_symbol", "main")
        return tvm.IRModule({"main": func})

    def transpose(shape, axes):
        x = te.placeholder(shape, name="x")
        return module(x, topi.transpose(x, axes))

    def concat_to_nchw(size, channels, parts):
        xs = [te.placeholder((1, size, size, channels), name=f"x{i}") for i in range(parts)]
        return module(*xs, topi.transpose(topi.concatenate(xs, axis=3), (0, 3, 1, 2)))

    def concat_to_nhwc(size, channels, parts):
        """SegFormer's head in an NHWC plan: one part as tokens, the resized ones in NCHW."""
        tokens = te.placeholder((1, size * size, channels), name="tokens")
        xs = [te.placeholder((1, channels, size, size), name=f"x{i}") for i in range(parts - 1)]
        nhwc = [topi.reshape(tokens, (1, size, size, channels))]
        nhwc += [topi.transpose(x, (0, 2, 3, 1)) for x in xs]
        return module(tokens, *xs, topi.concatenate(nhwc, axis=3))

    return {
        "NHWC -> NCHW 256x256x21 (segmentation output)": transpose((1, 256, 256, 21),
                                                                   (0, 3, 1, 2)),
        "NHWC -> NCHW 56x56x64": transpose((1, 56, 56, 64), (0, 3, 1, 2)),
        "NCHW -> NHWC 64x56x56": transpose((1, 64, 56, 56), (0, 2, 3, 1)),
        "NCHW -> NHWC 1024x64x64": transpose((1, 1024, 64, 64), (0, 2, 3, 1)),
        "NCHW -> NHWC 3x224x224 (model input)": transpose((1, 3, 224, 224), (0, 2, 3, 1)),
        "(1,128,12,64) -> (1,12,64,128) (attention K^T)": transpose((1, 128, 12, 64),
                                                                    (0, 2, 3, 1)),
        "4 x 64x64x256 concat -> NCHW": concat_to_nchw(64, 256, 4),
        "4 x 64x64x256 concat -> NHWC (SegFormer head)": concat_to_nhwc(64, 256, 4),
    }


def main(argv=None) -> int:
    args = arguments(__doc__, argv)

    from korch_tvm.backend.target import parse_target

    target = parse_target({"kind": "llvm", "num-cores": args.threads})
    lines = [f"{'kernel':48s} {'output order ms':>15s} {'moved ms':>9s} {'speed-up':>8s}   "
             f"(fastest form of each; target {target}, {args.threads} threads)"]
    for name, mod in kernels().items():
        before, after = fastest_with_and_without(
            mod, target, "korch_tvm.backend.cpu_schedule.transposed_loop", None)
        lines.append(f"{name:48s} {before * 1e3:15.3f} {after * 1e3:9.3f} {before / after:7.2f}x")
        print(lines[-1], flush=True)
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
