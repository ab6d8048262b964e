"""Row reductions (softmax, a layer norm's pieces) under the CPU default schedule, timed.

Prints one line per kernel: the median of 7 runs of 100 calls, and the largest relative error
against float64 numpy. Run it once per python tree to compare two versions of the rule, in
turns, on the same machine:

    PYTHONPATH=OLD/python .venv/bin/python bench/row_reductions.py
    PYTHONPATH=python .venv/bin/python bench/row_reductions.py
"""

from __future__ import annotations

import argparse

import numpy as np
import tvm
from tvm import te, topi

from korch_tvm.backend.cpu_schedule import default_schedule
from korch_tvm.backend.target import configure_threads
from korch_tvm.target_spec import parse_target

KERNELS = [("softmax", (1, 3, 197, 197)), ("softmax", (1, 12, 128, 128)),
           ("softmax", (1, 6, 50, 50)), ("centred", (1, 197, 192)), ("variance", (1, 197, 192)),
           ("centred", (1, 128, 768)), ("variance", (1, 128, 768)), ("centred", (1, 50, 384)),
           ("variance", (1, 50, 384))]


def kernel(kind: str, shape):
    """(the kernel as a module, its float64 reference on an input)."""
    x = te.placeholder(shape, name="x")
    if kind == "softmax":
        exp = topi.fast_exp(topi.subtract(x, topi.max(x, axis=-1, keepdims=True)))
        out = topi.divide(exp, topi.sum(exp, axis=-1, keepdims=True))

        def reference(a):
            e = np.exp(a - a.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)
    elif kind == "centred":
        out = topi.subtract(x, topi.divide(topi.sum(x, axis=-1, keepdims=True), shape[-1]))

        def reference(a):
            return a - a.mean(-1, keepdims=True)
    else:
        out = topi.divide(topi.sum(topi.multiply(x, x), axis=-1, keepdims=True), shape[-1])

        def reference(a):
            return (a * a).mean(-1, keepdims=True)
    func = te.create_prim_func([x, out]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func}), [int(d) for d in out.shape], reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="llvm")
    args = parser.parse_args()
    target = parse_target(args.target)
    configure_threads()
    device = tvm.cpu()
    for kind, shape in KERNELS:
        mod, out_shape, reference = kernel(kind, shape)
        library = tvm.compile(default_schedule(mod, target).mod, target=target)
        data = np.random.default_rng(0).normal(0.0, 3.0, shape).astype("float32")
        out = tvm.runtime.tensor(np.zeros(out_shape, "float32"), device)
        timer = library.mod.time_evaluator("main", device, number=100, repeat=7)
        seconds = np.median(timer(tvm.runtime.tensor(data, device), out).results)
        expected = reference(data.astype(np.float64))
        error = np.abs(out.numpy() - expected).max() / np.abs(expected).max()
        print(f"{kind:9s} {'x'.join(map(str, shape)):14s} {seconds * 1e6:8.1f} us"
              f"  rel err {error:.1e}")


if __name__ == "__main__":
    main()
