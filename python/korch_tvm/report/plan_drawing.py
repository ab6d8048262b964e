"""The explained plan drawn: a self-contained HTML page (inline SVG) and Graphviz DOT.

The page needs nothing from the network: the SVG (report/plan_svg.py) draws each kernel as a box
around its primitives with its cost as a bar, and the CSS and the few lines of script that
highlight a kernel are inline. The explanation is also embedded as JSON for tools; since node names
come from the model, every string is escaped for HTML, and the JSON for a <script> element (no `<`,
`>`, `&` or line separators left as they are, so no name can close or comment out the script).
"""

from __future__ import annotations

import html
import json

from .plan_svg import hex_colour, kernel_colours, plan_svg

_hex = hex_colour


def script_json(value) -> str:
    """`value` as JSON that is safe inside a <script> element and still parses to `value`."""
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    for character, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"),
                               ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(character, escaped)
    return text


_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 20px; margin: 0 0 6px; }
main { display: flex; gap: 24px; align-items: flex-start; }
#graph { flex: 0 0 auto; overflow: auto; max-height: 88vh; max-width: 62vw;
         border: 1px solid #ccc; }
#details { flex: 1 1 auto; min-width: 380px; font-size: 13px; }
#details h2 { font-size: 16px; margin: 4px 0 8px; }
#details td:nth-child(4) { overflow-wrap: anywhere; }
table { border-collapse: collapse; margin-bottom: 16px; }
td, th { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #888; }
.legend { font-size: 12px; color: #555; }
svg text { font: 11px ui-monospace, monospace; fill: #111; pointer-events: none; }
.kernel .box { stroke-width: 1.5; }
.kernel-name { font-weight: bold; font-size: 12px; }
.cost-text { text-anchor: end; }
.cost-track { fill: #ffffff; opacity: 0.7; }
.primitive rect { fill: #ffffff; fill-opacity: 0.75; stroke: #888; stroke-width: 0.8; }
.primitive.output rect { stroke: #222; stroke-width: 2; }
.primitive.opaque rect { stroke-dasharray: 4 3; }
.primitive.recomputed rect { fill: #fff3c4; }
.primitive text.shape { text-anchor: end; fill: #334; }
.primitive text.origin { font-size: 10px; fill: #666; }
.edge path { fill: none; stroke: #666; stroke-width: 1.2; }
.edge path.arrow { fill: #666; stroke: none; }
.edge text.edge-shape { font-size: 10px; fill: #1a3d6e; paint-order: stroke;
                        stroke: #ffffff; stroke-width: 3px; }
svg.focus .kernel { opacity: 0.3; }
svg.focus .kernel.highlight { opacity: 1; }
tr.highlight { background: #ffe9a8; }
"""

_SCRIPT = """
(function () {
  var svg = document.getElementById("plan-graph");
  var groups = svg.querySelectorAll("g.kernel");
  function focus(id, on) {
    svg.classList.toggle("focus", on);
    groups.forEach(function (g) { g.classList.toggle("highlight", on && g.dataset.kernel === id); });
    document.querySelectorAll("tr[data-kernel]").forEach(function (row) {
      row.classList.toggle("highlight", on && row.dataset.kernel === id);
    });
  }
  document.querySelectorAll("[data-kernel]").forEach(function (element) {
    element.addEventListener("mouseenter", function () { focus(element.dataset.kernel, true); });
    element.addEventListener("mouseleave", function () { focus(element.dataset.kernel, false); });
  });
  var plan = JSON.parse(document.getElementById("plan-data").textContent);
  document.body.dataset.primitivesParsed = String(plan.primitives.length);
  document.body.dataset.kernelsDrawn = String(groups.length);
})();
"""

_LEGEND = ('<p class="legend">Each box is one kernel of the plan, its primitives listed inside '
           "in execution order (ONNX operator below each); the bar in its header is its modelled "
           "time against the slowest kernel's. Arrows are tensors that go through memory, "
           "labelled with their shapes. Bold: a model output; dashed: an opaque op; "
           "↻ (yellow): recomputed in more than one kernel; \u201c= stock\u201d: the same group as "
           "FuseOps'. Hover for full names.</p>")


def plan_html(explanation: dict) -> str:
    """One self-contained page: summary, the drawn graph, and the tables of the text form."""
    colours = kernel_colours([k["id"] for k in explanation["kernels"]])
    esc = html.escape
    rows = "\n".join(
        f'<tr data-kernel="{k["id"]}"><td><span class="swatch" style="background:'
        f'{_hex(colours[k["id"]])}"></span> {k["id"]}</td><td>{esc(" + ".join(k["ops"]))}</td>'
        f'<td>{esc(id_ranges(k["primitives"]))}</td>'
        f'<td>{esc("; ".join(k["onnx_ops"]))}</td>'
        f'<td>{"n/a" if k["ms"] is None else format(k["ms"], ".4f")}</td>'
        f'<td>{esc(k["cost_source"])}{" (stock group)" if k["stock_group"] else ""}</td></tr>'
        for k in explanation["kernels"])
    recomputed = "".join(
        f"<li>primitive {r['primitive']} ({esc(r['op'])}) in {esc(', '.join(r['kernels']))}</li>"
        for r in explanation["recomputed"]) or "<li>none</li>"
    diff = explanation["stock_diff"]
    diff_items = [f"<li>{len(diff['same'])} of {diff['chosen_kernels']} kernels equal a stock "
                  f"group ({diff['stock_kernels']} stock kernels)</li>"]
    diff_items += [f"<li>{m['kernel']} merges stock groups "
                   f"{esc(' | '.join(','.join(map(str, g)) for g in m['stock_groups']))}</li>"
                   for m in diff["merged"]]
    diff_items += [f"<li>stock group {esc(','.join(map(str, s['stock_group'])))} is split over "
                   f"{esc(', '.join(s['kernels']))}</li>" for s in diff["split"]]
    solver = "\n".join(
        f"<tr><td>{i}</td><td>{p['primitives']}</td><td>{p['candidates']}</td>"
        f"<td>{esc(p['status'])}</td><td>{'n/a' if p['gap'] is None else format(p['gap'], '.2%')}"
        f"</td><td>{p['seconds']:.2f}</td></tr>" for i, p in enumerate(explanation["solver"]))
    substitutions = _substitution_items(explanation.get("substitutions"))
    title = f"Korch plan: {explanation.get('model')}"
    opaque = (f"<p>Opaque ops kept as in the stock path: {esc(', '.join(explanation['opaque_ops']))}"
              "</p>" if explanation.get("opaque_ops") else "")
    summary = (f"{len(explanation['kernels'])} kernels on {esc(str(explanation.get('target_tag')))}"
               f"; modelled {_ms(explanation.get('modelled_ms'))} vs stock FuseOps "
               f"{_ms(explanation.get('stock_modelled_ms'))}; costs "
               f"{esc(str(explanation.get('costing')))}; solver {esc(explanation['solver_status'])}")
    data = script_json(explanation)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>{_STYLE}</style></head>
<body><h1>{esc(title)}</h1><p>{summary}</p>{opaque}{_LEGEND}
<main><div id="graph">{plan_svg(explanation)}</div>
<div id="details"><h2>Kernels (execution order)</h2>
<table><tr><th>kernel</th><th>primitives</th><th>ids</th><th>ONNX operators</th><th>ms</th>
<th>cost from</th></tr>
{rows}</table>
<h2>Recomputed primitives</h2><ul>{recomputed}</ul>
<h2>Compared with stock FuseOps</h2><ul>{''.join(diff_items)}</ul>
<h2>Substitutions</h2><ul>{substitutions}</ul>
<h2>Solver</h2><table><tr><th>subproblem</th><th>primitives</th><th>candidates</th>
<th>status</th><th>gap</th><th>seconds</th></tr>
{solver}</table></div></main>
<script type="application/json" id="plan-data">{data}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


def id_ranges(ids) -> str:
    """`0-5, 9, 12-13`: sorted ids with each consecutive run written as a range."""
    runs: list[list[int]] = []
    for value in sorted(ids):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.4f} ms"


def plan_dot(explanation: dict) -> str:
    """Graphviz: primitives as boxes filled with their kernel's colour (striped if recomputed)."""
    colours = kernel_colours([k["id"] for k in explanation["kernels"]])
    lines = ["digraph korch_plan {", "  rankdir=TB;",
             '  node [shape=box, style="filled,rounded", fontname="monospace", fontsize=10];',
             f"  label={_quote('Korch plan: ' + str(explanation.get('model')))};"]
    for primitive in explanation["primitives"]:
        fills = ":".join(_hex(colours[k]) for k in primitive["kernels"]) or "white"
        style = "striped" if len(primitive["kernels"]) > 1 else "filled,rounded"
        label = (f"{_escape_dot(str(primitive['id']) + ' ' + primitive['op'])}\\n"
                 f"{_escape_dot(primitive['onnx'] or '')}")
        extra = ", penwidth=2.5" if primitive["output"] else ""
        extra += ", peripheries=2" if primitive["opaque"] else ""
        lines.append(f'  p{primitive["id"]} [label="{label}", style="{style}", '
                     f'fillcolor="{fills}", tooltip={_quote(", ".join(primitive["kernels"]))}'
                     f"{extra}];")
    for primitive in explanation["primitives"]:
        for producer in primitive["inputs"]:
            lines.append(f"  p{producer} -> p{primitive['id']};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _escape_dot(text: str) -> str:
    """Text for inside a quoted DOT string: a name ending in a backslash must not escape the
    closing quote."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _quote(text: str) -> str:
    return '"' + _escape_dot(text) + '"'


def _substitution_items(substitutions, esc=html.escape) -> str:
    """One list item per site found: its rule, what it replaces, chosen and the modelled saving."""
    if not substitutions or not substitutions["found"]:
        return "<li>none found</li>"
    items = []
    for site in substitutions["sites"]:
        state = (f"chosen, saves {_ms(site.get('saved_ms'))} modelled" if site["chosen"]
                 else "not chosen" if site["offered"] else "not offered (straddles a cut)")
        items.append(f"<li>{esc(site['rule'])} for {esc(', '.join(site['replaces']))}: "
                     f"{state}</li>")
    return "".join(items)
