"""A row (or column) sum as a matmul with ones, and back."""

from substitution_programs import build_main, constant, names

from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.program import R
from korch_tvm.substitutions.sum_as_matmul import MatmulAsSum, SumAsMatmul


def test_keepdims_sums_over_the_last_two_axes_become_matmuls():
    main, _ = build_main({"e": (2, 8, 16)},
                         [("rows", lambda v: R.sum(v["e"], axis=[-1], keepdims=True)),
                          ("columns", lambda v: R.sum(v["e"], axis=[1], keepdims=True))],
                         ["rows", "columns"])
    found = SumAsMatmul().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [
        (("e",), ("rows",)), (("e",), ("columns",))]
    ops = [a.body.body.blocks[0].bindings[-1].value.op.name for a in found]
    assert ops == ["relax.matmul", "relax.matmul"]
    assert max(check_alternatives(main, found)) <= 1e-5


def test_other_sums_stay():
    main, _ = build_main({"e": (2, 8, 16)},
                         [("flat", lambda v: R.sum(v["e"], axis=[-1], keepdims=False)),
                          ("batch", lambda v: R.sum(v["e"], axis=[0], keepdims=True)),
                          ("both", lambda v: R.sum(v["e"], axis=[1, 2], keepdims=True))],
                         ["flat", "batch", "both"])
    assert SumAsMatmul().find(main) == []


def test_matmuls_with_ones_become_sums():
    main, _ = build_main({"x": (2, 8, 16)},
                         [("rows", lambda v: R.matmul(v["x"], constant((16, 1), fill=1.0))),
                          ("columns", lambda v: R.matmul(constant((1, 8), fill=1.0), v["x"]))],
                         ["rows", "columns"])
    found = MatmulAsSum().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [
        (("x",), ("rows",)), (("x",), ("columns",))]
    assert max(check_alternatives(main, found)) <= 1e-5


def test_matmuls_by_other_constants_stay():
    main, _ = build_main({"x": (2, 8, 16)},
                         [("twos", lambda v: R.matmul(v["x"], constant((16, 1), fill=2.0))),
                          ("wide", lambda v: R.matmul(v["x"], constant((16, 2), fill=1.0))),
                          ("random", lambda v: R.matmul(v["x"], constant((16, 1))))],
                         ["twos", "wide", "random"])
    assert MatmulAsSum().find(main) == []
