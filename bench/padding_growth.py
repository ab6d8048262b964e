"""Time the profiler's forms of padded convolutions with the padding inlined or kept, side by side.

    .venv/bin/python bench/padding_growth.py [--threads 2] [--rounds 5] [--growth 1.25]
        [--out FILE] [SHAPE ...]

A SHAPE is as in bench/tile_shapes.py: SIZExCINxCOUT[xKxSTRIDE], an NHWC convolution + bias +
ReLU (default: ResNet's 3x3 convolutions on maps of 14 and 7, whose padding grows them by 31 %
and 65 %, and one on 56). Each kernel gets every form the profiler measures
(`named_default_schedules`) twice: with `kept_padding.MAX_PADDED_GROWTH` at `--growth` (the
padding of these maps inlined into the reduction, as before) and at the rule's value now. Every
form is built once and timed as the profiler times a kernel, from the L3 (private caches
evicted) and cold (operands flushed), in `--rounds` rounds taking the forms in turn; printed per
kernel and state: the fastest form each way (median of its rounds' medians of 15 calls, ms) and
the ratio. Each form's output is checked against the first form's.
"""

from __future__ import annotations

import argparse
import os
import statistics

SHAPES = ["14x256x256", "7x512x512", "14x128x256x3x2", "28x256x512x3x2", "56x64x64"]


def forms(mod, target, growth: float) -> dict:
    """form name -> schedule, with padding kept up to `growth`."""
    from korch_tvm.backend import kept_padding
    from korch_tvm.backend.schedule_variants import named_default_schedules

    now, kept_padding.MAX_PADDED_GROWTH = kept_padding.MAX_PADDED_GROWTH, growth
    try:
        return dict(named_default_schedules(mod, target))
    finally:
        kept_padding.MAX_PADDED_GROWTH = now


def built(mod, target):
    """(library, arguments, output of the unpacked build on fixed inputs)."""
    import numpy as np
    import tvm
    from tile_shapes import packed_build
    from tvm.s_tir import meta_schedule as ms

    library, args = packed_build(mod, target)
    rng = np.random.default_rng(1)  # the same inputs for every form
    whole = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in info.as_json()[2]])
                                .astype("float32")) for info in
             ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=False)]
    tvm.compile(mod, target=target)(*whole)
    return library, args, whole[-1].numpy()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=SHAPES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--growth", type=float, default=1.25)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)

    import numpy as np
    import tvm
    from default_schedule import write_table
    from tile_shapes import kernel

    from korch_tvm.backend import kept_padding
    from korch_tvm.backend.target import parse_target
    from korch_tvm.costing.cache_state import FLUSH_FUNCTION, register_evict

    target = parse_target("llvm")
    states = {"l3": register_evict(args.threads), "cold": FLUSH_FUNCTION}
    ways = {f"growth {args.growth}": args.growth,
            f"growth {kept_padding.MAX_PADDED_GROWTH}": kept_padding.MAX_PADDED_GROWTH}
    lines = [f"target {target}; {args.threads} threads; fastest form each way, ms per call "
             f"(median of {args.rounds} rounds), and old / new"]
    for text in args.shapes:
        mod, name, flops = kernel(text)
        libraries, reference, worst = {}, None, 0.0
        for way, growth in ways.items():
            for form, schedule in forms(mod, target, growth).items():
                library, call_args, output = built(schedule.mod, target)
                reference = output if reference is None else reference
                worst = max(worst, float(np.abs(output - reference).max()
                                         / np.abs(reference).max()))
                libraries[(way, form)] = (library, call_args)
        for state, step in states.items():
            times = {key: [] for key in libraries}
            for _ in range(args.rounds):
                for key, (library, call_args) in libraries.items():
                    timer = library.mod.time_evaluator("main", tvm.cpu(), number=1, repeat=15,
                                                       f_preproc=step)
                    times[key].append(statistics.median(timer(*call_args).results))
            best = {way: min(((statistics.median(t), form) for (w, form), t in times.items()
                              if w == way)) for way in ways}
            (old, _), (new, _) = best.values()
            lines.append(f"{name} [{state}]: " + " | ".join(
                f"{way}: {form} {seconds * 1e3:.3f} ({flops / seconds / 1e9:.0f} GFLOP/s)"
                for way, (seconds, form) in best.items())
                + f" | old/new {old / new:.2f}x; max rel. error {worst:.1e}")
            print(lines[-1], flush=True)
    write_table(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
