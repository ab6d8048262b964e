"""korch-tvm explain: the Korch plan of a model, without building it (being written)."""


def add_arguments(parser) -> None:
    parser.add_argument("model", help="path to an ONNX model")


def run(args) -> int:
    from .errors import KorchError

    raise KorchError("explain is not available yet")
