"""What a tuning log may ask TVM to do: an allowlist checked on the JSON before TVM reads it.

A record's schedule trace is a program for TVM's scheduler, and some of its instructions carry
code: `Annotate(loop, "pragma_import_llvm", <LLVM IR>)` links that IR into the built library,
where a module constructor runs it when the library is loaded. Tuning logs are shared and
shipped, so a log is treated as untrusted data. `TuningRecord.from_json` already builds TVM
objects from the JSON (it replays the trace), so the check here reads only the JSON: it must
run first, and it must be fast (a log holds thousands of records).

What is allowed is what MetaSchedule's own schedule rules and postprocessors (and dlight's GPU
rules, and korch_tvm's CPU default schedule) emit for `llvm` and `cuda` targets in TVM 0.27:
their instruction kinds, their annotation keys with the value shapes they use, their storage
scopes and thread axes, and layout maps (IndexMap JSON) made of plain index arithmetic.
Anything else is refused with a one-line reason: an unknown instruction kind, any other
annotation key (every `pragma_import_*`, unknown pragmas), a string where a name or a number
belongs, a map, or an IndexMap holding anything but integer arithmetic on its own variables.

A workload (the kernel a record schedules) is TIR that `logs --check` builds and runs as
written, so it is checked too: no calls that name an external or packed function, no
`pragma_import_*` or other unknown pragma anywhere in it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import struct

# ---- instruction kinds ---------------------------------------------------------------------
# Every kind the rules and postprocessors of MetaSchedule (src/s_tir/meta_schedule), dlight and
# backend/cpu_schedule.py call, under TVM's instruction names.
INSTRUCTION_KINDS = frozenset({
    "GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers",
    "Split", "LoopPartition", "Fuse", "Reorder", "AddUnitLoop",
    "Parallel", "Vectorize", "Bind", "Unroll",
    "CacheRead", "CacheWrite", "ReadAt", "WriteAt", "ReIndex", "SetScope", "StorageAlign",
    "ComputeAt", "ReverseComputeAt", "ComputeInline", "ReverseComputeInline",
    "RFactor", "DecomposeReduction", "Blockize", "Tensorize", "PadEinsum",
    "TransformLayout", "TransformBlockLayout",
    "Annotate", "Unannotate",
    "SamplePerfectTile", "SamplePartitionedTile", "SampleCategorical", "SampleComputeLocation",
    "EnterPostproc",
})

_RV = re.compile(r"[blv][0-9]{1,7}")  # a block, loop or expression variable of the trace
_RV_LIST = re.compile(r"([blv][0-9]{1,7}|None)( ([blv][0-9]{1,7}|None))*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")  # a block, function or intrinsic name
_SCOPE = re.compile(r"global|local|shared(\.dyn)?|warp|wmma\.(matrix_a|matrix_b|accumulator)"
                    r"|m16n8k8\.matrix[ABC]")
_THREAD_AXIS = re.compile(r"(blockIdx|threadIdx|vthread)\.[xyz]|vthread")

# String attributes by instruction kind: position -> the pattern the string must match.
_STRING_ATTRS = {
    "GetSBlock": {0: _NAME, 1: _NAME},
    "CacheRead": {1: _SCOPE}, "CacheWrite": {1: _SCOPE}, "ReadAt": {1: _SCOPE},
    "WriteAt": {1: _SCOPE}, "SetScope": {1: _SCOPE},
    "Bind": {0: _THREAD_AXIS},
    "Tensorize": {0: _NAME},
}

# ---- annotations ---------------------------------------------------------------------------
_INT, _RV_OR_INT, _INT_LIST = "int", "variable or int", "list of ints"
_TILING = re.compile(r'"[SR]{0,16}"')  # the tiling structure, e.g. "SSRSRS"
_QUOTED_NAME = re.compile(r'"[A-Za-z_][A-Za-z0-9_.]{0,127}"')  # a tensor intrinsic, a layout tag

# Key -> the value it takes, as the rule that writes it does (verified against TVM 0.27).
ANNOTATIONS = {
    "meta_schedule.tiling_structure": _TILING,
    "meta_schedule.cooperative_fetch": _RV_OR_INT,
    "meta_schedule.thread_extent_low_inclusive": _INT,
    "meta_schedule.thread_extent_high_inclusive": _INT,
    "meta_schedule.random_compute_producer": _INT,
    "meta_schedule.parallel": _INT,
    "meta_schedule.vectorize": _INT,
    "meta_schedule.unroll_explicit": _RV_OR_INT,
    "meta_schedule.unroll_implicit": _RV_OR_INT,
    "meta_schedule.layout_rewrite_preproc": _INT,
    "meta_schedule.auto_tensorize": _QUOTED_NAME,
    "meta_schedule.auto_tensorize_init": _QUOTED_NAME,
    "pragma_auto_unroll_max_step": _INT,
    "pragma_unroll_explicit": _INT,
    "pragma_vectorize": _INT,
    "software_pipeline_stage": _INT_LIST,
    "software_pipeline_order": _INT_LIST,
    "software_pipeline_async_stages": _INT_LIST,
    "warp_execution": _INT,
    "vector_bytes": _INT,
    "local_stage": _RV_OR_INT,
    "double_buffer_scope": _INT,
    "tir.manifest_shared_memory_local_stage": _INT,
    "tirx.manifest_shared_memory_local_stage": _INT,
    "permuted_layout": _QUOTED_NAME,
}

# Keys MetaSchedule only removes: its search drops a block's "schedule_rule" (the attribute by
# which TOPI names a custom rule, e.g. max pooling's "meta_schedule.pool_max") before its own
# rules schedule the block. Setting one would name a function for a later search to look up, so
# only the removal is allowed.
REMOVED_ONLY = frozenset({"schedule_rule"})

# ---- IndexMap JSON -------------------------------------------------------------------------
# Node types of a layout map of plain index arithmetic (TVM's JSON graph), with the fields each
# may have. Every field is a reference to another node, except `dtype`.
_INDEX_MAP_NODES = {
    "None": None, "int": None, "ffi.String": None, "ffi.Array": None,
    "ir.PrimType": {"span", "dtype"},
    "ir.Var": {"span", "ty", "name"},
    "ir.IntImm": {"span", "ty", "value"},
    "prim.Cast": {"span", "ty", "value"},
    "tirx.IndexMap": {"initial_indices", "final_indices", "inverse_index_map"},
    # Where a variable was written in Python (debug information only, never code): a map made
    # with source spans holds them.
    "ir.SourceName": None,
    "ir.Span": {"source_name", "line", "column", "end_line", "end_column"},
    **{f"prim.{op}": {"span", "ty", "a", "b"}
       for op in ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max")},
}
_INDEX_DTYPE = re.compile(r"u?int(8|16|32|64)|bool")
_MAX_JSON_CHARS = 1 << 20

# ---- workloads -----------------------------------------------------------------------------
# Ops that call a function by the name given in their arguments. Our kernels (every workload of
# the shipped logs, and what Relax legalization emits for the ONNX operators we support) call
# none of them; their math is TIR intrinsics (`tirx.exp`, `tirx.rsqrt`, ...) that TVM lowers.
_NAMED_CALL = re.compile(r".*(extern|packed|call_llvm|call_spirv|asm|tvm_call|ffi_kernel).*")
EXTERNAL_CALLS_ALLOWED: frozenset[str] = frozenset()
_OP_NAME = re.compile(r"(tirx|prim)\.[A-Za-z0-9_]{1,64}")
_PRAGMAS_ALLOWED = frozenset(key for key in ANNOTATIONS if key.startswith("pragma_"))


class Refused(ValueError):
    """A record or workload the policy does not allow; the message is the one-line reason."""


def check_record(record) -> None:
    """Raise `Refused` unless `record` ([trace, run_secs, target, args_info], as in the record
    file) asks only for what the allowlist holds."""
    if not (isinstance(record, list) and len(record) == 4):
        raise Refused("not a [trace, run_secs, target, args_info] record")
    trace, _, target, _ = record
    if not (isinstance(trace, list) and len(trace) == 2
            and all(isinstance(part, list) for part in trace)):
        raise Refused("the trace is not an [instructions, decisions] pair")
    instructions, decisions = trace
    for number, instruction in enumerate(instructions):
        try:
            _check_instruction(instruction)
        except Refused as err:
            raise Refused(f"instruction {number}: {err}") from None
    for decision in decisions:
        if not (isinstance(decision, list) and len(decision) == 2 and _is_int(decision[0])
                and (decision[1] is None or _is_int(decision[1]) or _is_int_list(decision[1]))):
            raise Refused(f"a decision is not [index, int or ints]: {_clip(decision)}")
    if target is not None and not (isinstance(target, dict)
                                   and target.get("kind") in ("llvm", "cuda")):
        raise Refused(f"the record's target is not an llvm or cuda target: {_clip(target)}")


def _check_instruction(instruction) -> None:
    if not (isinstance(instruction, list) and len(instruction) == 4):
        raise Refused("not [kind, inputs, attrs, outputs]")
    kind, inputs, attrs, outputs = instruction
    if kind not in INSTRUCTION_KINDS:
        raise Refused(f"instruction kind {_clip(kind)} is not one MetaSchedule emits")
    if not (isinstance(inputs, list) and isinstance(attrs, list) and isinstance(outputs, list)):
        raise Refused(f"{kind}: inputs, attrs and outputs must be lists")
    if outputs and not _variables(outputs):
        raise Refused(f"{kind}: an output is not a variable name")
    if kind in ("Annotate", "Unannotate"):
        return _check_annotation(kind, inputs, attrs)
    if not _variables(inputs):  # the common case, checked at once
        for value in inputs:
            _check_input(kind, value)
    patterns = _STRING_ATTRS.get(kind, {})
    for position, value in enumerate(attrs):
        if (kind, position) == ("TransformBlockLayout", 0) or (
                (kind, position) == ("TransformLayout", 2) and value is not None):
            _check_index_map(value)  # the layout map, or the padding value: an IndexMap
        elif isinstance(value, str):
            pattern = patterns.get(position)
            if pattern is None or not pattern.fullmatch(value):
                raise Refused(f"{kind}: attribute {position} {_clip(value)} is not allowed")
        elif not _is_plain(value):
            raise Refused(f"{kind}: attribute {position} is not a number: {_clip(value)}")


def _check_input(kind: str, value) -> None:
    """Inputs are trace variables, None, numbers, lists of them, or an IndexMap."""
    if isinstance(value, list):
        for item in value:
            _check_input(kind, item)
    elif isinstance(value, str):
        if value.startswith("{"):
            _check_index_map(value)
        elif value != "None" and not _RV.fullmatch(value):
            raise Refused(f"{kind}: input {_clip(value)} is not a variable of the trace")
    elif not _is_plain(value):
        raise Refused(f"{kind}: input {_clip(value)} is not allowed")


def _check_annotation(kind: str, inputs: list, attrs: list) -> None:
    if not (len(attrs) == 1 and isinstance(attrs[0], str)):
        raise Refused(f"{kind}: the attributes are not one annotation key")
    key = attrs[0]
    expected = ANNOTATIONS.get(key)
    if expected is None and not (kind == "Unannotate" and key in REMOVED_ONLY):
        raise Refused(f"annotation key {_clip(key)} is not one MetaSchedule writes")
    if not (inputs and isinstance(inputs[0], str) and _RV.fullmatch(inputs[0])):
        raise Refused(f"{kind} {key}: the target is not a block or loop of the trace")
    if kind == "Unannotate":
        if len(inputs) != 1:
            raise Refused(f"Unannotate {key}: takes one input")
        return
    if len(inputs) != 2:
        raise Refused(f"Annotate {key}: takes a block or loop and a value")
    value = inputs[1]
    if _annotation_value_fits(expected, value):
        return
    shown = expected if isinstance(expected, str) else "a name"
    raise Refused(f"Annotate {key}: value {_clip(value)} is not a {shown}")


def _annotation_value_fits(expected, value) -> bool:
    if isinstance(expected, re.Pattern):
        return isinstance(value, str) and expected.fullmatch(value) is not None
    if expected == _INT_LIST:
        return _is_int_list(value)
    if _is_int(value) or isinstance(value, bool):
        return True
    return expected == _RV_OR_INT and isinstance(value, str) and value.startswith("v") and \
        _RV.fullmatch(value) is not None


def _check_index_map(text) -> None:
    """An IndexMap in TVM's JSON graph form whose nodes are index arithmetic only."""
    if not isinstance(text, str) or len(text) > _MAX_JSON_CHARS:
        raise Refused("a layout map is not an IndexMap of bounded size")
    problem = _index_map_problem(text)
    if problem is not None:
        raise Refused(problem)


