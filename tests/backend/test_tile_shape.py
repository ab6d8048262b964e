"""A register tile holds no more accumulators than the target's CPU has registers for: AVX-512's
32 hold the rule's 8-row tiles of 16-lane vectors, AVX2's 16 do not (each such vector is two of
its registers), so code for an AVX2 CPU gets shorter tiles. Scheduled only for a CPU this host
may not have (never run); the numbers checked on code built for this host from the same TIR."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import te

from test_cpu_schedule import TARGET, _te_kernel, run_kernel
from korch_tvm.backend.cpu_schedule import PAIR_COLUMNS, WIDE_TILE_ROWS, default_schedule
from korch_tvm.backend.schedule_variants import default_schedules
from korch_tvm.backend.tile_shape import (AVX512, RegisterFile, cpu_isa, register_file, tile_rows,
                                          tile_width)
from korch_tvm.costing.log_seeds import target_isa

AVX2 = RegisterFile("avx2", 8, 16)


def cpu(mcpu: str, triple: str | None = None):
    spec = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2}
    return tvm.target.Target({**spec, "mtriple": triple} if triple else spec)


@pytest.mark.parametrize("mcpu, expected", [
    ("znver3", AVX2), ("haswell", AVX2), ("skylake-avx512", AVX512), ("znver4", AVX512),
    ("sandybridge", RegisterFile("avx", 8, 16)), ("core2", RegisterFile("sse", 4, 16))])
def test_the_register_file_is_the_one_llvm_generates_for_the_cpu(mcpu, expected):
    assert register_file(cpu(mcpu)) == expected
    assert cpu_isa(cpu(mcpu)) == target_isa(cpu(mcpu)) == expected.isa


def test_aarch64_has_32_registers_of_4_lanes():
    assert register_file(cpu("neoverse-n1", "aarch64-linux-gnu")) == RegisterFile("neon", 4, 32)


def test_a_target_naming_no_cpu_keeps_the_rules_own_assumption():
    assert register_file(TARGET) == AVX512
    assert register_file(tvm.target.Target("cuda", host="llvm")) == AVX512


@pytest.mark.parametrize("registers, width, columns, rows", [
    (AVX512, 16, 1, 28), (AVX512, 16, 2, 14), (AVX2, 16, 1, 6), (AVX2, 16, 2, 3),
    (AVX2, 8, 1, 12), (AVX2, 12, 1, 6), (RegisterFile("sse", 4, 16), 16, 1, 3)])
def test_rows_leave_four_registers_beside_one_accumulator_per_register_of_a_row(
        registers, width, columns, rows):
    assert registers.rows_at_most(width, columns) == rows


@pytest.mark.parametrize("extent, most, rows", [(64, 6, 4), (56, 6, 4), (30, 6, 6), (14, 6, 2),
                                                (26, 28, 13), (64, 3, 2), (64, 28, 8)])
def test_tile_rows_never_exceed_what_the_registers_hold(extent, most, rows):
    assert tile_rows(extent, most=most) == rows


@pytest.mark.parametrize("registers, row_extent, width", [
    (AVX2, 7, 8),      # 7 rows of one register, not 1 row of two
    (AVX2, 14, 8),     # 7 rows of 8 lanes, not 2 of 16
    (AVX2, 56, 16),    # 4 rows of 16 lanes fit
    (AVX2, 13, 16),    # no row count from 4 to 12 divides 13: nothing to gain
    (AVX512, 7, 16)])  # 7 rows of 16 lanes fit
def test_a_tile_narrows_its_vector_only_where_too_few_rows_of_it_fit(registers, row_extent, width):
    assert tile_width(registers, 512, 16, row_extent, 8) == width


def matmul(rows=64, depth=512, width=1024):
    a, b = te.placeholder((rows, depth), name="a"), te.placeholder((depth, width), name="b")
    r = te.reduce_axis((0, depth), "r")
    return _te_kernel(a, b, te.compute((rows, width),
                                       lambda i, j: te.sum(a[i, r] * b[r, j], axis=r)))


def unrolled(schedule) -> set[int]:
    """The extents of the tile's unrolled loops (its initialisation's and its own)."""
    text = schedule.mod["main"].script()
    return {int(part.split(")")[0]) for part in text.split("T.unroll(")[1:]}


def test_an_avx2_tile_has_half_the_rows_of_an_avx512_one_and_the_same_numbers():
    """64 rows of 16-lane vectors: 8 rows (8 of AVX-512's 32 registers), 4 on AVX2 (8 of
    its 16); a pair of vectors per row: 8 rows on AVX-512, 2 on AVX2."""
    mod = matmul()
    assert unrolled(default_schedule(mod, cpu("skylake-avx512"))) == {8}
    avx2 = default_schedule(mod, cpu("znver3"), pack_weights=False)
    assert unrolled(avx2) == {4}
    assert unrolled(default_schedule(mod, cpu("znver3"), columns=PAIR_COLUMNS)) == {2}
    assert unrolled(default_schedule(mod, cpu("skylake-avx512"), columns=PAIR_COLUMNS)) == {2, 8}
    np.testing.assert_allclose(run_kernel(avx2.mod), run_kernel(mod), rtol=1e-4, atol=1e-4)


def test_on_avx2_the_taller_tile_is_no_variant_of_its_own():
    """The wide variant asks for 16 rows; AVX2's registers hold the rule's own, so it is the
    rule's form and measured once."""
    mod = matmul()
    znver3 = cpu("znver3")
    wide = default_schedule(mod, znver3, tile_rows=WIDE_TILE_ROWS)
    assert tvm_ffi.structural_equal(wide.mod, default_schedule(mod, znver3).mod)
    assert len(default_schedules(mod, znver3)) == len(default_schedules(mod, TARGET)) - 1


def test_seven_rows_on_avx2_take_vectors_one_register_wide_with_the_same_numbers():
    """A 7x7 map's 7 output pixels per row: one row of 16-lane vectors fits no tile on AVX2,
    7 rows of 8 lanes do (7 of its 16 registers); AVX-512 keeps 16 lanes."""
    mod = matmul(rows=7, depth=256, width=512)
    narrowed = default_schedule(mod, cpu("znver3"), pack_weights=False)
    assert unrolled(narrowed) == {7}
    assert "T.vectorized(8)" in narrowed.mod["main"].script()
    assert "T.vectorized(16)" in default_schedule(mod, cpu("skylake-avx512")).mod["main"].script()
    # the register file can be named instead of read from the target (bench/tile_shapes.py)
    assert tvm_ffi.structural_equal(
        default_schedule(mod, TARGET, pack_weights=False, registers=AVX2).mod, narrowed.mod)
    np.testing.assert_allclose(run_kernel(narrowed.mod), run_kernel(mod), rtol=1e-4, atol=1e-4)
