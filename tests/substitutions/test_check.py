"""check_alternative: the original subgraph is extracted from main, and a wrong body is caught."""

import pytest
from substitution_programs import build_main

from korch_tvm.substitutions.alternative import Alternative
from korch_tvm.substitutions.check import check_alternative, original_subgraph
from korch_tvm.substitutions.program import R, build_alternative


def _main():
    return build_main({"x": (4, 6), "y": (4, 6)},
                      [("s", lambda v: R.add(v["x"], v["y"])),
                       ("t", lambda v: R.multiply(v["s"], v["x"])),
                       ("u", lambda v: R.exp(v["t"]))], ["u"])


def test_original_subgraph_holds_the_bindings_between_reads_and_replaces():
    main, values = _main()
    alternative = build_alternative("test", [values["s"], values["x"]], [values["u"]],
                                    lambda bb, s, x: [R.exp(bb.emit(R.multiply(s, x)))])
    original = original_subgraph(main, alternative)
    bound = [b.value.op.name for block in original.body.blocks for b in block.bindings]
    assert bound == ["relax.multiply", "relax.exp"]
    assert [p.name for p in original.params] == ["s", "x"]
    assert check_alternative(main, alternative) <= 1e-6


def test_a_wrong_body_shows_a_large_error():
    main, values = _main()
    wrong = build_alternative("test", [values["s"], values["x"]], [values["u"]],
                              lambda bb, s, x: [R.exp(bb.emit(R.add(s, x)))])
    assert check_alternative(main, wrong) > 0.1


def test_reads_that_do_not_close_the_subgraph_are_refused():
    main, values = _main()
    body = build_alternative("test", [values["t"]], [values["u"]],
                             lambda bb, t: [R.exp(t)]).body
    unclosed = Alternative("test", (values["s"],), (values["u"],), body)
    with pytest.raises(ValueError, match="x is not computed from the reads"):
        original_subgraph(main, unclosed)