@functools.lru_cache(maxsize=4096)
def _index_map_problem(text: str) -> str | None:
    """Why `text` is not an allowed IndexMap, or None; cached (a log repeats its maps)."""
    try:
        _check_index_map_graph(text)
    except Refused as err:
        return str(err)
    return None


def _check_index_map_graph(text: str) -> None:
    try:
        graph = json.loads(text)
        nodes, root = graph["nodes"], graph["root_index"]
    except (ValueError, KeyError, TypeError):
        raise Refused("a layout map is not JSON of a TVM object") from None
    if not (isinstance(nodes, list) and _is_int(root) and 0 <= root < len(nodes)
            and isinstance(nodes[root], dict) and nodes[root].get("type") == "tirx.IndexMap"):
        raise Refused("a layout map is not an IndexMap")
    for node in nodes:
        _check_index_map_node(node, len(nodes))


def _check_index_map_node(node, count: int) -> None:
    kind = node.get("type") if isinstance(node, dict) else None
    if kind not in _INDEX_MAP_NODES:
        raise Refused(f"a layout map holds a {_clip(kind)}, not plain index arithmetic")
    data = node.get("data")
    fields = _INDEX_MAP_NODES[kind]
    if kind == "None":
        ok = data is None
    elif kind == "int":
        ok = _is_int(data)
    elif kind == "ffi.String":
        ok = isinstance(data, str) and _NAME.fullmatch(data) is not None
    elif kind == "ir.SourceName":
        ok = isinstance(data, str) and len(data) <= 256 and data.isprintable()
    elif kind == "ir.Span":
        ok = isinstance(data, dict) and set(data) == fields and all(
            _is_int(value) and (name != "source_name" or 0 <= value < count)
            for name, value in data.items())
    elif kind == "ffi.Array":
        ok = _is_int_list(data) and all(0 <= ref < count for ref in data)
    else:
        ok = isinstance(data, dict) and set(data) <= fields and all(
            (name == "dtype" and isinstance(value, str) and _INDEX_DTYPE.fullmatch(value))
            or (name == "span" and _is_int(value) and 0 <= value < count)
            or (name not in ("dtype", "span") and _is_int(value) and 0 <= value < count)
            for name, value in data.items())
    if not ok:
        raise Refused(f"a layout map's {kind} node is malformed")


