#!/usr/bin/env python3
"""Export the benchmark models (and the bundled demo models) to ONNX.

Runs in the benchmark-model environment (bench/.venv-models, built by `make -C bench venv`),
never in the project's own venv. Model hubs are not used: every model is built from its library's
own definition with random, seeded weights (latency does not depend on the weight values).

    python bench/export_models.py                 # every benchmark model -> bench/models/
    python bench/export_models.py --only yolov4   # one of them
    python bench/export_models.py --demo          # the committed demo models -> models/
    python bench/export_models.py --list

All exports: torch.onnx.export(dynamo=False, opset_version=17), batch 1, static shapes, and a
check against ONNX Runtime (max abs error of every output against the torch output).
"""
from __future__ import annotations

import os

# timm reads this at import time: explicit MatMul/Softmax instead of a fused attention op.
os.environ["TIMM_FUSED_ATTN"] = "0"

import argparse
import hashlib
import itertools
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SEED = 0
OPSET = 17


class Spec(NamedTuple):
    module: nn.Module
    inputs: tuple  # example inputs (torch tensors), batch 1, static shapes
    input_names: list
    output_names: list
    note: str


# --------------------------------------------------------------------------------------------
# helpers


def seed_all(seed: int = SEED) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)


def perturb_trivial_tensors(model: nn.Module, scale: float = 0.02, seed: int = SEED) -> int:
    """Give all-zero and all-one floating tensors (biases, norm scales, BN running stats) small
    random values. Freshly initialised models have them; simplifiers would delete the Adds/Muls
    they feed as no-ops, which real trained weights never allow. Returns how many were changed."""
    gen = torch.Generator().manual_seed(seed + 1)
    changed = 0
    with torch.no_grad():
        for _, t in itertools.chain(model.named_parameters(), model.named_buffers()):
            if not t.is_floating_point() or t.numel() == 0:
                continue
            if bool(torch.all(t == 0)) or bool(torch.all(t == 1)):
                noise = torch.randn(t.shape, generator=gen, dtype=torch.float32) * scale
                t.add_(noise.to(t.dtype))
                changed += 1
    return changed


def randn(*shape: int, seed: int = SEED + 2) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def _first(out):
    """transformers layers return a tensor or a tuple whose first item is the hidden state."""
    return out[0] if isinstance(out, (tuple, list)) else out


# --------------------------------------------------------------------------------------------
# benchmark models


