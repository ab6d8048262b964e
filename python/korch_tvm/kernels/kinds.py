"""Where the time goes, by kind of kernel: conv 1x1 / depthwise / 3x3 / other, matmul, memory.

`kernel_kind` reads a PrimFunc's TIR: a reduction block that multiplies two buffer loads is a
linear kernel; it is a convolution when one operand is read through a sliding window (an index
that adds an output position and a reduction variable, ``x[.., y*s + ry, ..]``), else a matmul.
For a convolution, the reduction variables inside windowed indices give the window (its size is
the product of their extents) and the others are the input channels per group (extent 1 means
one input channel per output channel: depthwise). Anything without such a block is
memory-bound (elementwise, reductions like softmax or norms, layout changes, pooling).

`kind_times` sums per-kernel times of a module by these kinds; `plan_kind_times` does it for a
Korch plan report; `ort_kind_times` reads ONNX Runtime's profiler JSON and sums node times by
the same kinds, so the two can be compared side by side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

import tvm
import tvm_ffi

from .weight_packing import original_kernel_name

KINDS = ("conv1x1", "conv_depthwise", "conv3x3", "conv_other", "matmul", "memory")
_REDUCE = 2  # IterVar.CommReduce
_LOAD = tvm.ir.expr.TensorLoad  # what TIR's BufferLoad is in 0.27 (tvm.tirx.BufferLoad is a builder)


# --------------------------------------------------------------------- TIR walking
def _children(node):
    for field in type(node).__tvm_ffi_type_info__.fields:
        value = getattr(node, field.name, None)
        if isinstance(value, tvm_ffi.Array):
            yield from (item for item in value if isinstance(item, tvm_ffi.Object))
        elif isinstance(value, tvm_ffi.Object):
            yield value


def _collect(node, wanted: type, found: list) -> list:
    """Every node of type `wanted` below `node` (statements and expressions), pre-order."""
    if isinstance(node, wanted):
        found.append(node)
    if isinstance(node, (tvm.tirx.Var, tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return found  # leaves: do not walk into buffer shapes or variable types
    for child in _children(node):
        _collect(child, wanted, found)
    return found


def _vars_in(expr) -> set:
    return {v for v in _collect(expr, tvm.tirx.Var, [])}


def _strip_casts(expr):
    while isinstance(expr, tvm.tirx.Cast):
        expr = expr.value
    return expr


# --------------------------------------------------------------------- classification
def _block_kind(block) -> str | None:
    """The linear kind of one block, or None if it does not multiply-accumulate two loads."""
    reduce_vars = {iv.var: int(iv.dom.extent) if isinstance(iv.dom.extent, tvm.tirx.IntImm)
                   else 0 for iv in block.iter_vars if int(iv.iter_type) == _REDUCE}
    if not reduce_vars or not isinstance(block.body, tvm.tirx.BufferStore):
        return None
    spatial_vars = {iv.var for iv in block.iter_vars if int(iv.iter_type) != _REDUCE}
    operands = None
    for product in _collect(block.body.value, tvm.tirx.Mul, []):
        a, b = _strip_casts(product.a), _strip_casts(product.b)
        if isinstance(a, _LOAD) and isinstance(b, _LOAD):
            operands = (a, b)
            break
    if operands is None:
        return None
    if not all(_vars_in(load) & set(reduce_vars) for load in operands):
        return None  # e.g. a scale by a constant buffer inside a sum: not a contraction
    window: set = set()
    for load in operands:
        for index in load.indices:
            used = _vars_in(index)
            if used & spatial_vars and used & set(reduce_vars):
                window |= used & set(reduce_vars)
    if not window:
        return "matmul"
    channels = 1
    for var, extent in reduce_vars.items():
        if var not in window:
            channels *= extent
    if channels == 1:
        return "conv_depthwise"
    sizes = sorted(reduce_vars[v] for v in window)
    size = 1
    for extent in sizes:
        size *= extent
    if size == 1:
        return "conv1x1"
    if [s for s in sizes if s != 1] == [3, 3]:
        return "conv3x3"
    return "conv_other"


def kernel_kind(func: tvm.tirx.PrimFunc) -> str:
    """One of KINDS for a PrimFunc as written (before scheduling: the CPU default schedule
    inlines padding and drops unit loops, which hides a convolution's window); the first
    linear block found decides, otherwise "memory"."""
    for block in _collect(func.body, tvm.s_tir.SBlock, []):
        kind = _block_kind(block)
        if kind is not None:
            return kind
    return "memory"


def module_kernel_kinds(mod: tvm.IRModule) -> dict[str, str]:
    """Kind of every PrimFunc by name; a kernel split by weight pre-packing (``k_prepacked``)
    is listed under its original name ``k``, and the pre-packing functions themselves (run
    once, at compile time) are left out."""
    kinds = {}
    for global_var, func in mod.functions_items():
        if isinstance(func, tvm.tirx.PrimFunc) and not global_var.name_hint.endswith(
                "_weight_prepack"):
            kinds[original_kernel_name(global_var.name_hint)] = kernel_kind(func)
    return kinds


def _empty() -> dict[str, float]:
    return {kind: 0.0 for kind in KINDS}


def kind_times(mod: tvm.IRModule, kernel_ms: Mapping[str, float],
               calls: Mapping[str, int] | None = None) -> dict[str, float]:
    """Milliseconds per kind: `kernel_ms[name]` (time of one call) times `calls[name]` (1 if not
    given), summed by the kind of the PrimFunc `name` in `mod`. Names missing from `mod` (an
    opaque op) count as "memory"; kernels without a time are skipped."""
    kinds = module_kernel_kinds(mod)
    totals = _empty()
    for name, ms in kernel_ms.items():
        if ms is None:
            continue
        count = 1 if calls is None else calls.get(name, 1)
        totals[kinds.get(original_kernel_name(name), "memory")] += float(ms) * count
    return totals


def plan_kind_times(mod: tvm.IRModule, plan: Mapping, prefix: str = "korch_k") -> dict[str, float]:
    """Milliseconds per kind of a Korch plan: ``plan["kernels"][g]`` is kernel ``<prefix><g>`` of
    the rewritten module (its ``ms`` is the per-kernel cost the plan was chosen with)."""
    kernel_ms = {f"{prefix}{g}": entry.get("ms") for g, entry in enumerate(plan["kernels"])}
    return kind_times(mod, kernel_ms)


# --------------------------------------------------------------------- ONNX Runtime
def _ort_conv_kind(shapes: list) -> str:
    """Kind of an ORT Conv node from its input shapes: data [N, C, ...], weight [O, C/g, k...]."""
    if len(shapes) < 2 or len(shapes[1]) < 3:
        return "conv_other"
    data, weight = shapes[0], shapes[1]
    window = [int(k) for k in weight[2:]]
    per_group = int(weight[1])
    channels = int(data[1]) if len(data) > 1 else per_group
    if per_group == 1 and channels > 1:
        return "conv_depthwise"
    if all(k == 1 for k in window):
        return "conv1x1"
    if window == [3, 3]:
        return "conv3x3"
    return "conv_other"


_ORT_CONV_OPS = {"Conv", "FusedConv", "NhwcFusedConv", "NhwcConv", "QLinearConv", "ConvInteger",
                 "ConvTranspose"}
_ORT_MATMUL_OPS = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulInteger", "QLinearMatMul",
                   "MatMulNBits", "Attention", "MultiHeadAttention", "TransposeMatMul",
                   "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "Einsum"}


def ort_node_kind(op_name: str, input_shapes: Iterable) -> str:
    """Kind of one ORT profiler node (fused attention counts as matmul)."""
    if op_name in _ORT_CONV_OPS:
        shapes = [list(next(iter(entry.values()))) if isinstance(entry, Mapping) else list(entry)
                  for entry in input_shapes]
        return _ort_conv_kind(shapes)
    if op_name in _ORT_MATMUL_OPS:
        return "matmul"
    return "memory"


def ort_kind_times(profile, skip_runs: int = 1) -> dict[str, float]:
    """Milliseconds per kind per run, from ORT's profiler JSON (a path or the parsed list).

    The profile is what ``SessionOptions.enable_profiling`` writes: node events
    (``cat == "Node"``, name ``*_kernel_time``, ``dur`` in microseconds) and one
    ``model_run`` event per run. The first `skip_runs` runs (warm-up) are dropped and the rest
    averaged.
    """
    if isinstance(profile, (str, os.PathLike)):
        with open(profile) as handle:
            profile = json.load(handle)
    runs = sorted(e["ts"] for e in profile if e.get("name") == "model_run")
    start = runs[skip_runs] if len(runs) > skip_runs else None
    counted = max(1, len(runs) - skip_runs)
    totals = _empty()
    for event in profile:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
            continue
        if start is not None and event["ts"] < start:
            continue
        args = event.get("args", {})
        kind = ort_node_kind(args.get("op_name", ""), args.get("input_type_shape", []))
        totals[kind] += float(event["dur"]) / 1e3
    return {kind: ms / counted for kind, ms in totals.items()}