def check_workload(value) -> None:
    """Raise `Refused` unless the workload line ([hash, base64 module]) holds TIR that calls no
    function by name and carries no pragma outside the allowlist (`ValueError` if unreadable)."""
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise Refused("not a [hash, module] pair")
    try:
        raw = base64.b64decode(value[1], validate=True)
        (size,) = struct.unpack("<Q", raw[:8])
        if size != len(raw) - 8:
            raise ValueError("length prefix")
        nodes = json.loads(raw[8:])["nodes"]
    except (binascii.Error, struct.error, ValueError, KeyError, TypeError):
        # unreadable, not refused: a damaged line, which the log treats as corrupt
        raise ValueError("the module is not base64 of TVM's JSON graph") from None
    strings = {i: node.get("data") for i, node in enumerate(nodes)
               if isinstance(node, dict) and node.get("type") == "ffi.String"}
    for text in strings.values():
        if isinstance(text, str) and text.startswith("pragma_") and text not in _PRAGMAS_ALLOWED:
            raise Refused(f"the kernel carries {_clip(text)}")
    for node in nodes:
        if isinstance(node, dict) and node.get("type") == "ir.Op":
            _check_op(node)


def _check_op(node: dict) -> None:
    name = node.get("data")  # an op is stored by its registered name
    if not (isinstance(name, str) and _OP_NAME.fullmatch(name)):
        raise Refused(f"the kernel calls an op with an unexpected name {_clip(name)}")
    if _NAMED_CALL.fullmatch(name) and name not in EXTERNAL_CALLS_ALLOWED:
        raise Refused(f"the kernel calls a function by name ({name})")


def _variables(values: list) -> bool:
    """Whether every item is a trace variable's name (one regex over them all: this is the
    bulk of a log)."""
    return all(type(value) is str for value in values) and \
        _RV_LIST.fullmatch(" ".join(values)) is not None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_list(value) -> bool:
    return isinstance(value, list) and all(_is_int(item) for item in value)


def _is_plain(value) -> bool:
    """None, a bool or a number, or a list of them (tile sizes, probabilities, flags)."""
    if isinstance(value, list):
        return all(_is_plain(item) for item in value)
    return value is None or isinstance(value, (bool, int, float))


def _clip(value, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    text = text.replace("\n", " ")
    return repr(text[:limit] + ("..." if len(text) > limit else ""))
