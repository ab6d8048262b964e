"""Reshape/permute chains folded to the single op they compose to."""

from substitution_programs import build_main, names

from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.layout_chain import FoldLayoutChain
from korch_tvm.substitutions.program import R


def _folded(alternative):
    call = alternative.body.body.blocks[0].bindings[0].value
    return call.op.name, [int(d) for d in alternative.body.ret_ty.fields[0].shape.values]


def test_chains_fold_to_a_reshape_or_a_permute():
    main, _ = build_main(
        {"x": (1, 64, 32), "y": (2, 3, 4)},
        [("unit", lambda v: R.reshape(v["x"], [1, 64, 1, 32])),          # SegFormer's K/V
         ("moved", lambda v: R.permute_dims(v["unit"], [0, 2, 1, 3])),
         ("there", lambda v: R.permute_dims(v["y"], [0, 2, 1])),
         ("back", lambda v: R.permute_dims(v["there"], [0, 2, 1])),
         ("rotated", lambda v: R.permute_dims(v["back"], [2, 0, 1]))],
        ["moved", "rotated"])
    found = FoldLayoutChain().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [
        (("x",), ("moved",)), (("y",), ("back",)), (("y",), ("rotated",))]
    assert [_folded(a) for a in found] == [("relax.reshape", [1, 1, 64, 32]),
                                           ("relax.reshape", [2, 3, 4]),
                                           ("relax.permute_dims", [4, 2, 3])]
    assert max(check_alternatives(main, found)) <= 1e-5


def test_head_splits_and_single_ops_do_not_fold():
    main, _ = build_main(
        {"x": (1, 8, 12)},
        [("heads", lambda v: R.reshape(v["x"], [1, 8, 3, 4])),
         ("split", lambda v: R.permute_dims(v["heads"], [0, 2, 1, 3])),
         ("single", lambda v: R.permute_dims(v["x"], [0, 2, 1]))],
        ["split", "single"])
    assert FoldLayoutChain().find(main) == []
