"""Time register-tile shapes the CPU default schedule does not offer, beside the forms it does.

    .venv/bin/python bench/tile_shapes.py [--threads 2] [--registers ISA] [--out FILE] [SHAPE ...]

A SHAPE is SIZExCINxCOUT[xKxSTRIDE], an NHWC convolution + bias + ReLU (default: ResNet-18's
3x3 ones), or mMxKxN, a matmul + bias with a weight of K x N (ViT-S/32's and BERT's: m50x384x1152,
m50x384x1536, m50x1536x384, m128x768x3072). Each kernel is scheduled by
`default_schedule` in the profiler's forms (the rule, packed and plain; wide; vector outer;
pair; vector outer with a pair) and in shapes it does not measure (three or four vectors per
tile row, four rows, vector outer with four vectors), and timed as the profiler times a kernel: weights packed where
the form packs them, the packing left out of the timed code, each call after a flush of its
operands from the caches (median of 15, best of two builds). Whether a new form would pay for
the builds it adds to every cold compile. `--registers avx512` fits the tiles to AVX-512's
registers whatever this CPU has (the rule before backend/tile_shape.py), to compare on an AVX2
host.
"""

from __future__ import annotations

import argparse
import os
import statistics

EXTRA_FORMS = {"r4": {"tile_rows": 4}, "c3": {"columns": 3}, "c4": {"columns": 4},
               "r4c4": {"tile_rows": 4, "columns": 4},
               "r4c2": {"tile_rows": 4, "columns": 2},
               "outer-c4": {"vector_outer": True, "columns": 4}}
RESNET18 = ["56x64x64", "28x128x128", "14x256x256", "7x512x512", "28x128x128x3x2"]


def conv(size, cin, cout, k, stride):
    import tvm
    from tvm import te, topi

    x = te.placeholder((1, size, size, cin), name="x")
    w = te.placeholder((k, k, cin, cout), name="w")
    b = te.placeholder((cout,), name="b")
    y = topi.nn.conv2d_nhwc(x, w, stride, k // 2, 1, out_dtype="float32")
    out = te.compute(y.shape, lambda *i: te.max(y(*i) + b[i[-1]], 0.0), name="out")
    func = te.create_prim_func([x, w, b, out]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func.with_attr("layout_free_buffers", [1])})


def matmul(m, k, n):
    import tvm
    from tvm import te

    a, w, b = (te.placeholder((1, m, k), name="a"), te.placeholder((k, n), name="w"),
               te.placeholder((n,), name="b"))
    r = te.reduce_axis((0, k), "r")
    y = te.compute((1, m, n), lambda z, i, j: te.sum(a[z, i, r] * w[r, j], axis=r), name="mm")
    out = te.compute((1, m, n), lambda z, i, j: y[z, i, j] + b[j], name="out")
    func = te.create_prim_func([a, w, b, out]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func.with_attr("layout_free_buffers", [1, 2])})


def kernel(text: str):
    """(module, name, FLOPs) of a SHAPE argument."""
    if text.startswith("m"):
        m, k, n = (int(v) for v in text[1:].split("x"))
        return matmul(m, k, n), f"matmul {m}x{k}x{n}", 2 * m * k * n
    size, cin, cout, k, stride = ([int(v) for v in text.split("x")] + [3, 1])[:5]
    return (conv(size, cin, cout, k, stride), f"conv {k}x{k}/{stride} {cin}->{cout} @{size}",
            2 * (size // stride) ** 2 * cin * cout * k * k)


def packed_build(mod, target):
    """(library, random arguments): `mod` built with its weight packing left out, as the
    builder leaves it, its weights taken as already packed."""
    import numpy as np
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    infos = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
    library = tvm.compile(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod),
                          target=target)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in info.as_json()[2]])
                               .astype("float32"), tvm.cpu()) for info in infos]
    return library, args


def cold_seconds(mod, target) -> float:
    """Median seconds of 15 cold calls, the weight packing left out as the builder leaves it."""
    import tvm

    library, args = packed_build(mod, target)
    timer = library.mod.time_evaluator("main", tvm.cpu(), number=1, repeat=15,
                                       f_preproc="cache_flush_cpu_non_first_arg")
    return statistics.median(timer(*args).results)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=RESNET18)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--registers", default=None,
                        help="fit tiles to this ISA's registers (avx512, avx2, ...), "
                        "not this CPU's")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    from korch_tvm.backend.cpu_schedule import default_schedule
    from korch_tvm.backend.schedule_variants import TILED_VARIANTS
    from korch_tvm.backend.target import parse_target
    from korch_tvm.backend.tile_shape import REGISTER_FILES, register_file

    target = parse_target("llvm")
    registers = register_file(target)
    if args.registers:
        if args.registers not in REGISTER_FILES:
            parser.error(f"--registers: one of {', '.join(REGISTER_FILES)}")
        registers = REGISTER_FILES[args.registers]
    forms = {"rule": ({}, True), "rule-plain": ({}, False),
             **{name: (options, True) for name, options in {**TILED_VARIANTS,
                                                             **EXTRA_FORMS}.items()}}
    lines = [f"target {target}, tiles fit to {registers}; cold ms per call and GFLOP/s; forms "
             "after 'outer_pair' are not measured by the profiler"]
    for text in args.shapes:
        mod, name, flops = kernel(text)
        cells = []
        for form, (options, pack) in forms.items():
            schedule = default_schedule(mod, target, untiled_fallback=form.startswith("rule"),
                                        pack_weights=pack, registers=registers, **options)
            if schedule is None:
                cells.append(f"{form} -")
                continue
            seconds = min(cold_seconds(schedule.mod, target) for _ in range(2))
            cells.append(f"{form} {seconds * 1e3:.3f}/{flops / seconds / 1e9:.0f}")
        lines.append(f"{name}: " + " | ".join(cells))
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
