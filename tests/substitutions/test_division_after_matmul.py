"""Softmax's division moved after its matmul, and a scaling moved before one."""

from substitution_programs import build_main, constant, names

from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.division_after_matmul import DivisionAfterMatmul, ScaleBeforeMatmul
from korch_tvm.substitutions.program import R


def _softmax_steps(axis=-1):
    return [("row_max", lambda v: R.max(v["x"], axis=[-1], keepdims=True)),
            ("shifted", lambda v: R.subtract(v["x"], v["row_max"])),
            ("exps", lambda v: R.exp(v["shifted"])),
            ("total", lambda v: R.sum(v["exps"], axis=[axis], keepdims=True)),
            ("probs", lambda v: R.divide(v["exps"], v["total"]))]


def test_division_moves_after_the_matmul_direct_cast_and_transposed():
    main, _ = build_main(
        {"x": (2, 16, 16), "v": (2, 16, 4), "v_rows": (2, 4, 16)},
        _softmax_steps() + [
            ("cast", lambda v: R.astype(v["probs"], "float32")),
            ("out", lambda v: R.matmul(v["cast"], v["v"])),
            ("probs_t", lambda v: R.permute_dims(v["probs"], [0, 2, 1])),
            ("out_t", lambda v: R.matmul(v["v_rows"], v["probs_t"]))],
        ["out", "out_t"])
    found = DivisionAfterMatmul().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [
        (("exps", "total", "v"), ("out",)), (("v_rows", "exps", "total"), ("out_t",))]
    assert max(check_alternatives(main, found)) <= 1e-5


def test_division_stays_where_it_does_not_commute_or_would_not_pay():
    column_sums, _ = build_main({"x": (2, 16, 16), "v": (2, 16, 4)},
                                _softmax_steps(axis=-2) + [
                                    ("out", lambda v: R.matmul(v["probs"], v["v"]))], ["out"])
    wide_values, _ = build_main({"x": (2, 16, 16), "v": (2, 16, 32)}, _softmax_steps() + [
        ("out", lambda v: R.matmul(v["probs"], v["v"]))], ["out"])
    untransposed_right, _ = build_main({"x": (2, 16, 16), "v": (2, 4, 16)}, _softmax_steps() + [
        ("out", lambda v: R.matmul(v["v"], v["probs"]))], ["out"])
    for main in (column_sums, wide_values, untransposed_right):
        assert DivisionAfterMatmul().find(main) == []


def test_scaling_moves_before_the_matmul_scalar_and_row_wise():
    main, _ = build_main(
        {"q": (2, 16, 4), "k_t": (2, 4, 16), "rows": (2, 16, 1)},
        [("logits", lambda v: R.matmul(v["q"], v["k_t"])),
         ("scaled", lambda v: R.multiply(v["logits"], constant((), fill=0.125))),
         ("products", lambda v: R.matmul(v["q"], v["k_t"])),
         ("normed", lambda v: R.divide(v["products"], v["rows"]))],
        ["scaled", "normed"])
    found = ScaleBeforeMatmul().find(main)
    assert [(names(a.reads), names(a.replaces)) for a in found] == [
        (("q", "k_t"), ("scaled",)), (("q", "k_t", "rows"), ("normed",))]
    scaled_operand = found[0].body.body.blocks[0].bindings[0].value
    assert scaled_operand.op.name == "relax.multiply"
    assert max(check_alternatives(main, found)) <= 1e-5


def test_scaling_stays_where_it_does_not_commute_or_would_not_pay():
    main, _ = build_main(
        {"q": (2, 16, 4), "k_t": (2, 4, 16), "a": (2, 16, 32), "b": (2, 32, 4)},
        [("logits", lambda v: R.matmul(v["q"], v["k_t"])),
         ("per_column", lambda v: R.multiply(v["logits"], constant((16,)))),
         ("reversed", lambda v: R.divide(constant((), fill=2.0), v["logits"])),
         ("small", lambda v: R.matmul(v["a"], v["b"])),
         ("small_scaled", lambda v: R.multiply(v["small"], constant((), fill=0.5)))],
        ["per_column", "reversed", "small_scaled"])
    assert ScaleBeforeMatmul().find(main) == []
