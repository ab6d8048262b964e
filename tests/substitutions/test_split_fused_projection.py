"""A fused qkv projection (matmul or 1x1 convolution) split into per-part projections."""

from substitution_programs import build_main, constant, names

from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.program import R
from korch_tvm.substitutions.split_fused_projection import SplitFusedProjection


def _slice(axis, begin, end):
    return lambda v: R.strided_slice(v["heads"], axes=[axis], begin=[begin], end=[end])


def _vit_qkv(slices):
    """timm's qkv: x @ W + b, reshaped to [B, N, 3, H, D], permuted to [3, B, H, N, D]."""
    return build_main(
        {"x": (1, 5, 8)},
        [("fused", lambda v: R.matmul(v["x"], constant((8, 24), seed=1))),
         ("biased", lambda v: R.add(constant((24,), seed=2), v["fused"])),
         ("split", lambda v: R.reshape(v["biased"], [1, 5, 3, 2, 4])),
         ("heads", lambda v: R.permute_dims(v["split"], [2, 0, 3, 1, 4]))]
        + [(name, make) for name, make in slices], [name for name, _ in slices])[0]


def test_vit_qkv_splits_into_three_projections():
    main = _vit_qkv([("q", _slice(0, 0, 1)), ("k", _slice(0, 1, 2)), ("v", _slice(0, 2, 3))])
    found = SplitFusedProjection().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [(("x",), ("q", "k", "v"))]
    ops = [b.value.op.name for b in found[0].body.body.blocks[0].bindings]
    assert ops.count("relax.matmul") == 3 and "relax.strided_slice" not in ops
    assert max(check_alternatives(main, found)) <= 1e-5


def test_slices_across_heads_or_tokens_are_not_projections():
    heads = _vit_qkv([("h0", _slice(2, 0, 1)), ("h1", _slice(2, 1, 2))])
    tokens = build_main({"x": (1, 6, 8)},
                        [("fused", lambda v: R.matmul(v["x"], constant((8, 24)))),
                         ("t0", lambda v: R.strided_slice(v["fused"], [1], [0], [3])),
                         ("t1", lambda v: R.strided_slice(v["fused"], [1], [3], [6]))],
                        ["t0", "t1"])[0]
    assert SplitFusedProjection().find(heads) == []
    assert SplitFusedProjection().find(tokens) == []


def test_convolution_split_along_channels():
    main, _ = build_main(
        {"x": (2, 8, 5, 5)},
        [("fused", lambda v: R.nn.conv2d(v["x"], constant((12, 8, 1, 1), seed=1))),
         ("biased", lambda v: R.add(v["fused"], constant((1, 12, 1, 1), seed=2))),
         ("same", lambda v: R.reshape(v["biased"], [2, 12, 5, 5])),
         ("a", lambda v: R.strided_slice(v["same"], [1], [0], [4])),
         ("b", lambda v: R.strided_slice(v["same"], [1], [4], [12])),
         ("rows", lambda v: R.strided_slice(v["same"], [2], [0], [2]))],
        ["a", "b", "rows"])
    found = SplitFusedProjection().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [(("x",), ("a", "b"))]
    assert max(check_alternatives(main, found)) <= 1e-5


def test_channels_last_convolution_split_along_its_channel_axis():
    main, _ = build_main(
        {"x": (1, 5, 5, 8)},
        [("fused", lambda v: R.nn.conv2d(v["x"], constant((1, 1, 8, 12), seed=1),
                                         data_layout="NHWC", kernel_layout="HWIO")),
         ("a", lambda v: R.strided_slice(v["fused"], [3], [0], [5])),
         ("b", lambda v: R.strided_slice(v["fused"], [3], [5], [12]))], ["a", "b"])
    found = SplitFusedProjection().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [(("x",), ("a", "b"))]
    assert max(check_alternatives(main, found)) <= 1e-5
