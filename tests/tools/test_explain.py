"""korch-tvm explain: the plan without a build, ONNX tracing, the stock diff, and its drawings."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import onnx
import pytest

from conftest import MODELS, make_tiny_onnx
from korch_tvm.tools import cli
from html import escape as html_escape

from korch_tvm.tools.explain import explain_model, render, stock_difference

BERT = MODELS / "bert_layer.onnx"


@pytest.fixture(scope="module")
def bert_explanation():
    return explain_model(str(BERT), predict_only=True)


def test_explain_builds_nothing_and_covers_the_model(tmp_path, monkeypatch, capsys):
    import tvm

    from korch_tvm.pipeline import korch as passes

    def forbidden(*args, **kwargs):
        raise AssertionError("explain must not rewrite or build")

    monkeypatch.setattr(tvm, "compile", forbidden)
    monkeypatch.setattr(passes, "rewrite_with_plan", forbidden)
    path = tmp_path / "tiny.onnx"
    onnx.save(make_tiny_onnx(), str(path))
    # substitutions off: with them, an alternative's primitives or the originals it replaces
    # are rightly left out of the plan (tests/pipeline/test_substitution_alternatives.py)
    assert cli.main(["explain", str(path), "--predict-only", "--format", "json", "-q",
                     "--substitutions", "off"]) == 0
    explanation = json.loads(capsys.readouterr().out)
    covered = {node for kernel in explanation["kernels"] for node in kernel["primitives"]}
    assert covered == {p["id"] for p in explanation["primitives"]}
    assert all(k["cost_source"] == "predicted" and k["ms"] > 0 for k in explanation["kernels"])
    assert explanation["solver_status"] == "optimal" and explanation["solver"][0]["gap"] == 0
    assert explanation["modelled_ms"] <= explanation["stock_modelled_ms"] + 1e-12
    onnx_ops = {label for k in explanation["kernels"] for label in k["onnx_ops"]}
    assert onnx_ops == {"Softmax s", "MatMul mm", "Add a", "LayerNormalization y"}


def test_text_form_names_kernels_diff_and_solver(bert_explanation):
    text = render(bert_explanation, "text")
    for piece in ["kernels (execution order):", "from ONNX: MatMul /layer/attention/self/query",
                  "vs stock FuseOps", "solver:", "subproblem 0:", "predicted"]:
        assert piece in text, piece


def test_every_bert_primitive_is_traced_to_an_onnx_operator(bert_explanation):
    primitives = bert_explanation["primitives"]
    assert all(p["onnx"] for p in primitives)
    for p in primitives:
        if p["op"] == "matmul" and not p["alternative"]:  # an alternative's is never exact
            assert p["onnx_exact"] and p["onnx"].startswith("MatMul "), p
        if p["op"] in ("max", "exp"):
            assert p["onnx"].startswith("Softmax ") and not p["onnx_exact"], p
    norm = [p for p in primitives if p["op"] == "rsqrt"]
    assert norm and all(p["onnx"].startswith("LayerNormalization ") for p in norm)


def test_stock_difference_classifies_merge_split_and_recompute():
    stock = [frozenset({0, 1}), frozenset({2}), frozenset({3, 4})]
    chosen = [[0, 1, 2], [3], [2, 4]]  # merges, part of a stock group, recomputes 2
    diff = stock_difference(chosen, stock, ["k0", "k1", "k2"])
    assert diff["merged"] == [{"kernel": "k0", "stock_groups": [[0, 1], [2]]},
                              {"kernel": "k2", "stock_groups": [[2], [3, 4]]}]
    assert diff["part_of_stock"] == [{"kernel": "k1", "stock_group": [3, 4]}]
    assert {tuple(s["stock_group"]): s["kernels"] for s in diff["split"]} == {
        (2,): ["k0", "k2"], (3, 4): ["k1", "k2"]}
    assert stock_difference([[0, 1]], [frozenset({0, 1})], ["k0"])["same"] == ["k0"]


def test_dot_output_has_every_primitive_and_edge(bert_explanation, tmp_path):
    dot = render(bert_explanation, "dot")
    primitives = bert_explanation["primitives"]
    assert dot.startswith("digraph korch_plan {") and dot.rstrip().endswith("}")
    assert len(re.findall(r"^  p\d+ \[", dot, re.M)) == len(primitives)
    assert len(re.findall(r"^  p\d+ -> p\d+;", dot, re.M)) == sum(len(p["inputs"])
                                                                  for p in primitives)
    if shutil.which("dot"):
        path = tmp_path / "plan.dot"
        path.write_text(dot)
        subprocess.run(["dot", "-Tsvg", str(path), "-o", str(tmp_path / "plan.svg")], check=True)


def test_html_is_self_contained(bert_explanation):
    page = render(bert_explanation, "html")
    assert page.count('<g class="kernel"') == len(bert_explanation["kernels"])
    assert not re.search(r"""(src|href)\s*=|@import|url\(|https?://(?!www\.w3\.org/2000/svg)""",
                         page)


