"""Softmax's row sum computed by the value matmul on V with a ones column (or row)."""

from substitution_programs import build_main, names

from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.program import R
from korch_tvm.substitutions.sum_in_value_matmul import SumInValueMatmul


def _attention(values_shape, transposed=False, divisor_of="exps"):
    steps = [("exps", lambda v: R.exp(v["x"])),
             ("others", lambda v: R.exp(v["y"])),
             ("total", lambda v: R.sum(v[divisor_of], axis=[-1], keepdims=True)),
             ("probs", lambda v: R.divide(v["exps"], v["total"]))]
    if transposed:
        steps += [("probs_t", lambda v: R.permute_dims(v["probs"], [0, 2, 1])),
                  ("out", lambda v: R.matmul(v["v"], v["probs_t"]))]
    else:
        steps += [("out", lambda v: R.matmul(v["probs"], v["v"]))]
    return build_main({"x": (2, 16, 16), "y": (2, 16, 16), "v": values_shape}, steps,
                      ["out"])[0]


def test_the_sum_moves_into_the_value_matmul_direct_and_transposed():
    for main in (_attention((2, 16, 4)), _attention((2, 4, 16), transposed=True)):
        found = SumInValueMatmul().find(main)
        assert [(names(a.reads), names(a.replaces)) for a in found] in (
            [(("exps", "v"), ("out",))], [(("v", "exps"), ("out",))])
        ops = [b.value.op.name for b in found[0].body.body.blocks[0].bindings]
        assert "relax.sum" not in ops and ops.count("relax.matmul") == 1
        assert check_alternatives(main, found)[0] <= 1e-5


def test_other_divisors_and_wide_values_stay():
    assert SumInValueMatmul().find(_attention((2, 16, 4), divisor_of="others")) == []
    assert SumInValueMatmul().find(_attention((2, 16, 32))) == []
    assert SumInValueMatmul().find(_attention((2, 32, 16), transposed=True)) == []
