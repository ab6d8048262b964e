"""The rules on real lowered models: the sites found per rule, and every alternative checked.

BERT (2 layers) has fused-free Q/K/V projections, a scaled Q @ K^T and one softmax per layer;
DeiT-tiny (12 blocks) has timm's fused qkv Linear. Loading and lowering the two models
dominates the time, so this file is marked slow.
"""

from collections import Counter
from pathlib import Path

import pytest

from korch_tvm.frontend.onnx_import import import_onnx, load_onnx
from korch_tvm.lowering.fission import lower_to_primitives
from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.rules import ALL_RULES, find_alternatives

pytestmark = pytest.mark.slow
MODELS = Path(__file__).resolve().parents[2] / "bench" / "zoo" / "models"

# sites per rule, as observed: one softmax (division, sum, sum in the value matmul) per
# attention block; BERT's three projections per layer merged once; DeiT's fused qkv split
# once per block; BERT's one mask reshape chain that composes to a reshape
EXPECTED = {
    "bert_2layer": {"division_after_matmul": 2, "scale_before_matmul": 2, "sum_as_matmul": 2,
                    "sum_in_value_matmul": 2,
                    "merge_matmuls_sharing_input": 2, "fold_layout_chain": 1},
    "deit_tiny": {"division_after_matmul": 12, "sum_as_matmul": 12, "sum_in_value_matmul": 12,
                  "split_fused_projection": 12},
}


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def lowered(request):
    path = MODELS / f"{request.param}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not in the checkout")
    return request.param, lower_to_primitives(import_onnx(load_onnx(str(path))))


def test_sites_per_rule_and_every_alternative_checked(lowered):
    name, module = lowered
    alternatives = find_alternatives(module["main"])
    counts = Counter(alternative.rule for alternative in alternatives)
    expected = {rule.name: EXPECTED[name].get(rule.name, 0) for rule in ALL_RULES}
    assert {rule.name: counts[rule.name] for rule in ALL_RULES} == expected
    assert [a.rule for a in alternatives] == sorted(
        (a.rule for a in alternatives), key=[rule.name for rule in ALL_RULES].index)
    errors = check_alternatives(module["main"], alternatives, module=module)
    assert max(errors) <= 1e-5, [(a.rule, a.replaces[0].name, error)
                                 for a, error in zip(alternatives, errors) if error > 1e-5]
