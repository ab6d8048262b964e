"""Export the zoo to ONNX, one row per model in a manifest, failures included with their reason.

    bench/.venv-models/bin/python -m bench.zoo.export                  # -> bench/zoo/models/
    bench/.venv-models/bin/python -m bench.zoo.export --only resnet18,bert_2layer
    bench/.venv-models/bin/python -m bench.zoo.export --list

Run from the repository root in the benchmark-model venv (`make -C bench zoo-models`). Every
export: seeded random weights, all-zero/all-one tensors perturbed (bench/export_models.py says
why), torch.onnx.export(dynamo=False, opset_version=17), batch 1, static shapes, then checked
with onnx.checker and against ONNX Runtime. The manifest (models/manifest.json) is what
bench/run_zoo.py reads, so a model that failed to export still gets its row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/, for export_models' helpers
sys.path.insert(0, str(HERE.parent.parent))  # the repository root, for bench.zoo

import export_models  # noqa: E402  (sets TIMM_FUSED_ATTN before timm is imported)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.zoo import builders  # noqa: E402
from bench.zoo.registry import BY_NAME, ZOO  # noqa: E402

OPSET = export_models.OPSET
VOCAB_SAMPLE = 1000  # token ids for the export check are drawn below this (every vocab is larger)


def example_inputs(entry, seed: int = export_models.SEED + 2) -> list[torch.Tensor]:
    """Seeded inputs: normal images; token ids below VOCAB_SAMPLE; a mask with padding at the
    end (its last quarter zero), so the masked path of attention is exercised."""
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for spec in entry.inputs:
        if spec.dtype == "float32":
            tensors.append(torch.randn(*spec.shape, generator=gen))
        elif spec.name == "attention_mask":
            mask = torch.ones(spec.shape, dtype=torch.int64)
            mask[..., spec.shape[-1] * 3 // 4:] = 0
            tensors.append(mask)
        else:
            tensors.append(torch.randint(0, VOCAB_SAMPLE, spec.shape, generator=gen))
    return tensors


def export_one(entry, out_dir: Path, threads: int) -> dict:
    """Export one entry and check it; the manifest row (raises on any failure)."""
    import onnx
    import onnxruntime as ort

    started = time.time()
    export_models.seed_all()
    model = builders.build(entry)
    perturbed = export_models.perturb_trivial_tensors(model)
    inputs = example_inputs(entry)
    path = out_dir / f"{entry.name}.onnx"
    with torch.no_grad():
        reference = model(*inputs)
        torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, opset_version=OPSET,
                          do_constant_folding=True, input_names=[i.name for i in entry.inputs],
                          output_names=list(entry.outputs))
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: t.numpy() for i, t in zip(entry.inputs, inputs)})
    references = [reference] if isinstance(reference, torch.Tensor) else list(reference)
    errors = [float(np.max(np.abs(g - r.numpy()))) for g, r in zip(got, references)]
    return {"name": entry.name, "status": "ok", "file": path.name,
            "size_mb": round(path.stat().st_size / 2 ** 20, 2),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:12],
            "nodes": len(proto.graph.node),
            "ops": dict(Counter(node.op_type for node in proto.graph.node).most_common()),
            "ort_max_abs_error": errors, "output_shapes": [list(r.shape) for r in references],
            "perturbed_tensors": perturbed, "seconds": round(time.time() - started, 1)}


def describe(entry) -> dict:
    return {"category": entry.category, "library": entry.library, "arch": entry.arch,
            "inputs": [[i.name, list(i.shape), i.dtype] for i in entry.inputs],
            "outputs": list(entry.outputs), "note": entry.note}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "models")
    parser.add_argument("--only", default=None, help="comma-separated zoo model names")
    parser.add_argument("--threads", type=int, default=2, help="torch and ORT threads")
    parser.add_argument("--list", action="store_true", help="list the zoo and exit")
    args = parser.parse_args(argv)
    if args.list:
        for entry in ZOO:
            print(f"{entry.name:24s} {entry.category:34s} {entry.library}:{entry.arch}")
        return 0
    names = args.only.split(",") if args.only else [entry.name for entry in ZOO]
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        parser.error(f"unknown zoo model(s) {unknown}; see --list")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.setdefault("models", {})
    manifest.update({"torch": torch.__version__, "opset": OPSET, "seed": export_models.SEED})
    for name in names:
        entry = BY_NAME[name]
        try:
            row = export_one(entry, args.out, args.threads)
        except Exception as error:  # a row with its reason, then the next model
            traceback.print_exc()
            row = {"name": name, "status": "export failed",
                   "reason": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
        row.update(describe(entry))
        row["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        manifest["models"][name] = row
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
        print(f"[zoo export] {name}: {row['status']} "
              + (f"{row['nodes']} nodes, {row['size_mb']} MB, ORT error "
                 f"{max(row['ort_max_abs_error']):.2g}, {row['seconds']} s"
                 if row["status"] == "ok" else row["reason"]), flush=True)
    failed = [n for n in names if manifest["models"][n]["status"] != "ok"]
    print(f"[zoo export] {len(names) - len(failed)} of {len(names)} exported; failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
