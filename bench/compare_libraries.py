"""Time compiled libraries of one model side by side with ONNX Runtime and OpenVINO.

    .venv/bin/python bench/compare_libraries.py MODEL.onnx OUT.json NAME=LIB.so [NAME=LIB.so ...]

Why: two zoo passes run hours apart on a shared host whose speed drifts (ONNX Runtime's own
time for one model doubled between passes), so comparing their ratios mixes the code's change
with the host's. This loads the libraries two passes kept (say the last pass's Korch library
and this one's) into one process and times them interleaved, round by round, with ONNX Runtime
and OpenVINO on the same seeded inputs (`korch-tvm bench`'s protocol and arithmetic); each
library is first checked against ONNX Runtime. Prints and writes every pair's paired ratio
(`A_vs_B`: how many times faster A runs than B, with the p10-p90 of the per-round ratios).
"""

from __future__ import annotations

import json
import sys

from korch_tvm.backend.target import configure_threads
from korch_tvm.backend.verify import compare
from korch_tvm.tools.bench_stats import TimingProtocol, paired_ratio, summarize_samples
from korch_tvm.tools.bench_stats import time_interleaved
from korch_tvm.tools.engines import engine_runners, model_inputs


def main(argv: list[str]) -> int:
    if len(argv) < 3 or any("=" not in pair for pair in argv[2:]):
        raise SystemExit(__doc__.strip().splitlines()[2].strip())
    model, out = argv[0], argv[1]
    libraries = dict(pair.split("=", 1) for pair in argv[2:])
    threads = configure_threads(None)
    inputs = model_inputs(model)
    runners = engine_runners(model, libraries, inputs, threads, with_openvino=True)
    expected = runners["onnxruntime"]()
    checks = {name: compare(_flatten(runners[name]()), list(expected), "onnxruntime",
                            None).as_dict() for name in libraries}
    samples = time_interleaved(runners, TimingProtocol(repeat=20))
    names = list(runners)
    result = {"model": model, "threads": threads, "libraries": libraries,
              "verification": checks,
              "latency_ms": {name: summarize_samples([s * 1e3 for s in samples[name]])
                             for name in names},
              "ratios": {f"{a}_vs_{b}": paired_ratio(samples[b], samples[a])
                         for i, a in enumerate(names) for b in names[i + 1:]}}
    with open(out, "w") as handle:
        json.dump(result, handle, indent=1)
    for name in names:
        print(f"{name:>12} {result['latency_ms'][name]['median']:8.2f} ms")
    for pair, ratio in result["ratios"].items():
        print(f"{pair:>28} {ratio['ratio']:.2f}x ({ratio['p10']:.2f}-{ratio['p90']:.2f})")
    return 0 if all(check["passed"] for check in checks.values()) else 1


def _flatten(result) -> list:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [array for item in result for array in _flatten(item)]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
