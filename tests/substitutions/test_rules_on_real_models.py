"""The rules on real lowered models: the sites found per rule, and every alternative checked.

The SegFormer block and BERT layer shipped in models/ run always (seconds); the zoo's BERT (2 layers:
separate Q/K/V projections, a scaled Q @ K^T, one softmax per layer) and DeiT-tiny (12 blocks,
timm's fused qkv Linear) and the suite's EfficientViT-b0 are slow (loading and lowering them
dominates) and skip where the bench models were not exported.
"""

from collections import Counter
from pathlib import Path

import pytest

from korch_tvm.frontend.onnx_import import import_onnx, load_onnx
from korch_tvm.lowering.fission import lower_to_primitives
from korch_tvm.substitutions.check import check_alternatives
from korch_tvm.substitutions.rules import ALL_RULES, find_alternatives

ROOT = Path(__file__).resolve().parents[2]
PATHS = {"segformer_block": ROOT / "models" / "segformer_block.onnx",
         "bert_layer": ROOT / "models" / "bert_layer.onnx",
         "bert_2layer": ROOT / "bench" / "zoo" / "models" / "bert_2layer.onnx",
         "deit_tiny": ROOT / "bench" / "zoo" / "models" / "deit_tiny.onnx",
         "efficientvit_b0": ROOT / "bench" / "models" / "efficientvit_b0.onnx"}

# sites per rule, as observed: one softmax (division, sum, sum in the value matmul) per
# attention block; BERT's three projections per layer merged once; DeiT's fused qkv split
# once per block; BERT's one mask reshape chain that composes to a reshape; the SegFormer
# block's K/V reshape+permute chains that compose to reshapes; the BERT layer's 64 x 64 heads
# (d = n: the moved division touches as many elements); MIT EfficientViT's ones column (its
# ONNX Pad, a Concat since frontend/onnx_rewrites) taken apart once per linear-attention block
EXPECTED = {
    "bert_layer": {"division_after_matmul": 1, "scale_before_matmul": 1, "sum_as_matmul": 1,
                   "sum_in_value_matmul": 1, "merge_matmuls_sharing_input": 1},
    "segformer_block": {"division_after_matmul": 1, "scale_before_matmul": 1, "sum_as_matmul": 1,
                        "sum_in_value_matmul": 1, "merge_matmuls_sharing_input": 1,
                        "fold_layout_chain": 3},
    "bert_2layer": {"division_after_matmul": 2, "scale_before_matmul": 2, "sum_as_matmul": 2,
                    "sum_in_value_matmul": 2,
                    "merge_matmuls_sharing_input": 2, "fold_layout_chain": 1},
    "deit_tiny": {"division_after_matmul": 12, "sum_as_matmul": 12, "sum_in_value_matmul": 12,
                  "split_fused_projection": 12},
    "efficientvit_b0": {"ones_column_split": 4},
}


@pytest.fixture(scope="module", params=[
    "segformer_block", "bert_layer", pytest.param("bert_2layer", marks=pytest.mark.slow),
    pytest.param("deit_tiny", marks=pytest.mark.slow),
    pytest.param("efficientvit_b0", marks=pytest.mark.slow)])
def lowered(request):
    path = PATHS[request.param]
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
