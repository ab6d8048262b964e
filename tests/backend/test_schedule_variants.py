"""The default schedule's forms by name, and the anchor that lets kernels share a choice."""

import tvm
import tvm_ffi
from tvm import te

from korch_tvm.backend.schedule_variants import (FORMS, RULE_FORM, VARIANT_MIN_FLOPS,
                                                 default_schedules, named_default_schedules,
                                                 variant_anchor)
from korch_tvm.backend.target import parse_target
from korch_tvm.kernels.fused import kernel_flops

# AVX-512 named (these kernels are scheduled, never run): AVX2 has no room for the wide form
TARGET = parse_target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})


def matmul_kernel(rows: int, depth: int, cols: int, relu: bool = False,
                  scaled_input: bool = False) -> tvm.IRModule:
    """A standalone `main`: (rows x depth) @ (depth x cols), with a ReLU epilogue or a scaling
    prologue on its first operand, as candidates fuse a contraction with its neighbours."""
    a = te.placeholder((rows, depth), name="a")
    b = te.placeholder((depth, cols), name="b")
    lhs = te.compute((rows, depth), lambda i, k: a[i, k] * 2.0, name="scaled") \
        if scaled_input else a
    k = te.reduce_axis((0, depth), name="k")
    out = te.compute((rows, cols), lambda i, j: te.sum(lhs[i, k] * b[k, j], axis=k), name="mm")
    if relu:
        out = te.compute((rows, cols), lambda i, j: te.max(out[i, j], 0.0), name="relu")
    return tvm.IRModule({"main": te.create_prim_func([a, b, out])})


def test_a_large_kernel_has_every_form_by_name_the_rules_first():
    kernel = matmul_kernel(256, 256, 256)
    assert kernel_flops(kernel) >= VARIANT_MIN_FLOPS
    named = named_default_schedules(kernel, TARGET)
    names = [name for name, _ in named]
    assert names[0] == RULE_FORM and len(names) == len(set(names)) == 5  # te: nothing to pack
    assert set(names) <= set(FORMS) and "plain" not in names  # plain == packed here
    assert all(tvm_ffi.structural_equal(a.mod, b.mod)
               for (_, a), b in zip(named, default_schedules(kernel, TARGET)))
    outer = named_default_schedules(kernel, TARGET, forms={"outer"})
    assert [name for name, _ in outer] == [RULE_FORM, "outer"]
    assert tvm_ffi.structural_equal(outer[1][1].mod, dict(named)["outer"].mod)
    assert [name for name, _ in named_default_schedules(kernel, TARGET, forms=())] == [RULE_FORM]


def test_kernels_around_one_contraction_share_an_anchor_and_others_do_not():
    plain = variant_anchor(matmul_kernel(256, 256, 256))
    assert plain is not None
    assert variant_anchor(matmul_kernel(256, 256, 256, relu=True)) == plain
    assert variant_anchor(matmul_kernel(256, 256, 256, scaled_input=True)) == plain
    assert variant_anchor(matmul_kernel(256, 128, 512)) not in (None, plain)  # same FLOPs
    assert variant_anchor(matmul_kernel(512, 256, 128)) not in (None, plain)
    small = matmul_kernel(32, 32, 32)
    assert kernel_flops(small) < VARIANT_MIN_FLOPS and variant_anchor(small) is None
    assert named_default_schedules(small, TARGET)[0][0] == RULE_FORM
    assert len(named_default_schedules(small, TARGET)) == 1


def test_forms_made_from_one_prepared_kernel_equal_forms_made_alone():
    """The forms share their first steps (inlining, kind rules), taken once and copied: each
    form's module and trace are those of the rule run on the kernel from the start."""
    from korch_tvm.backend.cpu_schedule import default_schedule
    from korch_tvm.backend.schedule_variants import TILED_VARIANTS

    kernel = matmul_kernel(256, 256, 256, relu=True, scaled_input=True)
    named = dict(named_default_schedules(kernel, TARGET))
    alone = {RULE_FORM: default_schedule(kernel, TARGET)}
    alone.update({name: default_schedule(kernel, TARGET, untiled_fallback=False, **options)
                  for name, options in TILED_VARIANTS.items() if name in named})
    assert len(named) == len(alone) >= 3
    for name, schedule in named.items():
        assert tvm_ffi.structural_equal(schedule.mod, alone[name].mod), name
        assert str(schedule.trace) == str(alone[name].trace), name
    # the copies are independent: the prefix the forms share ends where the first begins
    assert len({str(s.trace) for s in named.values()}) == len(named)
