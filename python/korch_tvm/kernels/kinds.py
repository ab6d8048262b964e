"""Where the time goes, by kind of kernel: conv 1x1 / depthwise / 3x3 / other, matmul, memory.

`kernel_kind` reads a PrimFunc's TIR: a reduction block that multiplies two buffer loads is a
linear kernel; it is a convolution when one operand is read through a sliding window (an index
that adds an output position and a reduction variable, ``x[.., y*s + ry, ..]``), else a matmul.
For a convolution, the reduction variables inside windowed indices give the window (its size is
the product of their extents) and the others are the input channels per group (extent 1 means
one input channel per output channel: depthwise). Anything without such a block is
memory-bound (elementwise, reductions like softmax or norms, layout changes, pooling).

`compute_kind` is finer (COMPUTE_KINDS: batched matmuls with or without a transposed operand,
few-row matmuls, depthwise / grouped / dilated / strided convolutions, gathers): the kinds a
default schedule must handle, which bench/kind_floor.py measures against their floors.

`kind_times` sums per-kernel times of a module by these kinds; `plan_kind_times` does it for a
Korch plan report; `ort_kind_times` reads ONNX Runtime's profiler JSON and sums node times by
the same kinds, so the two can be compared side by side.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping

import tvm
import tvm.sym
import tvm_ffi

from ..support.tir_blocks import REDUCE
from .weight_packing import original_kernel_name

KINDS = ("conv1x1", "conv_depthwise", "conv3x3", "conv_other", "matmul", "memory")
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
                   else 0 for iv in block.iter_vars if int(iv.iter_type) == REDUCE}
    if not reduce_vars or not isinstance(block.body, tvm.tirx.BufferStore):
        return None
    spatial_vars = {iv.var for iv in block.iter_vars if int(iv.iter_type) != REDUCE}
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


# --------------------------------------------------------------------- compute kinds (finer)
# The kinds a default schedule must handle well, finer than KINDS: what the model zoo holds
# (bench/kind_floor.py reports each kind's distance from its roofline floor).
COMPUTE_KINDS = ("bmm_transposed", "bmm", "matmul_few_rows", "matmul", "conv_depthwise",
                 "conv_grouped", "conv_dilated", "conv_strided", "conv", "gather", "memory")
FEW_ROWS = 8  # a matmul with at most this many rows (a classifier head) is a GEMV in effect


def compute_kind(func: tvm.tirx.PrimFunc) -> str:
    """One of COMPUTE_KINDS for a PrimFunc as written.

    A matmul is read with its injective prologue inlined (a fused transpose shows in its
    indices): `bmm_transposed` when an operand's last index is not its contiguous axis (the
    reduction for the left operand, the output column for the right one, as in attention's
    Q K^T), `bmm` with batch axes, `matmul_few_rows` with at most FEW_ROWS rows. A convolution
    is depthwise, grouped (its input channel index is built from the output channel), dilated
    or strided by the coefficients of its window indices, else plain. A kernel without a
    contraction that loads through a loaded index is a gather (an embedding)."""
    for block in _collect(func.body, tvm.s_tir.SBlock, []):
        kind = _block_kind(block)
        if kind is None:
            continue
        if kind == "matmul":
            return _matmul_kind(func)
        return _conv_kind(block, kind)
    loads = _collect(func.body, _LOAD, [])
    if any(_collect(index, _LOAD, []) for load in loads for index in load.indices):
        return "gather"
    return "memory"


def _contraction(block):
    """(spatial vars in order with extents, reduction vars, the two multiplied loads)."""
    spatial = [(iv.var, _static_extent(iv)) for iv in block.iter_vars
               if int(iv.iter_type) != REDUCE]
    reduce_vars = {iv.var for iv in block.iter_vars if int(iv.iter_type) == REDUCE}
    for product in _collect(block.body.value, tvm.tirx.Mul, []):
        a, b = _strip_casts(product.a), _strip_casts(product.b)
        if isinstance(a, _LOAD) and isinstance(b, _LOAD):
            return spatial, reduce_vars, (a, b)
    return spatial, reduce_vars, None


def _static_extent(iter_var) -> int:
    extent = iter_var.dom.extent
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else 0


def _inlined(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """`func` with every block that can be inlined into its consumers inlined (as the CPU
    default schedule starts), so a matmul's loads show the layout it really reads."""
    # errors rendered briefly: refusals are expected, and a detailed one costs 5x a brief one
    schedule = tvm.s_tir.Schedule(tvm.IRModule({"main": func}), error_render_level="fast")
    changed = True
    while changed:
        changed = False
        for block in _collect(schedule.mod["main"].body, tvm.s_tir.SBlock, []):
            if block.name_hint == "root":
                continue
            try:
                schedule.compute_inline(schedule.get_sblock(block.name_hint))
            except Exception:  # noqa: BLE001 - not inlinable (a reduction, an output)
                continue
            changed = True
            break
    return schedule.mod["main"]


def _matmul_kind(func: tvm.tirx.PrimFunc) -> str:
    for block in _collect(_inlined(func).body, tvm.s_tir.SBlock, []):
        if _block_kind(block) != "matmul":
            continue
        spatial, reduce_vars, loads = _contraction(block)
        if loads is None or not spatial:
            return "matmul"
        column = spatial[-1][0]
        right = [load for load in loads if column in _vars_in(load)]
        left = [load for load in loads if column not in _vars_in(load)]
        if not right or not left:
            return "matmul"
        batch = [extent for var, extent in spatial[:-1]
                 if var in _vars_in(left[0]) and var in _vars_in(right[0]) and extent != 1]
        rows = 1
        for var, extent in spatial[:-1]:
            rows *= extent if var in _vars_in(left[0]) and var not in _vars_in(right[0]) else 1
        transposed = (column not in _vars_in(right[0].indices[-1])
                      or not _vars_in(left[0].indices[-1]) & reduce_vars)
        if batch:
            return "bmm_transposed" if transposed else "bmm"
        return "matmul_few_rows" if rows <= FEW_ROWS else "matmul"
    return "matmul"


def _conv_kind(block, kind: str) -> str:
    spatial, reduce_vars, loads = _contraction(block)
    extents = {iv.var: _static_extent(iv) for iv in block.iter_vars}
    spatial_vars = {var for var, _ in spatial}
    strided = dilated = grouped = False
    for load in loads or ():
        for index in load.indices:
            used = _vars_in(index)
            if not (used & spatial_vars and used & reduce_vars):
                continue
            if _collect(index, tvm.tirx.FloorDiv, []):
                grouped |= any(extents[var] > 1 for var in used & reduce_vars)
                continue
            ordered = sorted(used, key=lambda v: (v not in spatial_vars, str(v)))
            coefficients = tvm.sym.detect_linear_equation(index, ordered)
            for var, coefficient in zip(ordered, coefficients):
                value = int(coefficient) if isinstance(coefficient, tvm.tirx.IntImm) else 1
                strided |= var in spatial_vars and value > 1
                dilated |= var in reduce_vars and value > 1
    if grouped:
        return "conv_grouped"
    if kind == "conv_depthwise":
        return kind
    if dilated:
        return "conv_dilated"
    return "conv_strided" if strided else "conv"
