"""korch-tvm explain: the plan a Korch compile would build, shown without building anything.

`explain_model` runs the planning half of the pipeline (`passes.plan_korch`) and describes the
answer as plain data: each chosen kernel with its primitives, the ONNX operators they came from
(see frontend/onnx_trace.py for how, and how far to trust it) and its cost and where that cost came
from; the primitives computed by more than one kernel; how the plan differs from TVM's own FuseOps
groups on the same primitive graph; and the solver's status and gap per subproblem. The CLI renders
that data as text, JSON, a self-contained HTML page or Graphviz.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

logger = logging.getLogger("korch_tvm.explain")

FORMATS = ("text", "json", "html", "dot")


# The shared flags explain takes, from the one table in flags.py.
EXPLAIN_FLAGS = ("target", "tuning_logs", "trials", "time_budget", "layout", "input_shape",
                 "threads", "solver_time_limit", "substitutions", "library", "cache_state")


def add_arguments(parser) -> None:
    """Declare explain's flags on `parser` (the sub-command's argparse parser)."""
    from .common import add_verbosity
    from .flags import add_flags

    parser.add_argument("model", help="path to an ONNX model")
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="text (default), json, html (one self-contained page with the "
                             "primitive graph drawn) or dot (Graphviz)")
    parser.add_argument("-o", "--output", metavar="FILE", default=None,
                        help="write here instead of stdout (html: default MODEL.korch.html)")
    add_flags(parser, EXPLAIN_FLAGS)
    parser.add_argument("--predict-only", action="store_true",
                        help="measure nothing: plan on logged costs and cost-model predictions "
                             "(fast; may differ from the plan a measuring compile picks)")
    add_verbosity(parser)


def run(args) -> int:
    """Plan the model `args` names and write the explanation in `args.format`."""
    from .flags import config_from_args, input_shapes

    explanation = explain_model(args.model, config=config_from_args(args),
                                predict_only=args.predict_only,
                                input_shapes_override=input_shapes(args))
    text = render(explanation, args.format)
    output = args.output
    if output is None and args.format == "html":
        stem = os.path.splitext(os.path.basename(args.model))[0]
        output = f"{stem}.korch.html"
    if output is None:
        sys.stdout.write(text)
        return 0
    _write_text(output, text)
    if not args.quiet:
        print(f"wrote {os.path.abspath(output)}")
    return 0


def render(explanation: dict, fmt: str) -> str:
    """The explanation in one of FORMATS, as text ending in a newline."""
    if fmt == "json":
        import json

        return json.dumps(explanation, indent=2, sort_keys=True) + "\n"
    if fmt == "html":
        from ..report.plan_drawing import plan_html

        return plan_html(explanation)
    if fmt == "dot":
        from ..report.plan_drawing import plan_dot

        return plan_dot(explanation)
    from ..report.text import explain_lines

    return "\n".join(explain_lines(explanation)) + "\n"


def _write_text(path: str, text: str) -> None:
    from ..errors import KorchError

    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise KorchError(f"output directory '{directory}' does not exist")
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as err:
        raise KorchError(f"cannot write '{path}': {err.strerror}") from None


def explain_model(model, target=None, *, tuning_logs=None, trials=None,
                  time_budget=None, predict_only: bool = False, input_shapes_override=None,
                  num_threads=None, solver_time_limit=None, layout=None, config=None) -> dict:
    """Plan `model` (ONNX path, `onnx.ModelProto` or Relax `IRModule`) and describe the plan.

    `config` (a KorchConfig; default: KorchConfig()) says how; the keyword arguments (`target`,
    `tuning_logs`, `trials`, `time_budget`, `num_threads`, `solver_time_limit`, `layout`)
    override its fields only when given (None: as configured), as in `compile_model`.
    `predict_only` measures nothing; `input_shapes_override` ({input name: dims}) fixes dynamic
    inputs. Returns the plan as JSON-friendly data (see `describe_plan`).
    """
    from ..backend.target import configure_threads, target_tag
    from ..config import KorchConfig
    from ..errors import KorchError
    from ..pipeline.compile import has_operators
    from ..pipeline.korch import plan_korch

    config = (config or KorchConfig()).overridden(
        target=target, tuning_logs=tuning_logs, trials=trials, time_budget=time_budget,
        num_threads=num_threads, layout=layout,
        solver_time_limit=None if solver_time_limit is None else float(solver_time_limit))
    tvm_target = config.target  # resolved to a Target where the config was made
    configure_threads(config.num_threads)
    name, module, trace = _load(model, input_shapes_override)
    if not has_operators(module):
        raise KorchError(f"{name} has no operators: there is no plan to explain (it runs as is)")
    plan = plan_korch(module, config, predict_only=predict_only)
    explanation = describe_plan(plan, trace)
    exact = sum(p["onnx_exact"] for p in explanation["primitives"])
    logger.debug("%d of %d primitives traced to their ONNX operator exactly%s", exact,
                 len(explanation["primitives"]), "" if trace else " (no trace)")
    explanation.update(model=name, target=str(tvm_target), target_tag=target_tag(tvm_target),
                       costing="predicted (nothing measured)" if predict_only
                       else "measured where a plan needed it (lazy costing)")
    return explanation


def _load(model, shape_overrides):
    """(name, Relax module, OnnxTrace or None)."""
    import tvm

    from ..frontend.onnx_import import load_onnx
    from ..frontend.onnx_trace import import_onnx_traced

    if isinstance(model, tvm.IRModule):
        return "relax-module", model, None
    name = (os.path.basename(os.fspath(model)) if isinstance(model, (str, os.PathLike))
            else getattr(getattr(model, "graph", None), "name", "onnx-model"))
    module, trace = import_onnx_traced(load_onnx(model), shape_overrides)
    return name, module, trace


def describe_plan(plan, trace=None) -> dict:
    """A KorchPlan as JSON-friendly data: kernels, recomputation, stock diff, solver.

    `plan`: what `plan_korch` returned; `trace`: the OnnxTrace of its source model, or None
    (the primitives then name no ONNX operator).
    """
    graph = plan.graph
    full_report = plan.report()
    report = full_report["plan"]
    if trace is not None and plan.in_layout is not plan.source:  # converted: new vars
        trace = trace.through_rewrite(plan.source[graph.func_name],
                                      plan.in_layout[graph.func_name])
    origins = trace.origins(graph) if trace is not None else [None] * len(graph.nodes)
    origins = _alternatives_traced_to_what_they_replace(graph, origins)
    groups = plan.chosen_groups
    kernel_ids = [f"k{position}" for position in range(len(groups))]
    kernels_of = {node.index: [] for node in graph.nodes}
    for kernel_id, group in zip(kernel_ids, groups):
        for node in group:
            kernels_of[node].append(kernel_id)

    primitives = _describe_primitives(graph, origins, kernels_of)
    for site in graph.alternatives:  # which primitives an alternative offers, and by what rule
        for node in site.nodes:
            primitives[node]["alternative"] = site.rule
    kernels = _describe_kernels(plan, report["kernels"], groups, kernel_ids, primitives)
    recomputed = [{"primitive": p["id"], "op": p["op"], "kernels": p["kernels"]}
                  for p in primitives if len(p["kernels"]) > 1]
    return {
        "primitives": primitives,
        "kernels": kernels,
        "recomputed": recomputed,
        "stock_diff": stock_difference(groups, graph.stock_fusion_groups(), kernel_ids),
        "solver": report["solver"],
        "solver_status": report["solver_status"],
        "modelled_ms": report["modelled_ms"],
        "stock_modelled_ms": report["stock_modelled_ms"],
        "candidates": report["candidates"],
        "pruned": report["pruned"],
        "opaque_ops": report["opaque_ops"],
        "substitutions": report.get("substitutions"),
        "onnx_trace": None if trace is None else (
            "exact for each ONNX node's result; primitives split out of an operator are "
            "attributed to the first traced primitive downstream (onnx_exact=false)"),
        "tuning": full_report["tuning"],
        "layout": full_report["layout"],
        "layouts": {layout: entry["modelled_ms"]
                    for layout, entry in full_report["layouts"].items()},
    }


def _alternatives_traced_to_what_they_replace(graph, origins: list) -> list:
    """An alternative's primitives (graph/alternatives.py) are attributed to the ONNX operators
    of the primitives they recompute: an offered one to its original's, the others to the first
    replaced one's; never exact, since no ONNX node computes them."""
    origins = list(origins)
    for site in graph.alternatives:
        stand_in = dict(site.equivalences)
        for node in site.nodes:
            origin = origins[stand_in.get(node, site.replaced[0])]
            if origin is not None:
                origins[node] = dataclasses.replace(origin, exact=False)
    return origins