class SegformerLogits(nn.Module):
    """A SegFormer whose forward returns its logits tensor, not the output object: the ONNX
    export gets one static, named output (the zoo's segformer builder uses it too)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        return self.model(pixel_values=pixel_values).logits


def build_segformer_b0() -> Spec:
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = SegformerConfig(num_labels=150)  # the default config is MiT-b0
    config._attn_implementation = "eager"
    model = SegformerForSemanticSegmentation(config)
    model.config._attn_implementation = "eager"
    return Spec(SegformerLogits(model), (randn(1, 3, 512, 512),), ["pixel_values"], ["logits"],
                "transformers SegformerForSemanticSegmentation, MiT-b0, 150 labels, 512x512")


def build_yolox_nano() -> Spec:
    from yolox.exp import get_exp

    exp = get_exp(None, "yolox-nano")
    model = exp.get_model()
    model.head.decode_in_inference = False  # as yolox's own tools/export_onnx.py does
    return Spec(model, (randn(1, 3, 416, 416),), ["images"], ["output"],
                "yolox 0.3.0 yolox-nano, head.decode_in_inference=False, 416x416")


YOLOV4_SIZE = 416


def build_yolov4() -> Spec:
    import yolov4  # wf-pytorch-yolo-v4
    from yolov4.tool.darknet2pytorch import Darknet

    cfg = Path(yolov4.__file__).resolve().parent / "cfg" / "yolov4.cfg"
    model = Darknet(str(cfg), inference=True)  # fully convolutional: any multiple of 32 works
    return Spec(model, (randn(1, 3, YOLOV4_SIZE, YOLOV4_SIZE),), ["input"], ["boxes", "confs"],
                f"wf-pytorch-yolo-v4 0.2.2 Darknet(cfg/yolov4.cfg), inference mode (box decode "
                f"included, as its darknet2onnx), {YOLOV4_SIZE}x{YOLOV4_SIZE}")


def build_efficientvit_b0() -> Spec:
    import timm

    model = timm.create_model("efficientvit_b0", pretrained=False)
    return Spec(model, (randn(1, 3, 224, 224),), ["input"], ["logits"],
                "timm efficientvit_b0 (MIT EfficientViT), TIMM_FUSED_ATTN=0, 224x224")


class ConvLayer(nn.Module):
    """Reflection padding then a convolution (fast-neural-style)."""

    def __init__(self, cin, cout, kernel, stride, upsample=None):
        super().__init__()
        self.upsample = upsample
        self.pad = nn.ReflectionPad2d(kernel // 2)
        self.conv = nn.Conv2d(cin, cout, kernel, stride)

    def forward(self, x):
        if self.upsample:
            x = F.interpolate(x, scale_factor=self.upsample, mode="nearest")
        return self.conv(self.pad(x))


class ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = ConvLayer(channels, channels, 3, 1)
        self.in1 = nn.InstanceNorm2d(channels, affine=True)
        self.conv2 = ConvLayer(channels, channels, 3, 1)
        self.in2 = nn.InstanceNorm2d(channels, affine=True)

    def forward(self, x):
        y = F.relu(self.in1(self.conv1(x)))
        y = self.in2(self.conv2(y))
        return x + y


class TransformerNet(nn.Module):
    """The fast neural style network (Johnson et al. 2016, as in the public 'candy' model):
    9x9 conv, two stride-2 3x3 convs, five 128-channel residual blocks, two nearest-x2 upsample
    + 3x3 convs, and a 9x9 conv back to RGB; affine InstanceNorm and ReLU after every conv but
    the last; reflection padding everywhere."""

    def __init__(self):
        super().__init__()
        self.conv1 = ConvLayer(3, 32, 9, 1)
        self.in1 = nn.InstanceNorm2d(32, affine=True)
        self.conv2 = ConvLayer(32, 64, 3, 2)
        self.in2 = nn.InstanceNorm2d(64, affine=True)
        self.conv3 = ConvLayer(64, 128, 3, 2)
        self.in3 = nn.InstanceNorm2d(128, affine=True)
        self.res = nn.Sequential(*[ResidualBlock(128) for _ in range(5)])
        self.deconv1 = ConvLayer(128, 64, 3, 1, upsample=2)
        self.in4 = nn.InstanceNorm2d(64, affine=True)
        self.deconv2 = ConvLayer(64, 32, 3, 1, upsample=2)
        self.in5 = nn.InstanceNorm2d(32, affine=True)
        self.deconv3 = ConvLayer(32, 3, 9, 1)

    def forward(self, x):
        y = F.relu(self.in1(self.conv1(x)))
        y = F.relu(self.in2(self.conv2(y)))
        y = F.relu(self.in3(self.conv3(y)))
        y = self.res(y)
        y = F.relu(self.in4(self.deconv1(y)))
        y = F.relu(self.in5(self.deconv2(y)))
        return self.deconv3(y)


def build_candy() -> Spec:
    return Spec(TransformerNet(), (randn(1, 3, 224, 224),), ["input"], ["output"],
                "fast neural style TransformerNet (candy architecture), written here, 224x224")


class BertLayerOnly(nn.Module):
    """One transformers BertLayer on hidden states; no attention mask."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states):
        return _first(self.layer(hidden_states))


def _bert_layer(hidden: int, heads: int, intermediate: int) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=hidden, num_attention_heads=heads,
                        intermediate_size=intermediate, num_hidden_layers=1,
                        attn_implementation="eager")
    config._attn_implementation = "eager"
    bert = BertModel(config, add_pooling_layer=False)  # BERT's own init (normal 0.02)
    return BertLayerOnly(bert.encoder.layer[0])


def build_bert_layer() -> Spec:
    seq, hidden = 128, 768
    return Spec(_bert_layer(hidden, 12, 3072), (randn(1, seq, hidden),), ["hidden_states"],
                ["output"], "transformers BertLayer (BertModel, 1 layer), BERT-base sizes: "
                "hidden 768, 12 heads, intermediate 3072, seq 128, eager attention, no mask")


# --------------------------------------------------------------------------------------------
# demo models (committed in models/)


def build_demo_bert_layer() -> Spec:
    seq, hidden = 64, 256
    return Spec(_bert_layer(hidden, 4, 1024), (randn(1, seq, hidden),), ["hidden_states"],
                ["output"], "transformers BertLayer (BertModel, 1 layer): hidden 256, 4 heads, "
                "intermediate 1024, seq 64, eager attention, no mask")


SEGFORMER_GRID = 64  # tokens per side


class SegformerBlock(nn.Module):
    def __init__(self, layer, height, width):
        super().__init__()
        self.layer = layer
        self.height = height
        self.width = width

    def forward(self, hidden_states):
        return _first(self.layer(hidden_states, self.height, self.width))


