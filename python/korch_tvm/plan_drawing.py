"""The explained plan drawn: a self-contained HTML page (inline SVG) and Graphviz DOT.

Both draw the primitive graph with each primitive coloured by the kernel(s) that compute it; a
recomputed primitive is striped with the colours of all its kernels. The HTML page needs nothing
from the network: the SVG is laid out here (layers by longest path from the inputs, each layer
ordered by the mean position of its producers), and its CSS and the few lines of script that
highlight a kernel are inline.
"""

from __future__ import annotations

import colorsys
import html
import json

NODE_WIDTH, NODE_HEIGHT = 150, 38
H_GAP, V_GAP, MARGIN = 24, 34, 16


def kernel_colours(kernel_ids) -> dict[str, tuple[float, float, float]]:
    """Distinct, light hues (golden-angle steps), as HSV triples in [0, 1]."""
    return {kernel_id: ((index * 0.381966) % 1.0, 0.38, 0.98)
            for index, kernel_id in enumerate(kernel_ids)}


def _hex(hsv) -> str:
    red, green, blue = colorsys.hsv_to_rgb(*hsv)
    return "#%02x%02x%02x" % (round(red * 255), round(green * 255), round(blue * 255))


def layered_layout(primitives) -> dict[int, tuple[float, float]]:
    """Top-left corner of each primitive's box: one row per longest-path depth."""
    depth = {}
    for primitive in primitives:  # ids are a topological order
        depth[primitive["id"]] = 1 + max((depth[i] for i in primitive["inputs"]), default=-1)
    rows: dict[int, list[int]] = {}
    for primitive in primitives:
        rows.setdefault(depth[primitive["id"]], []).append(primitive["id"])
    inputs_of = {p["id"]: p["inputs"] for p in primitives}
    column: dict[int, float] = {}
    for level in sorted(rows):
        def barycentre(node):
            placed = [column[i] for i in inputs_of[node] if i in column]
            return (sum(placed) / len(placed) if placed else float(node), node)
        rows[level].sort(key=barycentre)
        for position, node in enumerate(rows[level]):
            column[node] = position
    widest = max((len(row) for row in rows.values()), default=1)
    corners = {}
    for level, row in rows.items():
        offset = (widest - len(row)) * (NODE_WIDTH + H_GAP) / 2
        for position, node in enumerate(row):
            corners[node] = (MARGIN + offset + position * (NODE_WIDTH + H_GAP),
                             MARGIN + level * (NODE_HEIGHT + V_GAP))
    return corners


def plan_svg(explanation: dict) -> str:
    """The primitive graph as SVG: one `<g class="kernel">` per chosen kernel, drawn under the
    primitive boxes and edges."""
    primitives = explanation["primitives"]
    kernels = explanation["kernels"]
    colours = kernel_colours([k["id"] for k in kernels])
    corners = layered_layout(primitives)
    width = max((x for x, _ in corners.values()), default=0) + NODE_WIDTH + MARGIN
    height = max((y for _, y in corners.values()), default=0) + NODE_HEIGHT + MARGIN
    by_id = {p["id"]: p for p in primitives}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="plan-graph" width="{width:.0f}" '
             f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">']
    for kernel in kernels:
        parts.append(f'<g class="kernel" id="kernel-{kernel["id"]}" data-kernel="{kernel["id"]}"'
                     f' fill="{_hex(colours[kernel["id"]])}">')
        parts.append(f"<title>{html.escape(_kernel_title(kernel))}</title>")
        for node in kernel["primitives"]:
            x, y = corners[node]
            owners = by_id[node]["kernels"]
            stripe = NODE_WIDTH / len(owners)
            parts.append(f'<rect x="{x + owners.index(kernel["id"]) * stripe:.1f}" y="{y:.1f}" '
                         f'width="{stripe:.1f}" height="{NODE_HEIGHT}" rx="4"/>')
        parts.append("</g>")
    parts.append('<g class="edges">')
    for primitive in primitives:
        for producer in primitive["inputs"]:
            shared = set(by_id[producer]["kernels"]) & set(primitive["kernels"])
            x0, y0 = corners[producer]
            x1, y1 = corners[primitive["id"]]
            x0, y0, x1 = x0 + NODE_WIDTH / 2, y0 + NODE_HEIGHT, x1 + NODE_WIDTH / 2
            middle = (y0 + y1) / 2
            parts.append(f'<path class="edge {"inside" if shared else "memory"}" '
                         f'd="M{x0:.1f},{y0:.1f} C{x0:.1f},{middle:.1f} {x1:.1f},{middle:.1f} '
                         f'{x1:.1f},{y1:.1f}"/>')
    parts.append("</g>")
    for primitive in primitives:
        x, y = corners[primitive["id"]]
        classes = "primitive" + (" output" if primitive["output"] else "") + (
            " opaque" if primitive["opaque"] else "")
        origin = primitive["onnx"] or ""
        parts.append(f'<g class="{classes}" data-primitive="{primitive["id"]}">'
                     f"<title>{html.escape(_primitive_title(primitive))}</title>"
                     f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_WIDTH}" height="{NODE_HEIGHT}" '
                     f'rx="4"/><text x="{x + 6:.1f}" y="{y + 15:.1f}">'
                     f'{primitive["id"]} {html.escape(primitive["op"])}</text>'
                     f'<text class="origin" x="{x + 6:.1f}" y="{y + 30:.1f}">'
                     f"{html.escape(_shorten(origin, 24))}</text></g>")
    parts.append("</svg>")
    return "\n".join(parts)


