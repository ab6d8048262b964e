"""How wide a vector and how many rows a register tile of the CPU default schedule gets, on the
vector registers the target's CPU has.

The rule writes its vectors 16 float32 lanes wide (one AVX-512 register) and lets LLVM split
them where registers are narrower. A register tile holds one accumulator per row per register
its row spans, so on AVX2, where a 16-lane vector is two of its sixteen registers, the tile that
suits AVX-512's 32 registers (8 rows) spills to the stack on every reduction step: ResNet-18's
3x3 convolutions ran at 52-76 GFLOP/s on a 2-core Zen 3 in every form the profiler measures,
at 130-174 with tiles that fit (bench/results/avx2-tiles/). `RegisterFile` says how many rows fit, from the instruction set
LLVM reports for the target's CPU, and where fewer than 4 rows of full vectors would fit (a
7-pixel map row), the tile takes vectors one register wide and more rows (`tile_width`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

MAX_VECTOR_WIDTH = 16  # float32 lanes of AVX-512 (LLVM splits them for AVX2, SSE or NEON)
MIN_VECTOR_WIDTH = 4
# Rows of a register tile: 8 vector accumulators of AVX-512's 32 registers, the shape that was
# fastest or close to it on matmuls and NHWC convolutions (fewer rows re-stream the weight).
TILE_ROWS = 8
# When the rows' extent has no divisor from 4 to TILE_ROWS (e.g. 13 or 26), up to this many: a
# tall tile beats a tiny one there, though not where 4 or 8 divide (windowed loads need registers).
MAX_TILE_ROWS = 14
MIN_TILE_ROWS = 4  # fewer rows re-load the streamed vector for too few multiply-adds
# Vector instruction sets told apart, widest first: the LLVM feature that means each, float32
# lanes per register, and registers (x86-64 has 16 vector registers below AVX-512, AArch64 32).
VECTOR_ISAS = (("avx512", "avx512f", 16, 32), ("avx2", "avx2", 8, 16), ("avx", "avx", 8, 16),
               ("sse", "sse2", 4, 16), ("sve", "sve", 4, 32), ("neon", "neon", 4, 32))
# Registers a tile leaves to the broadcast value, the streamed vectors and LLVM's temporaries:
# on AVX2 a tile of 14 accumulators spilled (3x slower), one of 12 ran 12-16 % faster than 8.
RESERVED_REGISTERS = 4


class RegisterFile(NamedTuple):
    """A target's vector instruction set, float32 lanes per register and register count."""

    isa: str
    lanes: int
    registers: int

    def rows_at_most(self, width: int, columns: int = 1) -> int:
        """The most rows a register tile of `columns` vectors of `width` lanes per row may
        have without more accumulators than the registers left for them."""
        per_row = columns * math.ceil(width / self.lanes)
        return max(1, (self.registers - RESERVED_REGISTERS) // per_row)


REGISTER_FILES = {isa: RegisterFile(isa, lanes, registers)
                  for isa, _, lanes, registers in VECTOR_ISAS}
AVX512 = REGISTER_FILES["avx512"]
GENERIC = RegisterFile("generic", 4, 16)  # what code for an unknown CPU may assume


def register_file(target) -> RegisterFile:
    """The registers code generated for the LLVM `target`'s CPU has. A target that names no
    CPU (every target the pipeline makes names one, `target_spec.py`) and one of another
    kind get AVX-512's, the rule's own assumption."""
    if target.kind.name != "llvm" or not target.attrs.get("mcpu"):
        return AVX512
    return _llvm_register_file(target)


def cpu_isa(target) -> str:
    """The vector instruction set LLVM generates for the LLVM `target`'s CPU: "avx512", ...,
    "neon", "generic"; "unknown" where this LLVM cannot say."""
    return _llvm_register_file(target).isa


_BY_TARGET: dict[str, RegisterFile] = {}  # a target's text -> its register file


def _llvm_register_file(target) -> RegisterFile:
    import tvm

    key = str(target)
    if key not in _BY_TARGET:
        try:
            features = {str(name) for name in tvm.target.codegen.llvm_get_cpu_features(target)}
        except Exception:  # noqa: BLE001 - an LLVM that cannot say
            _BY_TARGET[key] = GENERIC._replace(isa="unknown")
        else:
            _BY_TARGET[key] = next((REGISTER_FILES[isa] for isa, feature, *_ in VECTOR_ISAS
                                    if feature in features), GENERIC)
    return _BY_TARGET[key]


def largest_divisor(extent: int | None, at_most: int) -> int:
    return 1 if not extent else next(d for d in range(min(extent, at_most), 0, -1)
                                     if extent % d == 0)


def vector_width(extent: int | None, at_most: int = MAX_VECTOR_WIDTH) -> int | None:
    """The largest divisor of `extent` up to `at_most` lanes, if at least 4 (an odd width such
    as 13 or 14 is padded to the register by LLVM)."""
    if not extent:
        return None
    width = largest_divisor(extent, at_most)
    return width if width >= MIN_VECTOR_WIDTH else None


def tile_rows(extent: int | None, at_most: int = TILE_ROWS, most: int = MAX_TILE_ROWS) -> int:
    """Rows of a register tile: a divisor of `extent` (no remainder loop), `at_most` at most
    unless only 1-3 would divide, then up to MAX_TILE_ROWS; never over `most`."""
    rows = largest_divisor(extent, min(at_most, most))
    if rows >= MIN_TILE_ROWS:
        return rows
    return largest_divisor(extent, min(max(at_most, MAX_TILE_ROWS), most))


def tile_width(registers: RegisterFile, extent: int, width: int, row_extent: int | None,
               at_most: int) -> int:
    """The vector width of a one-vector-per-row tile: `width` (the rule's, over `extent`),
    or where the registers hold fewer than MIN_TILE_ROWS rows of it and a vector one
    register wide allows more, that narrower one."""
    if (registers.lanes >= width or tile_rows(row_extent, at_most, registers.rows_at_most(width))
            >= MIN_TILE_ROWS):
        return width
    narrow = vector_width(extent, registers.lanes)
    if narrow is None or tile_rows(row_extent, at_most,
                                   registers.rows_at_most(narrow)) < MIN_TILE_ROWS:
        return width
    return narrow
