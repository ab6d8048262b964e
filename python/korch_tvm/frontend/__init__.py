"""Stage 1: an ONNX model -> a Relax IRModule (shapes checked, operators traced)."""