def _kernel_title(kernel) -> str:
    cost = "n/a" if kernel["ms"] is None else f"{kernel['ms']:.4f} ms"
    return (f"{kernel['id']}: {' + '.join(kernel['ops'])} ({cost}, {kernel['cost_source']})"
            + (f"\nONNX: {'; '.join(kernel['onnx_ops'])}" if kernel["onnx_ops"] else ""))


def _primitive_title(primitive) -> str:
    shape = "x".join(map(str, primitive["shape"])) if primitive["shape"] else "?"
    origin = primitive["onnx"] or "untraced"
    guess = "" if primitive["onnx_exact"] or primitive["onnx"] is None else " (inferred)"
    return (f"primitive {primitive['id']}: {primitive['op']} ({primitive['kind']}) -> {shape}\n"
            f"ONNX: {origin}{guess}\nkernels: {', '.join(primitive['kernels'])}")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
main { display: flex; gap: 24px; align-items: flex-start; }
#graph { flex: 0 0 auto; overflow: auto; max-height: 92vh; border: 1px solid #ccc; }
#details { flex: 1 1 auto; min-width: 420px; }
table { border-collapse: collapse; margin-bottom: 16px; }
td, th { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #888; }
.primitive rect { fill: none; stroke: #555; }
.primitive.output rect { stroke-width: 2.5; }
.primitive.opaque rect { stroke-dasharray: 4 3; }
.primitive text { font: 12px monospace; fill: #111; pointer-events: none; }
.primitive text.origin { font-size: 10px; fill: #555; }
.edge { fill: none; stroke: #777; }
.edge.inside { stroke: #bbb; stroke-dasharray: 3 3; }
svg.focus .kernel { opacity: 0.25; }
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
  document.body.dataset.kernelsDrawn = String(groups.length);
})();
"""


def plan_html(explanation: dict) -> str:
    """One self-contained page: summary, the drawn graph, and the tables of the text form."""
    colours = kernel_colours([k["id"] for k in explanation["kernels"]])
    esc = html.escape
    rows = "\n".join(
        f'<tr data-kernel="{k["id"]}"><td><span class="swatch" style="background:'
        f'{_hex(colours[k["id"]])}"></span> {k["id"]}</td><td>{esc(" + ".join(k["ops"]))}</td>'
        f'<td>{esc(", ".join(map(str, k["primitives"])))}</td>'
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
    title = f"Korch plan: {explanation.get('model')}"
    opaque = (f"<p>Opaque ops kept as in the stock path: {esc(', '.join(explanation['opaque_ops']))}"
              "</p>" if explanation.get("opaque_ops") else "")
    summary = (f"{len(explanation['kernels'])} kernels on {esc(str(explanation.get('target_tag')))}"
               f"; modelled {_ms(explanation.get('modelled_ms'))} vs stock FuseOps "
               f"{_ms(explanation.get('stock_modelled_ms'))}; costs "
               f"{esc(str(explanation.get('costing')))}; solver {esc(explanation['solver_status'])}")
    data = json.dumps(explanation, sort_keys=True).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>{_STYLE}</style></head>
<body><h1>{esc(title)}</h1><p>{summary}</p>{opaque}
<main><div id="graph">{plan_svg(explanation)}</div>
<div id="details"><h2>Kernels (execution order)</h2>
<table><tr><th>kernel</th><th>primitives</th><th>ids</th><th>ONNX operators</th><th>ms</th>
<th>cost from</th></tr>
{rows}</table>
<h2>Recomputed primitives</h2><ul>{recomputed}</ul>
<h2>Compared with stock FuseOps</h2><ul>{''.join(diff_items)}</ul>
<h2>Solver</h2><table><tr><th>subproblem</th><th>primitives</th><th>candidates</th>
<th>status</th><th>gap</th><th>seconds</th></tr>
{solver}</table></div></main>
<script type="application/json" id="plan-data">{data}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


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
        label = f"{primitive['id']} {primitive['op']}\\n{primitive['onnx'] or ''}"
        extra = ", penwidth=2.5" if primitive["output"] else ""
        extra += ", peripheries=2" if primitive["opaque"] else ""
        lines.append(f'  p{primitive["id"]} [label="{_escape_dot(label)}", style="{style}", '
                     f'fillcolor="{fills}", tooltip={_quote(", ".join(primitive["kernels"]))}'
                     f"{extra}];")
    for primitive in explanation["primitives"]:
        for producer in primitive["inputs"]:
            lines.append(f"  p{producer} -> p{primitive['id']};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _escape_dot(text: str) -> str:
    return text.replace('"', '\\"')


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
