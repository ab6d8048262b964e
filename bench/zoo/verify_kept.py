"""Verify libraries a `korch-tvm bench --no-warm --reports-dir DIR` run kept, against ONNX Runtime.

    python bench/zoo/verify_kept.py MODEL.onnx OUT.json NAME=LIBRARY.so [NAME=LIBRARY.so ...]

Why: `korch-tvm bench` verifies only its warm compiles, so a zoo pass that skips them (to fit a
deadline) would time libraries nobody checked. This checks the very libraries that were timed:
each is loaded in this fresh process (`tvm.runtime.load_module`, as a user would), run once on
the bench's seeded inputs, and compared with ONNX Runtime (all graph optimisations off) by the
project's own `backend.verify.compare` at each output dtype's default tolerance. Writes
{name: verification} to OUT.json; exit 1 when any library fails or cannot run.
"""

from __future__ import annotations

import json
import sys


def verify(model: str, library: str, inputs: dict, expected: list) -> dict:
    """One library's comparison with `expected` (ONNX Runtime's outputs on `inputs`)."""
    import tvm
    from tvm import relax

    from korch_tvm.backend.verify import compare

    machine = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu(0))
    result = machine["main"](*[tvm.runtime.tensor(x, tvm.cpu(0)) for x in inputs.values()])
    return compare(_flatten(result), expected, "onnxruntime", None).as_dict()


def _flatten(result) -> list:
    if hasattr(result, "numpy"):
        return [result.numpy()]
    return [array for item in result for array in _flatten(item)]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or any("=" not in pair for pair in argv[2:]):
        raise SystemExit(__doc__.strip().splitlines()[2].strip())
    model, out = argv[0], argv[1]
    from korch_tvm.backend.verify import onnxruntime_outputs
    from korch_tvm.frontend.onnx_import import load_onnx
    from korch_tvm.tools.engines import model_inputs

    inputs = model_inputs(model)
    expected = onnxruntime_outputs(load_onnx(model), inputs)
    if expected is None:
        raise SystemExit("verify_kept: onnxruntime is not installed")
    results, ok = {}, True
    for pair in argv[2:]:
        name, library = pair.split("=", 1)
        try:
            results[name] = verify(model, library, inputs, expected)
        except Exception as error:  # noqa: BLE001 - a library that cannot run is a failed check
            results[name] = {"passed": False, "error": f"{type(error).__name__}: {error}"}
        ok = ok and bool(results[name].get("passed"))
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    print(json.dumps(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
