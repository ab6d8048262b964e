"""The allowlist of what a tuning log may ask TVM to do, and a log refusing a record that carries
code (`pragma_import_llvm`) before TVM ever reads it."""

import copy
import json
import logging
import os

import pytest

from korch_tvm.backend.target import parse_target, target_tag
from korch_tvm.costing import trace_policy
from korch_tvm.costing.trace_policy import Refused, check_record, check_workload
from korch_tvm.costing.tuning_log import RECORD_FILE, WORKLOAD_FILE, TuningLog

SHIPPED = os.path.join(os.path.dirname(__file__), "..", "..", "tuning_logs", "llvm-znver4-2c")
SHIPPED_TARGET = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
# A module-level asm line in LLVM IR runs nothing by itself; in a real attack it would add a
# constructor that runs when the library is loaded.
EVIL_IR = '; ModuleID = "x"\nmodule asm ".globl evil"\n'


def shipped_lines(name):
    with open(os.path.join(SHIPPED, name), "rb") as file:
        return file.read().splitlines()


def test_every_record_and_workload_of_the_shipped_log_passes():
    records = [json.loads(line)[1] for line in shipped_lines(RECORD_FILE)]
    workloads = [json.loads(line) for line in shipped_lines(WORKLOAD_FILE)]
    for record in records:
        check_record(record)
    for workload in workloads:
        check_workload(workload)
    assert len(records) > 1000 and len(workloads) > 100  # 1584 and 162 at the time of writing


def tuned_record():
    """(workload line index, record) of the first tuned record of the shipped log whose trace
    unrolls a loop (so a loop that exists at the end of the trace is known)."""
    for line in shipped_lines(RECORD_FILE):
        index, record = json.loads(line)
        if any(inst[2] == ["pragma_auto_unroll_max_step"] for inst in record[0][0]):
            return index, record
    raise AssertionError("the shipped log has no tuned record")


def with_instruction(record, kind, inputs, attrs, outputs=()):
    evil = copy.deepcopy(record)
    evil[0][0].append([kind, inputs, attrs, list(outputs)])
    return evil


def first_loop(record) -> str:
    """The loop the trace's last unroll annotation is on: it exists when the trace ends."""
    return [inst[1][0] for inst in record[0][0]
            if inst[2] == ["pragma_auto_unroll_max_step"]][-1]


def test_the_pragma_import_attack_is_refused_by_the_log_and_never_replayed(tmp_path, caplog,
                                                                          monkeypatch):
    """A real tuned record plus `Annotate(loop, "pragma_import_llvm", IR)`: TVM would take it,
    the log sets it aside (verbatim, with its reason) without replaying it; the others serve."""
    from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

    from korch_tvm.costing import tuning_log

    index, record = tuned_record()
    evil = with_instruction(record, "Annotate", [first_loop(record), json.dumps(EVIL_IR)],
                            ["pragma_import_llvm"])
    evil[1] = [1e-7, 1e-7, 1e-7]  # faster than anything, so a plan would pick it
    workload_line = shipped_lines(WORKLOAD_FILE)[index]
    workload = Workload.from_json(json.loads(workload_line))
    # without the policy TVM reads it and keeps the annotation: the check is what stops it
    replayed = TuningRecord.from_json(evil, workload)
    assert "pragma_import_llvm" in str(replayed.trace)

    target = parse_target(SHIPPED_TARGET)
    directory = tmp_path / target_tag(target)
    directory.mkdir()
    (directory / WORKLOAD_FILE).write_bytes(workload_line + b"\n")
    honest, attack = json.dumps([0, record]), json.dumps([0, evil])
    (directory / RECORD_FILE).write_text(honest + "\n" + attack + "\n")
    replays = []
    real_from_json = tuning_log.TuningRecord.from_json
    monkeypatch.setattr(tuning_log.TuningRecord, "from_json",
                        staticmethod(lambda value, w: replays.append(value) or
                                     real_from_json(value, w)))
    with caplog.at_level(logging.WARNING, logger="korch_tvm.tuning_log"):
        log = TuningLog(tmp_path, target)
    assert log.record_count(workload.mod) == 1
    assert log.best_seconds(workload.mod) == pytest.approx(sorted(record[1])[1])
    assert all("pragma_import" not in json.dumps(value) for value in replays)
    assert all("pragma_import" not in json.dumps(tuning_log._record_json(r)) for r in
               log.database.get_all_tuning_records())
    assert (directory / (RECORD_FILE + ".rejected")).read_text() == attack + "\n"
    reasons = (directory / (RECORD_FILE + ".rejected.reasons")).read_text().splitlines()
    assert len(reasons) == 1 and "'pragma_import_llvm' is not one MetaSchedule writes" in reasons[0]
    assert "record line 2" in caplog.text and "pragma_import_llvm" in caplog.text
    assert (directory / RECORD_FILE).read_text() == honest + "\n"


