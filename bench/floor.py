"""Measure this machine's memory bandwidth and float32 matmul peak (once), for the physical floor.

    .venv/bin/python bench/floor.py --out bench/results/machine.json

* **Bandwidth**: a STREAM-like "scale" kernel, c = 1.0 * a, on float32 arrays of 256 MiB each
  (far above any cache), split over 1..N threads (numpy's ufunc loops release the GIL), counting
  the bytes read and written (2 x 256 MiB per pass; the write-allocate read is not counted, as
  in STREAM). Also a plain copy. The best pass of several is kept.
* **Compute peak**: `bench/peak_fma.c`, compiled here with `-march=native`: every thread runs
  12 independent chains of vector FMAs (AVX-512 where the CPU has it), so only FMA throughput
  bounds it; best of 5 runs, 1..N threads. No matmul can beat it, so the floor uses it (a
  floor that a real kernel beats is no floor: TVM's tuned BERT matmuls ran at ~120 GFLOP/s
  here, above numpy's sgemm). Reported beside it: numpy's BLAS sgemm (OpenBLAS in numpy's
  wheels) on square float32 matrices of 1024..4096, 2 * n^3 FLOPs per call, best of several,
  i.e. the rate a mature library's matmul reaches, and the nominal theoretical peak from the
  clock in /proc/cpuinfo (a turbo clock makes the real one higher).

`OPENBLAS_CORETYPE` / `OPENBLAS_L2_SIZE` may be set on some machines (older OpenBLAS builds
misdetect the CPU); they make a current numpy pick a slower kernel. This script reports them and
which kernel OpenBLAS runs (threadpoolctl, when installed); unset both in the command that runs
it to get the real peak, e.g. `env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/floor.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bandwidth(threads: int, mib: int = 256, repeats: int = 12) -> dict:
    n = mib * 1024 * 1024 // 4
    a = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    c = np.empty_like(a)
    bounds = np.linspace(0, n, threads + 1).astype(int)
    slices = [slice(bounds[i], bounds[i + 1]) for i in range(threads)]
    pool = ThreadPoolExecutor(threads)

    def scale():
        list(pool.map(lambda s: np.multiply(a[s], np.float32(1.0), out=c[s]), slices))

    def copy():
        list(pool.map(lambda s: np.copyto(c[s], a[s]), slices))

    scale()
    results = {}
    for name, fn in (("scale", scale), ("copy", copy)):
        seconds = _best(fn, repeats)
        results[name] = 2 * a.nbytes / seconds
    pool.shutdown()
    return results


def matmul_peak(sizes=(1024, 2048, 3072, 4096), repeats: int = 10) -> dict:
    rates = {}
    for n in sizes:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        np.matmul(a, b)
        seconds = _best(lambda: np.matmul(a, b), repeats)
        rates[n] = 2.0 * n ** 3 / seconds
    return rates


def fma_peak(threads: int, iterations: int = 100_000_000, repeats: int = 5) -> dict:
    """Best FLOP/s of bench/peak_fma.c (chains of vector FMAs, no memory traffic).

    Built here with the system C compiler for this CPU (-march=native); returns None where no
    compiler is available.
    """
    import shutil
    import subprocess
    import tempfile

    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return None
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peak_fma.c")
    with tempfile.TemporaryDirectory() as scratch:
        binary = os.path.join(scratch, "peak_fma")
        subprocess.run([compiler, "-O2", "-march=native", "-pthread", source, "-o", binary],
                       check=True)
        best, lanes = 0.0, None
        for _ in range(repeats):
            out = subprocess.run([binary, str(threads), str(iterations)], check=True,
                                 capture_output=True, text=True).stdout.split()
            lanes, rate = int(out[0]), float(out[2]) * 1e9
            best = max(best, rate)
    return {"flops": best, "vector_lanes": lanes, "threads": threads}


def blas_info() -> list:
    try:
        import threadpoolctl
    except ImportError:
        try:  # numpy's build configuration names the BLAS library, not the kernel it picks
            config = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        except Exception:  # noqa: BLE001 - older numpy
            config = None
        return [{"note": "threadpoolctl not installed; numpy's BLAS kernel not reported",
                 "numpy_blas": config}]
    return [{k: v for k, v in info.items() if k != "filepath"}
            for info in threadpoolctl.threadpool_info()]


def theoretical_peak(cores: int) -> dict | None:
    """Cores x clock x float32 FLOPs per cycle (2 FMA pipes x vector lanes x 2), from /proc."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    mhz = [float(line.split(":")[1]) for line in text.splitlines() if line.startswith("cpu MHz")]
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    if not mhz:
        return None
    # AVX-512 on Zen 4 runs on two 256-bit FMA pipes, as AVX2 does: 2 pipes x 8 lanes x 2.
    lanes = 8 if " avx2" in flags or " avx512f" in flags else 4
    per_cycle = 2 * lanes * 2
    return {"flops": cores * max(mhz) * 1e6 * per_cycle, "mhz": max(mhz),
            "flops_per_cycle_per_core": per_cycle,
            "note": "nominal clock from /proc/cpuinfo; assumes two FMA pipes of 256 bits"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/results/machine.json")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    from korch_tvm.tools.bench import machine_info

    cores = args.threads or len(os.sched_getaffinity(0))
    started = time.perf_counter()
    bw = {threads: bandwidth(threads) for threads in sorted({1, cores})}
    best_bw = max(rate for per in bw.values() for rate in per.values())
    mm = matmul_peak()
    best_mm = max(mm.values())
    fma = {t: fma_peak(t) for t in sorted({1, cores})}
    peak = max([best_mm] + [f["flops"] for f in fma.values() if f])
    result = {
        "machine": machine_info(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "numpy": np.__version__,
        "openblas_env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                                        "OPENBLAS_NUM_THREADS")},
        "blas": blas_info(),
        "bandwidth_bytes_per_s": best_bw,
        "bandwidth_gb_per_s_by_threads": {str(t): {k: round(v / 1e9, 2) for k, v in per.items()}
                                          for t, per in bw.items()},
        "peak_flops": peak,
        "fma_gflops_by_threads": {str(t): (round(f["flops"] / 1e9, 1) if f else None)
                                  for t, f in fma.items()},
        "fma_vector_lanes": next((f["vector_lanes"] for f in fma.values() if f), None),
        "matmul_peak_flops": best_mm,
        "matmul_gflops_by_size": {str(n): round(rate / 1e9, 1) for n, rate in mm.items()},
        "theoretical_peak": theoretical_peak(cores),
        "seconds": round(time.perf_counter() - started, 1),
        "method": "bandwidth: best of STREAM-like scale/copy over 256 MiB float32 arrays, "
                  "1..N threads, bytes read + written; compute peak: best of bench/peak_fma.c "
                  "(12 chains of vector FMAs per thread, N threads) and numpy (OpenBLAS) sgemm "
                  "over n = 1024..4096 (2 n^3 FLOPs); the floor uses the larger",
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
        handle.write("\n")
    print(f"bandwidth {best_bw / 1e9:.1f} GB/s, float32 FMA peak {peak / 1e9:.1f} GFLOP/s "
          f"(numpy sgemm {best_mm / 1e9:.1f}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
