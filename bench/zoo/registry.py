"""The zoo's table of architectures: what each model is, where it comes from, what it is fed.

Pure data (no torch import), so the project's venv can read it (bench/run_zoo.py) while only
the benchmark-model venv (bench/.venv-models) can build the models (bench/zoo/export.py).
Sizes are chosen so a 0-trial compile stays short on a 2-core machine: tiny/small variants at
224x224 or less, text encoders cut to two layers at sequence length 128.
"""

from __future__ import annotations

from typing import NamedTuple


class Input(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" (standard normal) or "int64" (token ids / attention mask)


class ZooModel(NamedTuple):
    name: str
    category: str
    library: str    # which library's definition: torchvision, timm, transformers
    builder: str    # the function in bench/zoo/builders.py that returns the torch module
    arch: str       # the architecture name in that library
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    note: str = ""


def image(size: int) -> tuple[Input, ...]:
    return (Input("input", (1, 3, size, size), "float32"),)


TOKENS = (Input("input_ids", (1, 128), "int64"), Input("attention_mask", (1, 128), "int64"))

CLASSIC = "classic CNN"
DEPTHWISE = "depthwise / inverted-residual CNN"
CONVNEXT = "ConvNeXt / MetaFormer blocks"
VIT = "ViT / DeiT attention"
WINDOWED = "windowed attention"
HYBRID = "hybrid / efficient ViT"
TEXT = "BERT-style encoder"
DETECTION = "detection head"
SEGMENTATION = "segmentation head"

ZOO: tuple[ZooModel, ...] = (
    ZooModel("resnet18", CLASSIC, "torchvision", "torchvision_classifier", "resnet18",
             image(224), ("logits",)),
    ZooModel("resnet50", CLASSIC, "torchvision", "torchvision_classifier", "resnet50",
             image(224), ("logits",)),
    ZooModel("squeezenet1_1", CLASSIC, "torchvision", "torchvision_classifier", "squeezenet1_1",
             image(224), ("logits",)),
    ZooModel("densenet121", CLASSIC, "torchvision", "torchvision_classifier", "densenet121",
             image(160), ("logits",), "160x160 to keep the 0-trial compile short"),
    ZooModel("mobilenet_v2", DEPTHWISE, "torchvision", "torchvision_classifier", "mobilenet_v2",
             image(224), ("logits",)),
    ZooModel("mobilenet_v3_small", DEPTHWISE, "torchvision", "torchvision_classifier",
             "mobilenet_v3_small", image(224), ("logits",)),
    ZooModel("efficientnet_b0", DEPTHWISE, "torchvision", "torchvision_classifier",
             "efficientnet_b0", image(224), ("logits",)),
    ZooModel("shufflenet_v2_x1_0", DEPTHWISE, "torchvision", "torchvision_classifier",
             "shufflenet_v2_x1_0", image(224), ("logits",)),
    ZooModel("regnet_y_400mf", DEPTHWISE, "torchvision", "torchvision_classifier",
             "regnet_y_400mf", image(224), ("logits",), "grouped convs + squeeze-excitation"),
    ZooModel("convnext_atto", CONVNEXT, "timm", "timm_model", "convnext_atto", image(224),
             ("logits",)),
    ZooModel("poolformer_s12", CONVNEXT, "timm", "timm_model", "poolformer_s12", image(224),
             ("logits",)),
    ZooModel("deit_tiny", VIT, "timm", "timm_model", "deit_tiny_patch16_224", image(224),
             ("logits",)),
    ZooModel("vit_small_patch32", VIT, "timm", "timm_model", "vit_small_patch32_224",
             image(224), ("logits",), "49 patch tokens + class token"),
    ZooModel("swin_tiny", WINDOWED, "timm", "timm_model", "swin_tiny_patch4_window7_224",
             image(224), ("logits",)),
    ZooModel("levit_128s", HYBRID, "timm", "timm_model", "levit_128s", image(224),
             ("logits",)),
    ZooModel("mobilevit_xxs", HYBRID, "timm", "timm_model", "mobilevit_xxs", image(256),
             ("logits",), "MobileViT's own resolution, 256x256"),
    ZooModel("efficientvit_m0", HYBRID, "timm", "timm_model", "efficientvit_m0", image(224),
             ("logits",), "Microsoft's EfficientViT (cascaded group attention); the suite has "
             "MIT's b0"),
    ZooModel("bert_2layer", TEXT, "transformers", "bert_encoder", "bert", TOKENS,
             ("last_hidden_state",), "BertModel, BERT-base width (768, 12 heads, 3072), "
             "2 layers, eager attention, no pooler"),
    ZooModel("distilbert_2layer", TEXT, "transformers", "distilbert_encoder", "distilbert",
             TOKENS, ("last_hidden_state",), "DistilBertModel, 768 wide, 2 layers, eager"),
    ZooModel("albert_2layer", TEXT, "transformers", "albert_encoder", "albert", TOKENS,
             ("last_hidden_state",), "AlbertModel, ALBERT-base (embedding 128, hidden 768, "
             "shared layer run twice), eager, no pooler"),
    ZooModel("ssdlite320_head", DETECTION, "torchvision", "ssdlite_head",
             "ssdlite320_mobilenet_v3_large", image(320), ("bbox_regression", "cls_logits"),
             "backbone + SSDLite head, raw box/class maps (no anchor decode, no NMS)"),
    ZooModel("lraspp_mobilenet_v3", SEGMENTATION, "torchvision", "torchvision_segmentation",
             "lraspp_mobilenet_v3_large", image(256), ("out",), "256x256, 21 classes"),
    ZooModel("deeplabv3_mobilenet_v3", SEGMENTATION, "torchvision", "torchvision_segmentation",
             "deeplabv3_mobilenet_v3_large", image(256), ("out",),
             "dilated convs + ASPP, 256x256, 21 classes, no aux head"),
    ZooModel("segformer_b0_256", SEGMENTATION, "transformers", "segformer", "segformer",
             image(256), ("logits",), "MiT-b0, 150 labels, 256x256 (the suite has 512x512)"),
)

BY_NAME = {model.name: model for model in ZOO}
assert len(BY_NAME) == len(ZOO), "zoo model names must be unique"