@pytest.mark.parametrize("kind, inputs, attrs, why", [
    ("Annotate", ["{loop}", '"x"'], ["pragma_import_c"], "pragma_import_c"),
    ("Annotate", ["{loop}", 1], ["pragma_debug_skip_region"], "pragma_debug_skip_region"),
    ("Annotate", ["{loop}", '"/etc/passwd"'], ["meta_schedule.tiling_structure"], "not a"),
    ("Annotate", ["{loop}", {"k": 1}], ["meta_schedule.parallel"], "not a int"),
    ("UnsafeSetDType", ["b0"], [0, "int32"], "not one MetaSchedule emits"),
    ("Bind", ["{loop}"], ["threadIdx.x; system()"], "attribute 0"),
    ("CacheRead", ["b0"], [0, "../../global"], "attribute 1"),
    ("Split", ["{loop}", ['"x"', 2]], [True], "is not a variable"),
    ("GetSBlock", [], ["root", "main$"], "attribute 1"),
    # removing TOPI's custom-rule name is what the search does; setting one is not
    ("Annotate", ["{loop}", '"meta_schedule.pool_max"'], ["schedule_rule"], "schedule_rule"),
])
def test_instructions_outside_the_allowlist_are_refused(kind, inputs, attrs, why):
    _, record = tuned_record()
    loop = first_loop(record)
    inputs = [value.format(loop=loop) if isinstance(value, str) else value for value in inputs]
    with pytest.raises(Refused) as info:
        check_record(with_instruction(record, kind, inputs, attrs))
    assert why in str(info.value) and "\n" not in str(info.value)


def index_map_json(func) -> str:
    import tvm

    return tvm.ir.save_json(tvm.tirx.IndexMap.from_func(func))


