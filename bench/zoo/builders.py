"""Build each zoo architecture from its library's own definition, random weights, eval mode.

Runs only in the benchmark-model venv (bench/.venv-models). Each builder takes the registry
entry and returns a torch module whose forward takes the entry's inputs in order and returns
its outputs in order (tensors, never dicts), so the ONNX export has static, named outputs.
"""

from __future__ import annotations

import os

# timm reads this at import time: explicit MatMul/Softmax instead of a fused attention op.
os.environ["TIMM_FUSED_ATTN"] = "0"

import torch.nn as nn  # noqa: E402


class _Select(nn.Module):
    """Call `model` and return the named entries of the dict (or attributes) it returns."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...], **call_kwargs):
        super().__init__()
        self.model = model
        self.keys = keys
        self.call_kwargs = call_kwargs

    def forward(self, *inputs):
        out = self.model(*inputs, **self.call_kwargs)
        picked = [out[key] if isinstance(out, dict) else getattr(out, key) for key in self.keys]
        return picked[0] if len(picked) == 1 else tuple(picked)


def torchvision_classifier(entry) -> nn.Module:
    import torchvision

    return getattr(torchvision.models, entry.arch)(weights=None)


def torchvision_segmentation(entry) -> nn.Module:
    from torchvision.models import segmentation

    builder = getattr(segmentation, entry.arch)
    extra = {"aux_loss": False} if "deeplab" in entry.arch else {}
    model = builder(weights=None, weights_backbone=None, num_classes=21, **extra)
    return _Select(model, entry.outputs)


class _DetectorHead(nn.Module):
    """A torchvision detector's backbone and head only: the box-regression and class maps
    before anchor decoding and NMS, which are data-dependent and not what a compiler tunes."""

    def __init__(self, detector):
        super().__init__()
        self.backbone = detector.backbone
        self.head = detector.head

    def forward(self, images):
        features = list(self.backbone(images).values())
        out = self.head(features)
        return out["bbox_regression"], out["cls_logits"]


def ssdlite_head(entry) -> nn.Module:
    from torchvision.models import detection

    detector = getattr(detection, entry.arch)(weights=None, weights_backbone=None)
    return _DetectorHead(detector)


def timm_model(entry) -> nn.Module:
    import timm

    return timm.create_model(entry.arch, pretrained=False)


def _eager(config):
    config._attn_implementation = "eager"
    return config


def bert_encoder(entry) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = _eager(BertConfig(num_hidden_layers=2, attn_implementation="eager"))
    return _Select(BertModel(config, add_pooling_layer=False), entry.outputs)


def distilbert_encoder(entry) -> nn.Module:
    from transformers import DistilBertConfig, DistilBertModel

    config = _eager(DistilBertConfig(n_layers=2, attn_implementation="eager"))
    return _Select(DistilBertModel(config), entry.outputs)


def albert_encoder(entry) -> nn.Module:
    from transformers import AlbertConfig, AlbertModel

    config = _eager(AlbertConfig(hidden_size=768, num_attention_heads=12,
                                 intermediate_size=3072, num_hidden_layers=2,
                                 attn_implementation="eager"))
    return _Select(AlbertModel(config, add_pooling_layer=False), entry.outputs)


def segformer(entry) -> nn.Module:
    from export_models import SegformerLogits  # bench/, on the path bench/zoo/export.py sets
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    config = _eager(SegformerConfig(num_labels=150))  # the default config is MiT-b0
    model = SegformerForSemanticSegmentation(config)
    model.config._attn_implementation = "eager"
    return SegformerLogits(model)


def build(entry) -> nn.Module:
    """The eval-mode module for a registry entry (its `builder` names a function here)."""
    builder = globals().get(entry.builder)
    assert callable(builder) and not entry.builder.startswith("_"), (
        f"zoo entry {entry.name}: no builder {entry.builder!r} in bench/zoo/builders.py")
    return builder(entry).eval()
