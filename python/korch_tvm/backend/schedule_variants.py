"""Which forms of the CPU default schedule the profiler measures, and which kernels share a choice.

No one register tile wins on every kernel (bench/results/default_schedule.txt): a taller tile (up
to `WIDE_TILE_ROWS` rows) speeds some matmuls up and slows others down, and so does the vector's
outer loop outermost (each core keeps a strip of the weights in its cache while it sweeps the
rows, instead of streaming all weights once per tile of rows), and so does a tile two vectors
wide (fewer loads per multiply-add: it speeds matmuls and 1x1 convolutions up,
bench/results/default_schedule-pair.txt, and slows most 3x3 ones down), and so do both at once
(matmuls of a few dozen rows, which stream their weights: ViT-S/32's and BERT's 21-30 % faster
than in any other form, bench/results/tile-shapes/). The rule's form is also
measured with the weights as the model has them: packing speeds most convolutions up but slows
a few down (bench/results/packed-weights/). So the profiler measures each and keeps the fastest.

Kernels under `VARIANT_MIN_FLOPS` get the rule's packed form alone: their variants differ by
microseconds, and keeping the faster of noisy runs made them look cheaper than they run
(bench/results/compile-time/small-kernel-forms/).

Candidates fuse the same contraction with different neighbours (a convolution alone, with its
batch-norm and ReLU prologue, with its concatenation), and which form wins is a property of the
contraction: on DenseNet-121, 154 kernels with variants had 38 contractions among them (one 3x3
convolution in 48 kernels); on the others of a contraction, the form that won on its first ran
at 0.986 of the packed form's time, the best of all five at 0.967 (partly the bias of keeping
the least of five noisy runs), and whole plans made either way ran as fast side by side
(bench/results/compile-time/variant-anchors/). `variant_anchor` names the contraction; the
profiler measures every form on the first kernel of an anchor and, on the others, the rule's
form and that kernel's winner (costing/default_measurement.py).
"""

from __future__ import annotations

from collections.abc import Collection

import tvm
import tvm_ffi

from ..kernels.kernel_facts import kernel_blocks, kernel_flops
from ..support.tir_blocks import is_reduction
from .cpu_schedule import (PAIR_COLUMNS, WIDE_TILE_ROWS, default_schedule, prepare,
                           with_packed_weights)

VARIANT_MIN_FLOPS = 2e7  # 0.1 ms at a 2-core AVX-512 machine's peak
RULE_FORM = "packed"  # the rule's own form: every kernel it applies to gets it
# The tiled variants, by name: the rule's options that make each (`default_schedule`).
TILED_VARIANTS = {"wide": {"tile_rows": WIDE_TILE_ROWS},
                  "outer": {"vector_outer": True},
                  "pair": {"columns": PAIR_COLUMNS},
                  "outer_pair": {"vector_outer": True, "columns": PAIR_COLUMNS}}
FORMS = (RULE_FORM, "plain", *TILED_VARIANTS)  # "plain": the rule's form, weights unpacked


def named_default_schedules(kernel_mod: tvm.IRModule, target, kind_rules: bool = True,
                            forms: Collection[str] | None = None) -> list:
    """[(form name, schedule)]: the rule's packed form first, then those of its distinct
    variants named in `forms` (None: all) for a kernel of at least `VARIANT_MIN_FLOPS`. A
    variant that schedules the kernel exactly like an earlier form is left out. Empty where
    the rule does not apply."""
    prepared = prepare(kernel_mod, kind_rules)  # what every form starts from, made once
    plain = default_schedule(kernel_mod, target, pack_weights=False, prepared=prepared)
    if plain is None:
        return []
    schedules = [(RULE_FORM, with_packed_weights(plain, target))]
    if kernel_flops(kernel_mod) < VARIANT_MIN_FLOPS:
        return schedules
    for name in FORMS[1:]:
        if forms is not None and name not in forms:
            continue
        variant = plain if name == "plain" else default_schedule(
            kernel_mod, target, untiled_fallback=False, prepared=prepared,
            **TILED_VARIANTS[name])
        if variant is not None and not any(tvm_ffi.structural_equal(variant.mod, kept.mod)
                                           for _, kept in schedules):
            schedules.append((name, variant))
    return schedules


def default_schedules(kernel_mod: tvm.IRModule, target, kind_rules: bool = True) -> list:
    """Every form `named_default_schedules` gives, as schedules."""
    return [schedule for _, schedule in named_default_schedules(kernel_mod, target, kind_rules)]


def variant_anchor(kernel_mod: tvm.IRModule) -> tuple | None:
    """What decides which form wins: the kernel's contractions (each reduction block's
    iteration extents and kinds, and the shapes and types it reads), or None for a kernel
    that gets no variants (too small, or no reduction)."""
    if kernel_flops(kernel_mod) < VARIANT_MIN_FLOPS:
        return None
    anchor = tuple(
        (tuple((int(iv.iter_type), str(iv.dom.extent)) for iv in block.iter_vars),
         tuple((tuple(str(dim) for dim in region.source.shape), str(region.source.dtype))
               for region in block.reads))
        for block in kernel_blocks(kernel_mod)
        if is_reduction(block))
    return anchor or None
