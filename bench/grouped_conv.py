"""Time the extension's two ways of computing a grouped NHWC convolution side by side.

    .venv/bin/python bench/grouped_conv.py [OUT.json]

Why: im2col + GEMM (`korch_tvm.blas.sconv2d`) runs one GEMM per group, and with RegNet's 8
channels per group each is a handful of columns wide; the direct kernel (`sgconv2d`,
library/conv_grouped.h) was written for those. This times both, interleaved, on RegNetY-400MF's
grouped 3x3 convolutions and on ResNeXt-style widths of 4 and 16 channels per group, each
checked against a numpy reference first. Medians of 7 timed runs of >= 20 calls; 2 threads.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
import tvm

from korch_tvm.backend.target import configure_threads
from korch_tvm.library import build_blas_extension, load_blas_extension

# (H = W of the input, channels, stride, channels per group): 3x3, padding 1, one image
REGNET_Y_400MF = [(112, 48, 2, 8), (56, 104, 2, 8), (28, 104, 1, 8), (28, 208, 2, 8),
                  (14, 208, 1, 8), (14, 440, 2, 8), (7, 440, 1, 8)]
WIDER_GROUPS = [(56, 128, 1, 4), (28, 256, 1, 16)]   # ResNeXt-style; 32 and more: im2col


def reference(x: np.ndarray, w: np.ndarray, stride: int, groups: int) -> np.ndarray:
    """NHWC / HWIO 3x3 convolution, padding 1, as a sum of shifted window products."""
    _, h, _, c = x.shape
    cg, k = w.shape[2], w.shape[3]
    kg, p = k // groups, (h + 2 - 3) // stride + 1
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = np.zeros((1, p, p, k), np.float32)
    for g in range(groups):
        for kr in range(3):
            for ks in range(3):
                window = padded[:, kr:kr + stride * p:stride, ks:ks + stride * p:stride,
                                g * cg:(g + 1) * cg]
                y[..., g * kg:(g + 1) * kg] += window @ w[kr, ks, :, g * kg:(g + 1) * kg]
    return y


def time_shape(h: int, c: int, stride: int, cg: int, rng) -> dict:
    groups, p = c // cg, (h + 2 - 3) // stride + 1
    x = rng.standard_normal((1, h, h, c), dtype=np.float32)
    w = rng.standard_normal((3, 3, cg, c), dtype=np.float32)
    want = reference(x, w, stride, groups)
    row = {"h": h, "c": c, "stride": stride, "per_group": cg,
           "gflop": 2 * p * p * c * cg * 9 / 1e9}
    calls = {}
    for routine in ("sconv2d", "sgconv2d"):
        y = tvm.runtime.tensor(np.zeros((1, p, p, c), np.float32))
        args = (tvm.runtime.tensor(x), tvm.runtime.tensor(w), 1, stride, stride, 1, 1, 1, 1,
                groups, y)
        function = tvm.get_global_func("korch_tvm.blas." + routine)
        function(*args)
        error = float(np.abs(y.numpy() - want).max() / np.abs(want).max())
        assert error <= 1e-5, f"{routine} {row}: relative error {error:.1e}"
        calls[routine] = (function, args)
    samples = {routine: [] for routine in calls}
    for _ in range(7):                      # interleaved: both see the same host
        for routine, (function, args) in calls.items():
            start = time.perf_counter()
            for _ in range(20):
                function(*args)
            samples[routine].append((time.perf_counter() - start) / 20)
    for routine, times in samples.items():
        row[f"{routine}_ms"] = statistics.median(times) * 1e3
    row["speedup"] = row["sconv2d_ms"] / row["sgconv2d_ms"]
    return row


def main(argv: list[str]) -> int:
    configure_threads(2)
    build_blas_extension()
    assert load_blas_extension(), "the BLAS extension did not load"
    rng = np.random.default_rng(0)
    rows = [time_shape(*shape, rng) for shape in REGNET_Y_400MF + WIDER_GROUPS]
    print("H     C  stride  per group   im2col+GEMM ms   direct ms  (GFLOP/s)   speed-up")
    for r in rows:
        print(f"{r['h']:<4}{r['c']:>5}{r['stride']:>6}{r['per_group']:>10}"
              f"{r['sconv2d_ms']:>16.3f}{r['sgconv2d_ms']:>12.3f}"
              f"  ({r['gflop'] / r['sgconv2d_ms'] * 1e3:5.1f}){r['speedup']:>12.2f}x")
    regnet = rows[:len(REGNET_Y_400MF)]
    print(f"RegNetY-400MF's seven shapes, one call each: im2col+GEMM "
          f"{sum(r['sconv2d_ms'] for r in regnet):.3f} ms, direct "
          f"{sum(r['sgconv2d_ms'] for r in regnet):.3f} ms")
    if argv:
        with open(argv[0], "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