def test_layout_maps_must_be_plain_index_arithmetic():
    import tvm

    _, record = tuned_record()
    block = record[0][0][0][3][0]  # the first GetSBlock's block
    plain = index_map_json(lambda i, j: [i // 4, j % 4, i * 2 + j])
    check_record(with_instruction(record, "TransformBlockLayout", [block], [plain]))
    # a call (any call: an extern one could name any function) hidden in the map is refused
    sneaky = index_map_json(lambda i, j: [tvm.tirx.call_extern("int32", "system", i), j])
    with pytest.raises(Refused, match="not plain index arithmetic"):
        check_record(with_instruction(record, "TransformBlockLayout", [block], [sneaky]))
    # a map written with source spans (debug information) is still plain arithmetic
    span = tvm.ir.Span(tvm.ir.SourceName("layout.py"), 1, 2, 1, 9)
    i = tvm.tirx.Var("i", "int32", span=span)
    spanned = tvm.ir.save_json(tvm.tirx.IndexMap([i], [i * 2], None))
    check_record(with_instruction(record, "TransformBlockLayout", [block], [spanned]))
    with pytest.raises(Refused, match="not an IndexMap"):
        not_a_map = tvm.ir.save_json(tvm.runtime.convert([1, 2]))
        check_record(with_instruction(record, "TransformLayout", [block, not_a_map],
                                      [0, 0, None, 0]))


def test_workloads_calling_functions_by_name_or_importing_code_are_refused(tmp_path):
    import tvm
    from tvm import te
    from tvm.s_tir.meta_schedule.database import Workload

    a = te.placeholder((8,), name="A")
    calls = te.compute((8,), lambda i: tvm.tirx.call_extern("float32", "system", a[i]), name="B")
    value = Workload(tvm.IRModule({"main": te.create_prim_func([a, calls])})).as_json()
    with pytest.raises(Refused, match=r"calls a function by name \(tirx.call_extern\)"):
        check_workload([str(v) for v in value])

    plain = te.compute((8,), lambda i: tvm.tirx.exp(a[i]), name="B")
    func = te.create_prim_func([a, plain])
    check_workload([str(v) for v in Workload(tvm.IRModule({"main": func})).as_json()])
    body = tvm.tirx.AttrStmt(func.body, "pragma_import_llvm", tvm.ir.StringImm(EVIL_IR),
                             func.body)
    importing = func.with_body(body)
    with pytest.raises(Refused, match="pragma_import_llvm"):
        check_workload([str(v) for v in Workload(tvm.IRModule({"main": importing})).as_json()])
    assert trace_policy.EXTERNAL_CALLS_ALLOWED == frozenset()


def _matmul_then_exp():
    from tvm import te

    a, w = te.placeholder((32, 64), name="A"), te.placeholder((64, 16), name="W")
    k = te.reduce_axis((0, 64), name="k")
    product = te.compute((32, 16), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="M")
    out = te.compute((32, 16), lambda i, j: te.exp(product[i, j]), name="E")
    return te.create_prim_func([a, w, out])


def _as_logged(schedule, kernel, target):
    """The record JSON of a schedule as the tuning log would write it."""
    from tvm.s_tir import meta_schedule as ms

    from korch_tvm.costing.tuning_log import _record_json

    record = ms.database.TuningRecord(schedule.trace, ms.database.Workload(kernel), [1e-5],
                                      target, ms.arg_info.ArgInfo.from_prim_func(kernel["main"]))
    return json.loads(json.dumps(_record_json(record)))


def _design_space_records(kernel, target, kind: str):
    """(the logged records of the design spaces MetaSchedule's default rules of `kind` make
    for `kernel`, those whose postprocessors apply; how many spaces there were)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    space = ms.space_generator.PostOrderApply(
        sch_rules=ms.ScheduleRule.create(kind), postprocs=ms.Postproc.create(kind),
        mutator_probs=ms.Mutator.create(kind))
    context = ms.TuneContext(kernel, target=target, space_generator=space, task_name="k",
                             rand_state=1)
    records, spaces = [], 0
    for space in context.generate_design_space():
        spaces += 1
        schedule = tvm.s_tir.Schedule(kernel)
        space.trace.apply_to_schedule(schedule, remove_postproc=True)
        if all(postproc.apply(schedule) for postproc in context.space_generator.postprocs):
            records.append(_as_logged(schedule, kernel, target))
    return records, spaces


@pytest.mark.parametrize("kind", ["llvm", "cuda"])
def test_what_metaschedule_and_dlight_make_passes(kind):
    """Every design space MetaSchedule's default rules make, with its postprocessors applied
    (and dlight's CUDA schedule, korch_tvm's default there), is allowed: the allowlist is not
    narrower than what tuning writes."""
    from korch_tvm.costing.metaschedule_setup import skip_gpu_tensor_intrin

    skip_gpu_tensor_intrin()  # as CPU tuning does: parsing every GPU intrinsic takes ~30 s
    import tvm

    from korch_tvm.backend.cuda import default_schedule

    kernel = tvm.IRModule({"main": _matmul_then_exp().with_attr("global_symbol", "main")})
    target = parse_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2} if kind == "llvm"
                          else {"kind": "cuda", "arch": "sm_90"})
    # the default rules of the kind; for float32 kernels CUDA's tensor-core rules (which need
    # the GPU intrinsics parsed) schedule as these do
    records, _ = _design_space_records(kernel, target, kind)
    for record in records:
        check_record(record)
    checked = len(records)
    if kind == "cuda":
        check_record(_as_logged(default_schedule(kernel, target), kernel, target))
        checked += 1
    assert checked >= 3


def _max_pool():
    """TOPI's max pooling, whose block names a custom rule ("schedule_rule") that MetaSchedule
    removes before scheduling it: every design space's trace holds that Unannotate."""
    from tvm import te, topi

    x = te.placeholder((1, 16, 16, 8), name="x")
    out = topi.nn.pool2d(x, kernel=(3, 3), stride=(2, 2), dilation=(1, 1),
                         padding=(1, 1, 1, 1), pool_type="max", layout="NHWC")
    return te.create_prim_func([x, out])


def test_metaschedule_s_search_of_a_pooling_kernel_passes():
    """A tuned ResNet-18 lost every record of its max-pool kernel to the policy (the search's
    `unannotate(block, "schedule_rule")`); the removal is allowed now, and only the removal."""
    from korch_tvm.costing.metaschedule_setup import skip_gpu_tensor_intrin

    skip_gpu_tensor_intrin()
    import tvm

    kernel = tvm.IRModule({"main": _max_pool().with_attr("global_symbol", "main")})
    assert "schedule_rule" in kernel.script()
    target = parse_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    records, spaces = _design_space_records(kernel, target, "llvm")
    assert len(records) == spaces    # every design space's postprocessors apply
    for record in records:
        check_record(record)
    assert sum('"schedule_rule"' in json.dumps(record) for record in records) >= 1
