"""ONNX's own backend node tests, with and without primitive lowering: lowering never breaks one.

The cases are ONNX's node tests for every ONNX operator whose import yields an op of the lowering
rule table (plus the activations the importer decomposes itself, as a control). They are read from
``onnx/backend/test/data/node`` when the installed onnx ships that folder, and otherwise generated
by ``onnx.backend.test.case.node.collect_testcases``, the code that writes that folder. Function
expansions (``*_expanded``) are left out: they contain no composite op.
"""

import os
import warnings

import numpy as np
import onnx
import pytest
import tvm
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from korch_tvm.lowering.fission import LOWERING_RULES, PrimitiveLowering, count_operators

ONNX_OPS_UNDER_TEST = {
    # imported as an op of the rule table
    "Softmax", "LogSoftmax", "LayerNormalization", "GroupNormalization", "InstanceNormalization",
    "RMSNormalization", "BatchNormalization", "Gelu", "Split", "Dropout",
    # activations the importer already decomposes (control group: lowering must be a no-op)
    "Softplus", "Selu", "Mish", "HardSwish", "HardSigmoid", "MeanVarianceNormalization",
}


def _wanted(model: onnx.ModelProto, name: str) -> bool:
    return "expanded" not in name and bool(
        {node.op_type for node in model.graph.node} & ONNX_OPS_UNDER_TEST)


def _cases_from_folder(folder):
    for name in sorted(os.listdir(folder)):
        model = onnx.load(os.path.join(folder, name, "model.onnx"))
        data_dir = os.path.join(folder, name, "test_data_set_0")
        if not _wanted(model, name) or not os.path.isdir(data_dir):
            continue
        loaded = {}
        for prefix in ("input", "output"):
            files = sorted((f for f in os.listdir(data_dir) if f.startswith(prefix)),
                           key=lambda f: int(f.split("_")[1].split(".")[0]))
            loaded[prefix] = [numpy_helper.to_array(onnx.load_tensor(os.path.join(data_dir, f)))
                              for f in files]
        yield name, model, loaded["input"], loaded["output"], 1e-3, 1e-7


def _generated_cases():
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    for case in sorted(cases, key=lambda c: c.name):
        if case.kind == "node" and case.data_sets and _wanted(case.model, case.name):
            inputs, outputs = case.data_sets[0]
            yield case.name, case.model, list(inputs), list(outputs), case.rtol, case.atol


def _node_test_cases():
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
    return list(_cases_from_folder(folder) if os.path.isdir(folder) else _generated_cases())


def _flatten(result):
    if isinstance(result, tvm.runtime.Tensor):
        return [result.numpy()]
    return [array for item in result for array in _flatten(item)]


def _output_matches(mod, inputs, expected_outputs, rtol, atol) -> list[bool]:
    """Build and run ``mod``; per reference output, whether ours matches (all False on error)."""
    failed = [False] * len(expected_outputs)
    try:
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        outputs = _flatten(vm["main"](*[tvm.runtime.tensor(a) for a in inputs]))
    except Exception:  # noqa: BLE001 - a build or run failure is a failed case, whatever it is
        return failed
    if len(outputs) != len(expected_outputs):
        return failed
    return [got.dtype == want.dtype and got.shape == want.shape
            and np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
            for got, want in zip(outputs, expected_outputs)]


@pytest.fixture(scope="module")
def conformance():
    """Per case and mode (plain, lowered): per-output matches; import failures are skipped."""
    results, import_failures, touched = {}, [], []
    for name, model, inputs, outputs, rtol, atol in _node_test_cases():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imported = from_onnx(model)
        except Exception:  # noqa: BLE001 - the importer's failure, same in both modes
            import_failures.append(name)
            continue
        lowered = PrimitiveLowering()(imported)
        if set(count_operators(imported)) & set(LOWERING_RULES):
            touched.append(name)
        results[name] = {mode: _output_matches(mod, inputs, outputs, rtol, atol)
                         for mode, mod in (("plain", imported), ("lowered", lowered))}
    return results, import_failures, touched


# Cases TVM's own rms_norm cannot build (normalising over every axis) but the lowered one passes.
FIXED_BY_LOWERING = {
    f"test_rms_normalization_{suffix}" for suffix in (
        "2d_axis0", "2d_axis_negative_2", "3d_axis0_epsilon", "3d_axis_negative_3_epsilon",
        "4d_axis0", "4d_axis_negative_4")
}


def _passing(results, mode, first_output_only):
    def matched(matches):
        checked = matches[:1] if first_output_only else matches
        return bool(checked) and all(checked)

    return {name for name, by_mode in results.items() if matched(by_mode[mode])}


def test_lowering_never_breaks_a_passing_case(conformance, capsys, record_property):
    """Every case passing without lowering passes with it; the only differences are known fixes.

    Checked twice: on all outputs (ONNX's criterion) and on the first output only, because the
    importer returns placeholders for LayerNormalization's optional Mean/InvStdDev outputs, which
    would otherwise hide whether the normalised output itself is right.
    """
    results, import_failures, touched = conformance
    total, lines = len(results), []
    for label, first_only in (("all outputs", False), ("first output", True)):
        plain, lowered = (_passing(results, mode, first_only) for mode in ("plain", "lowered"))
        lines.append(f"ONNX node tests ({label}): {len(plain)}/{total} pass without lowering, "
                     f"{len(lowered)}/{total} with lowering")
        assert plain <= lowered, f"broken by lowering ({label}): {sorted(plain - lowered)}"
        assert lowered - plain == FIXED_BY_LOWERING, f"fixed by lowering: {sorted(lowered - plain)}"
    lines.append(f"{len(touched)} of {total} cases contain a composite op; "
                 f"{len(import_failures)} skipped (import fails in both modes)")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    record_property("conformance", "; ".join(lines))
    assert total >= 60 and len(touched) >= 40, lines