EVIL = "<!--<script>alert(1)</script>"
LONG = "/encoder/layer.11/attention/self/" + "very_long_segment/" * 8 + "Softmax"


@pytest.fixture(scope="module")
def hostile_explanation():
    """The tiny model with node names that try to break the page: a script opener, a name far
    too long for a label, a line separator (which ends a JavaScript string) with `&`, and
    quotes with a trailing backslash (which would escape a DOT string's closing quote)."""
    model = make_tiny_onnx()
    names = [LONG, EVIL, "add\u2028&\u2029bias", 'norm "x" \\']
    for node, name in zip(model.graph.node, names):
        node.name = name
    return explain_model(model, predict_only=True)


def _embedded_json(page):
    opening = '<script type="application/json" id="plan-data">'
    start = page.index(opening) + len(opening)
    return page[start:page.index("</script>", start)]


def _svg(page):
    import xml.etree.ElementTree as ET

    svg = page[page.index("<svg"):page.index("</svg>") + len("</svg>")]
    return ET.fromstring(svg)


SVG_NS = "{http://www.w3.org/2000/svg}"


def test_html_escapes_names_from_the_model(hostile_explanation):
    page = render(hostile_explanation, "html")
    assert EVIL not in page and "<!--" not in page
    assert "\u2028" not in _embedded_json(page)  # a line terminator to JavaScript
    assert page.count("<script") == 2 and page.count("</script>") == 2  # the page's own two
    assert html_escape(EVIL) in page  # shown, as text
    data = json.loads(_embedded_json(page))
    labels = {p["onnx"] for p in data["primitives"]}
    assert {"MatMul " + EVIL, "Add add\u2028&\u2029bias"} <= labels
    assert data == json.loads(json.dumps(hostile_explanation))


def test_html_draws_kernel_boxes_costs_and_shapes(hostile_explanation):
    page = render(hostile_explanation, "html")
    svg = _svg(page)
    kernels = {k["id"]: k for k in hostile_explanation["kernels"]}
    groups = [g for g in svg.iter(SVG_NS + "g") if g.get("class") == "kernel"]
    assert sorted(g.get("data-kernel") for g in groups) == sorted(kernels)
    slowest = max(k["ms"] for k in kernels.values())
    for group in groups:
        kernel = kernels[group.get("data-kernel")]
        assert group[0].tag == SVG_NS + "title" and f"{kernel['ms']:.4f} ms" in group[0].text
        rects = {r.get("class"): r for r in group.findall(SVG_NS + "rect")}
        assert {"box", "cost", "cost-track"} <= set(rects)
        box = rects["box"]
        rows = [g for g in group.iter(SVG_NS + "g") if "primitive" in g.get("class")]
        assert sorted(int(g.get("data-primitive")) for g in rows) == sorted(kernel["primitives"])
        for row in rows:  # every primitive row lies inside its kernel's box
            rect = row.find(SVG_NS + "rect")
            assert float(box.get("x")) < float(rect.get("x"))
            assert float(rect.get("y")) + float(rect.get("height")) < (
                float(box.get("y")) + float(box.get("height")))
        # the cost is a bar as long as the kernel's share of the slowest kernel's time
        share = float(rects["cost"].get("width")) / float(rects["cost-track"].get("width"))
        assert share == pytest.approx(kernel["ms"] / slowest, abs=0.01)
        texts = ["".join(t.itertext()) for t in group.iter(SVG_NS + "text")]
        assert any(f"{kernel['ms']:.4f} ms" in text for text in texts)
    shapes = {p["id"]: "x".join(map(str, p["shape"])) for p in hostile_explanation["primitives"]}
    edges = [g for g in svg.iter(SVG_NS + "g") if g.get("class") == "edge"]
    assert edges or len(kernels) == 1
    for edge in edges:
        assert edge.find(SVG_NS + "text").text == shapes[int(edge.get("data-tensor"))]


def test_labels_are_cut_at_the_right_and_whole_on_hover(hostile_explanation):
    from korch_tvm.report.plan_svg import fit

    assert fit("abcdef", 4) == "abc…" and fit("abc", 4) == "abc"
    svg = _svg(render(hostile_explanation, "html"))
    origins = [t.text for t in svg.iter(SVG_NS + "text") if t.get("class") == "origin"]
    cut = [text for text in origins if text.startswith("Softmax /encoder")]
    assert cut and all(text.endswith("…") and ("Softmax " + LONG).startswith(text[:-1])
                       for text in cut)
    titles = [t.text for t in svg.iter(SVG_NS + "title")]
    assert any(("Softmax " + LONG) in title for title in titles)


