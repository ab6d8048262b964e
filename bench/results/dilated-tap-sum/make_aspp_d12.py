"""Writes DeepLabv3's dilation-12 atrous convolution alone (960 -> 256 channels, 3x3, dilation
and padding 12, on 16x16, bias and ReLU; random weights) to the ONNX file given."""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
weight = numpy_helper.from_array(
    (rng.standard_normal((256, 960, 3, 3)) * 0.02).astype("float32"), "w")
bias = numpy_helper.from_array(rng.standard_normal(256).astype("float32"), "b")
nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], dilations=[12, 12], pads=[12] * 4,
                          kernel_shape=[3, 3]),
         helper.make_node("Relu", ["c"], ["y"])]
graph = helper.make_graph(
    nodes, "aspp_d12", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 960, 16, 16])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 16, 16])], [weight, bias])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
onnx.save(model, sys.argv[1])
