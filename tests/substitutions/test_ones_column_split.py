"""MIT EfficientViT's ones column taken apart: `q @ (k^T @ [v | 1])` sliced into d columns and
the last one becomes `q @ (k^T @ v)` and `q @ sum(k^T, -1)`."""

from substitution_programs import build_main, constant, names
from tvm import relax

from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.ones_column_split import OnesColumnSplit
from korch_tvm.substitutions.program import R

HEADS, TOKENS, WIDTH = 2, 12, 4
END = 2**63 - 1  # what the ONNX importer writes for "to the end"


def _linear_attention(fill=1.0, chain=2, extra_reader=None, last_slice=(-1, END),
                      shared_keys=False):
    keys = (lambda v: constant((WIDTH, TOKENS))) if shared_keys else \
        (lambda v: R.permute_dims(v["k"], [0, 2, 1]))
    steps = [("k_t", keys),
             ("padded", lambda v: R.concat(
                 [v["v"], constant((HEADS, TOKENS, 1), fill=fill)], axis=2)),
             ("kv", lambda v: R.matmul(v["k_t"], v["padded"]))]
    product = "kv"
    if chain == 2:
        steps.append(("qkv", lambda v: R.matmul(v["q"], v["kv"])))
        product = "qkv"
    steps += [("den", lambda v: R.strided_slice(v[product], [2], [last_slice[0]],
                                                [last_slice[1]])),
              ("num", lambda v: R.strided_slice(v[product], [2], [0], [-1])),
              ("den_eps", lambda v: R.add(v["den"], relax.const(1e-5, "float32"))),
              ("out", lambda v: R.divide(v["num"], v["den_eps"]))]
    outputs = ["out"]
    if extra_reader is not None:
        steps.append(("other", lambda v: R.exp(v[extra_reader])))
        outputs.append("other")
    inputs = {"q": (HEADS, TOKENS, WIDTH), "k": (HEADS, TOKENS, WIDTH),
              "v": (HEADS, TOKENS, WIDTH)}
    return build_main(inputs, steps, outputs)[0]


def test_the_ones_column_leaves_the_matmul_chain():
    main = _linear_attention()
    found = OnesColumnSplit().find(main)
    assert [(a.rule, names(a.reads), names(a.replaces)) for a in found] == [
        ("ones_column_split", ("v", "k_t", "q"), ("den", "num"))]
    ops = [binding.value.op.name for binding in found[0].body.body.blocks[0].bindings]
    assert sorted(ops) == ["relax.matmul"] * 3 + ["relax.sum"]
    widths = [int(binding.var.ty.shape[-1]) for binding in found[0].body.body.blocks[0].bindings]
    assert max(widths) == WIDTH  # no product is d + 1 wide any more
    assert check_alternatives(main, found)[0] <= 1e-5


def test_a_single_matmul_takes_the_sum_alone():
    main = _linear_attention(chain=1)
    found = OnesColumnSplit().find(main)
    assert [names(a.replaces) for a in found] == [("den", "num")]
    ops = [binding.value.op.name for binding in found[0].body.body.blocks[0].bindings]
    assert sorted(ops) == ["relax.matmul", "relax.sum"]
    assert check_alternatives(main, found)[0] <= 1e-5


def test_no_split_where_the_column_or_the_readers_differ():
    assert OnesColumnSplit().find(_linear_attention(fill=2.0)) == []
    # the product or an intermediate read by more than slices must still be computed whole
    assert OnesColumnSplit().find(_linear_attention(extra_reader="qkv")) == []
    assert OnesColumnSplit().find(_linear_attention(extra_reader="kv")) == []
    # a slice that straddles the split (columns 1..d)
    assert OnesColumnSplit().find(_linear_attention(last_slice=(1, END))) == []
    # one matrix for every head: its row sum would lack the heads axis the column has
    assert OnesColumnSplit().find(_linear_attention(shared_keys=True)) == []