def _describe_primitives(graph, origins, kernels_of) -> list[dict]:
    """One entry per primitive: op, kind, shape, edges, its ONNX operator and its kernels."""
    primitives = []
    for node, origin in zip(graph.nodes, origins):
        operator = origin.operator if origin is not None else None
        primitives.append({
            "id": node.index, "op": node.op_name.removeprefix("relax."), "kind": node.kind,
            "shape": list(node.shape) if node.shape is not None else None,
            "inputs": list(node.inputs), "graph_inputs": list(node.graph_inputs),
            "output": node.index in graph.outputs,
            "onnx": operator.label if operator is not None else None,
            "onnx_exact": bool(origin.exact) if origin is not None else False,
            "kernels": kernels_of[node.index], "opaque": not node.fusible,
            "alternative": None})
    return primitives


def _describe_kernels(plan, entries, groups, kernel_ids, primitives) -> list[dict]:
    """One entry per chosen kernel: the plan report's entry, its ONNX operators, its error."""
    kernels = []
    for kernel_id, entry, group in zip(kernel_ids, entries, groups):
        onnx_ops = []
        for node in sorted(group):
            label = primitives[node]["onnx"]
            if label is not None and label not in onnx_ops:
                onnx_ops.append(label)
        cost = plan.costs.get(entry["key"]) if entry["key"] is not None else None
        kernels.append({"id": kernel_id, **entry, "onnx_ops": onnx_ops,
                        "error": getattr(cost, "error", None)})
    return kernels


