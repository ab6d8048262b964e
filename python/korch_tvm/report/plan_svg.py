"""The explained plan as inline SVG: each kernel a box around its primitives, sized by its cost.

Laid out here, with no dependency: kernels in layers by longest path over the tensors they read
from memory (each layer ordered by the mean position of its producers), each kernel's
primitives listed inside its box in execution order, a bar in the box's header as long as the
kernel's modelled time is against the slowest kernel's (the ms written beside it), and the
tensors that go through memory drawn as edges labelled with their shapes. A primitive that
more than one kernel computes (recomputation) is listed in each of them, marked. Every string
that comes from the model is escaped; labels are cut at the right with an ellipsis, the full
text is in the element's <title> (shown on hover).
"""

from __future__ import annotations

import colorsys
import html

BOX_WIDTH, HEADER, ROW, PAD = 230, 40, 30, 6
H_GAP, V_GAP, MARGIN, LANE = 36, 46, 16, 9
CHARS_PER_PX = 1 / 6.7  # 11 px monospace


def kernel_colours(kernel_ids) -> dict[str, tuple[float, float, float]]:
    """Distinct, light hues (golden-angle steps), as HSV triples in [0, 1]."""
    return {kernel_id: ((index * 0.381966) % 1.0, 0.30, 0.98)
            for index, kernel_id in enumerate(kernel_ids)}


def hex_colour(hsv, darker: float = 1.0) -> str:
    hue, saturation, value = hsv
    if darker != 1.0:
        saturation, value = min(1.0, saturation / darker * 1.6), value * darker
    red, green, blue = colorsys.hsv_to_rgb(hue, saturation, value)
    return "#%02x%02x%02x" % (round(red * 255), round(green * 255), round(blue * 255))


def fit(text: str, chars: int) -> str:
    """`text` cut at the right to `chars` characters, an ellipsis marking the cut."""
    return text if len(text) <= chars else text[:max(chars - 1, 0)] + "…"


def shape_text(shape) -> str:
    return "x".join(map(str, shape)) if shape else "?"


def memory_edges(explanation: dict) -> list[tuple[int, str, str]]:
    """(tensor's primitive, producing kernel, reading kernel) for each tensor a kernel reads
    that it does not compute itself, once per reader; the producer is the first kernel (in
    execution order) that computes the tensor."""
    by_id = {p["id"]: p for p in explanation["primitives"]}
    edges = []
    for kernel in explanation["kernels"]:
        inside = set(kernel["primitives"])
        seen = set()
        for node in sorted(inside):
            for producer in by_id[node]["inputs"]:
                owners = by_id[producer]["kernels"]
                if producer in inside or producer in seen or not owners:
                    continue
                seen.add(producer)
                edges.append((producer, owners[0], kernel["id"]))
    return edges


def kernel_layout(explanation: dict, edges) -> tuple[dict, list[float]]:
    """({kernel: (x, y, height, level)} of each box, the bottom y of each level): one row of
    boxes per longest-path depth."""
    kernels = explanation["kernels"]
    producers = {k["id"]: [] for k in kernels}
    for _, source, reader in edges:
        producers[reader].append(source)
    depth: dict[str, int] = {}
    for kernel in kernels:  # execution order: producers come first
        depth[kernel["id"]] = 1 + max((depth.get(p, 0) for p in producers[kernel["id"]]),
                                      default=-1)
    rows: dict[int, list[str]] = {}
    for kernel in kernels:
        rows.setdefault(depth[kernel["id"]], []).append(kernel["id"])
    order = {k["id"]: index for index, k in enumerate(kernels)}
    column: dict[str, float] = {}
    for level in sorted(rows):
        def barycentre(kernel_id):
            placed = [column[p] for p in producers[kernel_id] if p in column]
            return (sum(placed) / len(placed) if placed else order[kernel_id], order[kernel_id])
        rows[level].sort(key=barycentre)
        for position, kernel_id in enumerate(rows[level]):
            column[kernel_id] = position
    heights = {k["id"]: HEADER + ROW * len(k["primitives"]) + PAD for k in kernels}
    widest = max((len(row) for row in rows.values()), default=1)
    boxes, bottoms, top = {}, [], MARGIN
    for level in sorted(rows):
        offset = (widest - len(rows[level])) * (BOX_WIDTH + H_GAP) / 2
        for position, kernel_id in enumerate(rows[level]):
            boxes[kernel_id] = (MARGIN + offset + position * (BOX_WIDTH + H_GAP), top,
                                heights[kernel_id], level)
        top += max(heights[k] for k in rows[level])
        bottoms.append(top)
        top += V_GAP
    return boxes, bottoms


