"""korch-tvm bench: stock TVM vs Korch vs ONNX Runtime, side by side (being written)."""


def add_arguments(parser) -> None:
    parser.add_argument("model", help="path to an ONNX model")


def run(args) -> int:
    from .errors import KorchError

    raise KorchError("bench is not available yet")