def test_dot_quotes_names_from_the_model(hostile_explanation):
    dot = render(hostile_explanation, "dot")
    quoted = r'"(?:[^"\\]|\\.)*"'
    nodes = re.findall(rf"^  p\d+ \[label=({quoted}), style={quoted}, fillcolor={quoted}, "
                       rf"tooltip={quoted}[^\]]*\];$", dot, re.M)
    assert len(nodes) == len(hostile_explanation["primitives"])
    assert any(label.endswith('LayerNormalization norm \\"x\\" \\\\"') for label in nodes)


def _chromium():
    return next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


@pytest.mark.skipif(_chromium() is None,
                    reason="no headless Chromium here (Debian: apt-get install chromium)")
def test_html_loads_in_a_real_browser_without_errors(bert_explanation, tmp_path):
    page = tmp_path / "plan.html"
    page.write_text(render(bert_explanation, "html"), encoding="utf-8")
    # Out of git: pytest's tmp dir, or KORCH_TEST_ARTIFACTS for CI to collect.
    artifacts = pathlib.Path(os.environ.get("KORCH_TEST_ARTIFACTS", tmp_path))
    artifacts.mkdir(parents=True, exist_ok=True)
    screenshot = artifacts / "explain_bert_layer.png"
    profile = tempfile.mkdtemp(prefix="korch-chromium-", dir=tmp_path)
    base = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--no-first-run", f"--user-data-dir={profile}",
            "--enable-logging=stderr", "--v=0", "--window-size=1600,1200"]
    dom = subprocess.run(base + ["--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console
    drawn = re.search(r'data-kernels-drawn="(\d+)"', dom.stdout)
    assert drawn, "the page's script did not run"
    assert int(drawn.group(1)) == len(bert_explanation["kernels"])
    assert dom.stdout.count('class="kernel"') == len(bert_explanation["kernels"])
    shot = subprocess.run(base + [f"--screenshot={screenshot}", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert screenshot.exists() and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]


@pytest.mark.skipif(_chromium() is None,
                    reason="no headless Chromium here (Debian: apt-get install chromium)")
def test_hostile_names_leave_the_page_script_working_in_a_browser(hostile_explanation, tmp_path):
    page = tmp_path / "hostile.html"
    page.write_text(render(hostile_explanation, "html"), encoding="utf-8")
    profile = tempfile.mkdtemp(prefix="korch-chromium-", dir=tmp_path)
    dom = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                          "--disable-background-networking", "--no-first-run",
                          f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert not [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    # the script ran to its end and parsed the embedded JSON
    parsed = re.search(r'data-primitives-parsed="(\d+)"', dom.stdout)
    assert parsed and int(parsed.group(1)) == len(hostile_explanation["primitives"])
    assert dom.stdout.count("<script") == 2  # no element made from a name


def test_explain_html_default_output_name(tmp_path, monkeypatch, capsys):
    path = tmp_path / "tiny.onnx"
    onnx.save(make_tiny_onnx(), str(path))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["explain", str(path), "--predict-only", "--format", "html", "-q"]) == 0
    assert (tmp_path / "tiny.korch.html").read_text().startswith("<!DOCTYPE html>")


def test_nhwc_plan_is_traced_to_the_right_onnx_operators():
    from test_weight_packing import conv_block_onnx

    explanation = explain_model(conv_block_onnx(8, 10), predict_only=True, layout="NHWC")
    assert explanation["layout"] == "NHWC"
    traced = [(p["op"], p["onnx"]) for p in explanation["primitives"]
              if p["op"] in ("nn.conv2d", "nn.relu")]
    assert traced == [("nn.conv2d", "Conv c1"), ("nn.relu", "Relu r1"),
                      ("nn.conv2d", "Conv c2"), ("nn.relu", "Relu r2"),
                      ("nn.conv2d", "Conv c3"), ("nn.relu", "Relu y")]
    relus = [p for p in explanation["primitives"] if p["op"] == "nn.relu"]
    assert all(p["onnx_exact"] for p in relus)


def test_explain_keeps_what_its_config_says(tmp_path):
    """Keyword defaults must not overwrite the config (they once reset the log to none)."""
    from korch_tvm.backend.target import parse_target, target_tag
    from korch_tvm.config import KorchConfig

    config = KorchConfig(tuning_logs=str(tmp_path), layout="NHWC", solver_time_limit=3.0)
    explanation = explain_model(make_tiny_onnx(), config=config, predict_only=True)
    assert (tmp_path / target_tag(parse_target("llvm"))).is_dir()  # the config's log was opened
    assert explanation["kernels"], "a plan with kernels"


def test_explain_says_a_model_without_operators_has_no_plan(capsys):
    from onnx import TensorProto, helper

    graph = helper.make_graph([], "passthrough",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tempfile.mkdtemp()
    onnx.save(model, os.path.join(path, "passthrough.onnx"))
    code = cli.main(["explain", os.path.join(path, "passthrough.onnx"), "--tuning-logs", ""])
    assert code == 2
    assert "has no operators" in capsys.readouterr().err