def stock_difference(chosen_groups, stock_groups, kernel_ids) -> dict:
    """How the chosen kernels relate to FuseOps' groups on the same primitives.

    `chosen_groups` and `stock_groups`: sets of primitive ids; `kernel_ids`: a name per chosen
    group.

    A chosen kernel is `same` as a stock group, `merged` when it takes primitives from more than
    one stock group, or `part` of a single stock group; a stock group is `split` when its
    primitives are spread over more than one chosen kernel.
    """
    stock = [frozenset(group) for group in stock_groups]
    group_of = {node: g for g, group in enumerate(stock) for node in group}
    same, merged, part = [], [], []
    for kernel_id, group in zip(kernel_ids, chosen_groups):
        touched = sorted({group_of[node] for node in group if node in group_of})
        if not touched:  # only an alternative's primitives: no stock group has them
            part.append({"kernel": kernel_id, "stock_group": []})
        elif len(touched) > 1:
            merged.append({"kernel": kernel_id, "stock_groups": [sorted(stock[g]) for g in touched]})
        elif frozenset(group) == stock[touched[0]]:
            same.append(kernel_id)
        else:
            part.append({"kernel": kernel_id, "stock_group": sorted(stock[touched[0]])})
    split = []
    for group in stock:
        covering = [kernel_id for kernel_id, chosen in zip(kernel_ids, chosen_groups)
                    if group & frozenset(chosen)]
        if len(covering) > 1:
            split.append({"stock_group": sorted(group), "kernels": covering})
    return {"stock_kernels": len(stock), "chosen_kernels": len(kernel_ids), "same": same,
            "merged": merged, "part_of_stock": part, "split": split}