def plan_svg(explanation: dict) -> str:
    """The plan as one <svg>: the memory edges under a `<g class="kernel">` per chosen kernel."""
    kernels = explanation["kernels"]
    by_id = {p["id"]: p for p in explanation["primitives"]}
    colours = kernel_colours([k["id"] for k in kernels])
    edges = memory_edges(explanation)
    boxes, bottoms = kernel_layout(explanation, edges)
    right = max((x for x, _, _, _ in boxes.values()), default=0) + BOX_WIDTH
    edge_parts, lanes = _edges(edges, boxes, bottoms, by_id, right)
    width = right + LANE * lanes + MARGIN
    height = max((y + h for _, y, h, _ in boxes.values()), default=0) + MARGIN
    slowest = max((k["ms"] for k in kernels if k["ms"] is not None), default=0.0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" id="plan-graph" width="{width:.0f}" '
             f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">',
             '<g class="edges">', *edge_parts, "</g>"]
    for kernel in kernels:
        parts += _kernel_box(kernel, boxes[kernel["id"]], colours[kernel["id"]], by_id, slowest)
    parts.append("</svg>")
    return "\n".join(parts)


def _kernel_box(kernel, box, colour, by_id, slowest) -> list[str]:
    esc = html.escape
    x, y, height, _ = box
    kernel_id = esc(kernel["id"])
    ms = kernel["ms"]
    cost = "n/a" if ms is None else f"{ms:.4f} ms"
    track = BOX_WIDTH - 2 * PAD
    bar = 0.0 if not ms or not slowest else max(1.0, track * ms / slowest)
    parts = [f'<g class="kernel" id="kernel-{kernel_id}" data-kernel="{kernel_id}">',
             f"<title>{esc(kernel_title(kernel))}</title>",
             f'<rect class="box" x="{x:.1f}" y="{y:.1f}" width="{BOX_WIDTH}" height="{height}" '
             f'rx="6" fill="{hex_colour(colour)}" stroke="{hex_colour(colour, 0.55)}"/>',
             f'<text class="kernel-name" x="{x + PAD:.1f}" y="{y + 15:.1f}">{kernel_id}'
             f"{' = stock' if kernel['stock_group'] else ''}</text>",
             f'<text class="cost-text" x="{x + BOX_WIDTH - PAD:.1f}" y="{y + 15:.1f}">'
             f"{esc(cost)} · {esc(fit(str(kernel['cost_source']), 8))}</text>",
             f'<rect class="cost-track" x="{x + PAD:.1f}" y="{y + 22:.1f}" width="{track}" '
             f'height="9" rx="2"/>',
             f'<rect class="cost" x="{x + PAD:.1f}" y="{y + 22:.1f}" width="{bar:.1f}" '
             f'height="9" rx="2" fill="{hex_colour(colour, 0.6)}"/>']
    for row, node in enumerate(sorted(kernel["primitives"])):
        parts.append(_primitive_row(by_id[node], kernel["id"], x + PAD, y + HEADER + row * ROW))
    parts.append("</g>")
    return parts


def _primitive_row(primitive, kernel_id, x, y) -> str:
    esc = html.escape
    classes = "primitive" + (" output" if primitive["output"] else "") + (
        " opaque" if primitive["opaque"] else "") + (
        " recomputed" if len(primitive["kernels"]) > 1 else "")
    inner = BOX_WIDTH - 2 * PAD
    shape = fit(shape_text(primitive["shape"]), 14)
    name_chars = int((inner - 8) * CHARS_PER_PX) - len(shape) - 1
    mark = "↻ " if len(primitive["kernels"]) > 1 else ""
    label = fit(f"{mark}{primitive['id']} {primitive['op']}", name_chars)
    origin = fit(primitive["onnx"] or "(not traced)", int((inner - 8) * CHARS_PER_PX * 1.1))
    return (f'<g class="{classes}" data-primitive="{primitive["id"]}" '
            f'data-in-kernel="{esc(kernel_id)}"><title>{esc(primitive_title(primitive))}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{inner}" height="{ROW - 3}" rx="3"/>'
            f'<text x="{x + 4:.1f}" y="{y + 12:.1f}">{esc(label)}</text>'
            f'<text class="shape" x="{x + inner - 4:.1f}" y="{y + 12:.1f}">{esc(shape)}</text>'
            f'<text class="origin" x="{x + 4:.1f}" y="{y + 24:.1f}">{esc(origin)}</text></g>')