def build_demo_segformer_block() -> Spec:
    from transformers import SegformerConfig
    from transformers.models.segformer.modeling_segformer import SegformerLayer

    config = SegformerConfig()  # MiT-b0; stage 1: hidden 32, 1 head, sr_ratio 8, mlp_ratio 4
    config._attn_implementation = "eager"
    layer = SegformerLayer(config, hidden_size=config.hidden_sizes[0],
                           num_attention_heads=config.num_attention_heads[0], drop_path=0.0,
                           sequence_reduction_ratio=config.sr_ratios[0],
                           mlp_ratio=config.mlp_ratios[0])
    g = SEGFORMER_GRID
    return Spec(SegformerBlock(layer, g, g), (randn(1, g * g, config.hidden_sizes[0]),),
                ["hidden_states"], ["output"],
                f"transformers SegformerLayer, MiT-b0 stage 1 (hidden 32, 1 head, sr_ratio 8, "
                f"mlp_ratio 4) on a {g}x{g} token grid")


BENCH: dict[str, Callable[[], Spec]] = {
    "segformer_b0": build_segformer_b0,
    "yolox_nano": build_yolox_nano,
    "yolov4": build_yolov4,
    "efficientvit_b0": build_efficientvit_b0,
    "candy": build_candy,
    "bert_layer": build_bert_layer,
}
DEMO: dict[str, Callable[[], Spec]] = {
    "bert_layer": build_demo_bert_layer,
    "segformer_block": build_demo_segformer_block,
}


# --------------------------------------------------------------------------------------------
# export and check


def export_one(name: str, builder: Callable[[], Spec], out_dir: Path, threads: int) -> dict:
    import onnx
    import onnxruntime as ort

    t0 = time.time()
    seed_all()
    spec = builder()
    model = spec.module.eval()
    changed = perturb_trivial_tensors(model)
    path = out_dir / f"{name}.onnx"
    with torch.no_grad():
        ref = model(*spec.inputs)
        torch.onnx.export(model, spec.inputs, str(path), dynamo=False, opset_version=OPSET,
                          do_constant_folding=True, export_params=True,
                          input_names=spec.input_names, output_names=spec.output_names)
    t_export = time.time() - t0

    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    ops = Counter(n.op_type for n in proto.graph.node)

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {n: t.numpy() for n, t in zip(spec.input_names, spec.inputs)}
    got = sess.run(None, feeds)
    refs = [ref] if isinstance(ref, torch.Tensor) else list(ref)
    errs = [float(np.max(np.abs(g - r.numpy()))) for g, r in zip(got, refs)]
    shapes = {o.name: list(o.shape) for o in sess.get_outputs()}
    ref_shapes = [list(r.shape) for r in refs]

    size = path.stat().st_size
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    row = dict(name=name, path=str(path), size_mb=size / 2**20, nodes=len(proto.graph.node),
               ops=ops, max_abs_err=errs, out_shapes=ref_shapes, changed=changed,
               seconds=time.time() - t0, export_seconds=t_export, sha=digest, note=spec.note)
    ins = ", ".join(f"{n} {list(t.shape)}" for n, t in zip(spec.input_names, spec.inputs))
    print(f"[{name}] {spec.note}\n"
          f"    {path}  {size / 2**20:.2f} MB  sha256 {digest}  {len(proto.graph.node)} nodes, "
          f"{len(ops)} op types  ({changed} all-zero/all-one tensors perturbed)\n"
          f"    inputs: {ins}  outputs: {shapes}\n"
          f"    ORT vs torch max abs error: {', '.join(f'{e:.3g}' for e in errs)}  "
          f"(export {t_export:.1f}s, total {time.time() - t0:.1f}s)", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="export only this model (repeatable)")
    ap.add_argument("--demo", action="store_true",
                    help="export the committed demo models into models/ instead")
    ap.add_argument("--out", type=Path, help="output directory (default bench/models, or "
                    "models/ with --demo)")
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--list", action="store_true", help="list the model names and exit")
    args = ap.parse_args(argv)

    table = DEMO if args.demo else BENCH
    if args.list:
        for k, b in table.items():
            print(k)
        return 0
    names = args.only or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {list(table)}")
    out_dir = args.out or (REPO / "models" if args.demo else HERE / "models")
    if not out_dir.is_absolute():
        out_dir = Path.cwd() / out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)

    print(f"torch {torch.__version__}, opset {OPSET}, seed {SEED}, out {out_dir}", flush=True)
    failed = []
    for name in names:
        try:
            export_one(name, table[name], out_dir, args.threads)
        except Exception as e:  # report and go on with the others
            import traceback

            traceback.print_exc()
            print(f"[{name}] FAILED: {type(e).__name__}: {e}", flush=True)
            failed.append(name)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
