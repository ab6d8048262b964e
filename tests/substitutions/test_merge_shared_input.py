"""Matmuls and convolutions sharing an input merged into one, parts sliced apart."""

from substitution_programs import build_main, constant, names

from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.merge_shared_input import (MergeConvolutionsSharingInput,
                                                        MergeMatmulsSharingInput)
from korch_tvm.substitutions.program import R


def _ops(alternative):
    return [b.value.op.name for b in alternative.body.body.blocks[0].bindings]


def test_projections_of_one_input_merge_with_constant_or_parameter_weights():
    main, _ = build_main(
        {"x": (1, 5, 8), "other": (1, 5, 8), "w1": (8, 3), "w2": (8, 5)},
        [("q", lambda v: R.matmul(v["x"], constant((8, 4), seed=1))),
         ("k", lambda v: R.matmul(v["x"], constant((8, 6), seed=2))),
         ("v", lambda v: R.matmul(v["x"], constant((8, 2), seed=3))),
         ("alone", lambda v: R.matmul(v["other"], constant((8, 4), seed=4))),
         ("p1", lambda v: R.matmul(v["other"], v["w1"])),
         ("p2", lambda v: R.matmul(v["other"], v["w2"]))],
        ["q", "k", "v", "alone", "p1", "p2"])
    found = MergeMatmulsSharingInput().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [
        (("x",), ("q", "k", "v")), (("other", "w1", "w2"), ("alone", "p1", "p2"))]
    assert _ops(found[0]) == ["relax.matmul"] + ["relax.strided_slice"] * 3
    assert _ops(found[1]) == ["relax.concat", "relax.matmul"] + ["relax.strided_slice"] * 3
    assert max(check_alternatives(main, found)) <= 1e-5


def test_matmuls_of_different_inputs_or_on_activations_stay_apart():
    main, _ = build_main({"x": (1, 5, 8), "y": (1, 5, 8), "z": (8, 4)},
                         [("a", lambda v: R.matmul(v["x"], constant((8, 4)))),
                          ("b", lambda v: R.matmul(v["y"], constant((8, 4)))),
                          ("act1", lambda v: R.exp(v["z"])),
                          ("act2", lambda v: R.sigmoid(v["z"])),
                          ("c", lambda v: R.matmul(v["x"], v["act1"])),
                          ("d", lambda v: R.matmul(v["x"], v["act2"]))], ["a", "b", "c", "d"])
    assert MergeMatmulsSharingInput().find(main) == []


def test_sibling_convolutions_merge_along_output_channels():
    main, _ = build_main(
        {"x": (1, 8, 6, 6)},
        [("a", lambda v: R.nn.conv2d(v["x"], constant((4, 8, 1, 1), seed=1))),
         ("b", lambda v: R.nn.conv2d(v["x"], constant((6, 8, 1, 1), seed=2))),
         ("strided", lambda v: R.nn.conv2d(v["x"], constant((4, 8, 1, 1)), strides=2))],
        ["a", "b", "strided"])
    found = MergeConvolutionsSharingInput().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [(("x",), ("a", "b"))]
    assert _ops(found[0]) == ["relax.nn.conv2d"] + ["relax.strided_slice"] * 2
    assert max(check_alternatives(main, found)) <= 1e-5


def test_convolutions_that_differ_stay_apart():
    main, _ = build_main(
        {"x": (1, 8, 6, 6)},
        [("padded", lambda v: R.nn.conv2d(v["x"], constant((4, 8, 3, 3)), padding=1)),
         ("unpadded", lambda v: R.nn.conv2d(v["x"], constant((4, 8, 3, 3)))),
         ("grouped", lambda v: R.nn.conv2d(v["x"], constant((8, 4, 1, 1)), groups=2)),
         ("grouped2", lambda v: R.nn.conv2d(v["x"], constant((8, 4, 1, 1)), groups=2))],
        ["padded", "unpadded", "grouped", "grouped2"])
    assert MergeConvolutionsSharingInput().find(main) == []


def test_channels_last_convolutions_merge_along_their_own_channel_axes():
    def conv(kernel):
        return lambda v: R.nn.conv2d(v["x"], kernel, data_layout="NHWC", kernel_layout="HWIO")
    main, _ = build_main({"x": (1, 6, 6, 8)},
                         [("a", conv(constant((1, 1, 8, 4), seed=1))),
                          ("b", conv(constant((1, 1, 8, 6), seed=2)))], ["a", "b"])
    found = MergeConvolutionsSharingInput().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [(("x",), ("a", "b"))]
    assert max(check_alternatives(main, found)) <= 1e-5