def _edges(edges, boxes, bottoms, by_id, right) -> tuple[list[str], int]:
    """(SVG of the memory edges, side lanes used). Each edge leaves the bottom of its
    producer's box and enters the top of its reader's, spread over the boxes' widths; one
    between adjacent levels is a curve, a longer one runs down a lane of its own right of every
    box, so that no edge crosses a box. Each is labelled with its tensor's shape."""
    leaving: dict[str, list] = {}
    arriving: dict[str, list] = {}
    for edge in edges:
        leaving.setdefault(edge[1], []).append(edge)
        arriving.setdefault(edge[2], []).append(edge)

    def spread(box, index, count):
        return box[0] + BOX_WIDTH * (index + 1) / (count + 1)

    parts, lanes = [], 0
    for edge in edges:
        tensor, source, reader = edge
        x0 = spread(boxes[source], leaving[source].index(edge), len(leaving[source]))
        y0 = boxes[source][1] + boxes[source][2]
        x1 = spread(boxes[reader], arriving[reader].index(edge), len(arriving[reader]))
        y1 = boxes[reader][1]
        shape = shape_text(by_id[tensor]["shape"])
        if boxes[reader][3] == boxes[source][3] + 1:
            middle = (y0 + y1) / 2
            path = (f"M{x0:.1f},{y0:.1f} C{x0:.1f},{middle:.1f} {x1:.1f},{middle:.1f} "
                    f"{x1:.1f},{y1:.1f}")
            label_x, label_y = (x0 + x1) / 2 + 4, (y0 + y1) / 2 + 4
        else:
            lane = right + LANE * (lanes + 1)
            lanes += 1
            below = bottoms[boxes[source][3]] + 10 + 5 * (lanes % 4)
            above = y1 - 10 - 5 * (lanes % 4)
            path = (f"M{x0:.1f},{y0:.1f} V{below:.1f} H{lane:.1f} V{above:.1f} H{x1:.1f} "
                    f"V{y1:.1f}")
            label_x, label_y = x0 + 4, y0 + 11
        parts.append(f'<g class="edge" data-tensor="{tensor}"><title>'
                     f'{html.escape(f"primitive {tensor} ({source} -> {reader}): {shape}")}'
                     f'</title><path d="{path}"/><path class="arrow" d="M{x1 - 4:.1f},'
                     f'{y1 - 7:.1f} L{x1:.1f},{y1:.1f} L{x1 + 4:.1f},{y1 - 7:.1f} Z"/>'
                     f'<text class="edge-shape" x="{label_x:.1f}" y="{label_y:.1f}">'
                     f"{html.escape(fit(shape, 18))}</text></g>")
    return parts, lanes


def kernel_title(kernel) -> str:
    cost = "n/a" if kernel["ms"] is None else f"{kernel['ms']:.4f} ms"
    stock = ", the same group as FuseOps'" if kernel["stock_group"] else ""
    return (f"{kernel['id']}: {' + '.join(kernel['ops'])} ({cost}, {kernel['cost_source']}"
            f"{stock})"
            + (f"\nONNX: {'; '.join(kernel['onnx_ops'])}" if kernel["onnx_ops"] else ""))


def primitive_title(primitive) -> str:
    origin = primitive["onnx"] or "untraced"
    guess = "" if primitive["onnx_exact"] or primitive["onnx"] is None else " (inferred)"
    return (f"primitive {primitive['id']}: {primitive['op']} ({primitive['kind']}) -> "
            f"{shape_text(primitive['shape'])}\nONNX: {origin}{guess}\n"
            f"kernels: {', '.join(primitive['kernels'])}")
