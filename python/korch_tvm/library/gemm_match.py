"""Recognise a kernel that is a (batched) float32 GEMM, with or without an elementwise epilogue,
so a BLAS call can replace it.

Matching works on the kernel's PrimFunc, not on Relax's `R.matmul`: Korch prices and chooses
kernels as PrimFuncs (one per candidate, keyed by structural_key), and a kernel that fused a
transpose into its matmul is still one GEMM with a transposed operand. Producer blocks that only
move data (a transpose) are inlined first; what remains must be one reduction block
`C[b.., i, j] += A[..] * B[..]` whose indices are plain block variables (an operand shared by
every batch has 0 in its leading indices; reduction axes of extent 1 count as 0, so a 1x1 NHWC
convolution with HWIO weights, stride 1 and no padding is a GEMM). Elementwise blocks after it
are inlined into one output block over C's indices, which must read as an epilogue the library
call applies (epilogue_match.py: bias, residual, activations). Anything else (another epilogue,
a second output, a broadcast batch axis, a stride, a reshape's div/mod indices) is not a GEMM
here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import tvm
from tvm import tirx
from tvm.sym.analyzer import Analyzer

from ..support.tir_blocks import blocks_below, is_reduction
from .epilogue_match import EpilogueMatcher, EpilogueStep

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class GemmSpec:
    """C[batch.., M, N] = op(A) op(B), row-major float32; op transposes the last two axes.

    `a_input`/`b_input` are the positions of A and B among the kernel's inputs (the call_tir
    argument order); `a_batched`/`b_batched` say whether each has C's leading axes (otherwise
    it is one matrix shared by every batch); `epilogue` the steps applied to C, innermost
    first, each operand step naming its input position."""

    batch_shape: tuple[int, ...]
    m: int
    n: int
    k: int
    transpose_a: bool
    transpose_b: bool
    a_batched: bool
    b_batched: bool
    a_input: int
    b_input: int
    epilogue: tuple[EpilogueStep, ...] = ()

    @property
    def batch(self) -> int:
        count = 1
        for size in self.batch_shape:
            count *= size
        return count

    def a_shape(self) -> tuple[int, ...]:
        rows = (self.k, self.m) if self.transpose_a else (self.m, self.k)
        return (self.batch_shape + rows) if self.a_batched else rows

    def b_shape(self) -> tuple[int, ...]:
        rows = (self.n, self.k) if self.transpose_b else (self.k, self.n)
        return (self.batch_shape + rows) if self.b_batched else rows

    def c_shape(self) -> tuple[int, ...]:
        return self.batch_shape + (self.m, self.n)

    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    # What implementations.Implementation asks of a spec (conv_match.ConvSpec answers too).
    @property
    def routine(self) -> str:
        return "sbgemm" if self.batch_shape else "sgemm"

    @property
    def main_inputs(self) -> tuple[int, int]:
        return self.a_input, self.b_input

    def scalar_arguments(self) -> tuple[int, ...]:
        return int(self.transpose_a), int(self.transpose_b)

    def input_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return self.a_shape(), self.b_shape()

    def output_shape(self) -> tuple[int, ...]:
        return self.c_shape()

    def key(self) -> str:
        """Every field the call's time depends on, for library_times.json."""
        return (f"batch={self.batch} m={self.m} n={self.n} k={self.k} "
                f"ta={int(self.transpose_a)} tb={int(self.transpose_b)} "
                f"ab={int(self.a_batched)} bb={int(self.b_batched)}")


def match_gemm(kernel_mod: tvm.IRModule) -> GemmSpec | None:
    """The GEMM (and epilogue) kernel_mod's `main` computes, or None when it is not one."""
    func = float32_main(kernel_mod)
    if func is None:
        return None
    blocks = _gemm_and_output_blocks(kernel_mod)
    if blocks is None:
        return None
    gemm_block, output_block = blocks
    inputs, output = list(func.params[:-1]), func.params[-1]
    c_buffer = output if output_block is None else gemm_block.body.buffer
    spec = _spec_of_block(gemm_block, inputs, c_buffer)
    if spec is None:
        return None
    if output_block is not None:
        steps = _epilogue_of(output_block, c_buffer, inputs, output, spec.c_shape())
        if steps is None:
            return None
        spec = replace(spec, epilogue=steps)
    used = {spec.a_input, spec.b_input} | {step.input for step in spec.epilogue
                                           if step.input is not None}
    if used != set(range(len(inputs))):
        return None
    # The iteration must cover each buffer whole (no slice of a larger operand).
    shapes = [tuple(_as_int(s) for s in p.shape) for p in func.params]
    wanted = {spec.a_input: spec.a_shape(), spec.b_input: spec.b_shape(),
              len(inputs): spec.c_shape()}
    if tuple(_as_int(s) for s in c_buffer.shape) != spec.c_shape() and output_block is not None:
        return None
    return spec if all(_without_unit_lead(shapes[n], len(shape)) == shape
                       for n, shape in wanted.items()) else None


def float32_main(kernel_mod: tvm.IRModule):
    """kernel_mod's `main` when it is an unscheduled PrimFunc of float32 buffers, at least two
    inputs and an output, with one reduction block (what a library call can replace); None
    otherwise. Cheap, so the matchers' schedules are made only for such kernels: most
    candidates of a model are elementwise or data movement."""
    names = [gv.name_hint for gv in kernel_mod.get_global_vars()]
    func = kernel_mod["main"] if "main" in names else None
    if not isinstance(func, tirx.PrimFunc) or len(func.params) < 3 or _is_scheduled(func):
        return None
    if any(str(p.dtype) != "float32" for p in func.params):
        return None
    return func if reduction_blocks(func.body) == 1 else None


def reduction_blocks(stmt) -> int:
    """How many blocks under `stmt` have a reduction axis, read off the statement tree: about
    15 times cheaper than making the Schedule that would list them."""
    return sum(is_reduction(block) for block in blocks_below(stmt))


def output_index_vars(block, output, shape):
    """The iteration variables of `block` when it is a plain elementwise store into `output` at
    its own indices, iterating over exactly `shape` (the block an epilogue is read from)."""
    store = block.body
    if block.init is not None or not isinstance(store, tirx.BufferStore) \
            or not store.buffer.same_as(output):
        return None
    if any(iv.iter_type != tirx.IterVar.DataPar or _as_int(iv.dom.min) != 0
           for iv in block.iter_vars):
        return None
    index_vars = [iv.var for iv in block.iter_vars]
    if tuple(_as_int(iv.dom.extent) for iv in block.iter_vars) != tuple(shape) \
            or not _same_vars(store.indices, index_vars):
        return None
    return index_vars


def _epilogue_of(block, c_buffer, inputs, output, c_shape):
    """The epilogue steps of the output block `block`, or None (see output_index_vars)."""
    index_vars = output_index_vars(block, output, c_shape)
    if index_vars is None:
        return None
    return EpilogueMatcher(c_buffer, index_vars, inputs, c_shape).match(block.body.value)


def _without_unit_lead(shape: tuple, rank: int) -> tuple:
    """shape with leading size-1 axes dropped down to `rank` (a shared [1, 1, C, K] weight)."""
    while len(shape) > rank and shape[0] == 1:
        shape = shape[1:]
    return shape


def _is_scheduled(func) -> bool:
    return func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def _gemm_and_output_blocks(kernel_mod: tvm.IRModule):
    """(the GEMM block, the output block after it or None) once every other block (pure
    data-movement producers of the GEMM's operands, elementwise blocks of its epilogue) is
    inlined; None when that leaves anything else."""
    try:
        # errors rendered briefly: an inlining refused is an answer here, not a fault
        schedule = tvm.s_tir.Schedule(kernel_mod, error_render_level="fast")
        root = schedule.get_sblock("root", func_name="main")
        blocks = list(schedule.get_child_blocks(root))
        reductions = [b for b in blocks if is_reduction(schedule.get(b))]
        if len(reductions) != 1:
            return None
        gemm_name = schedule.get(reductions[0]).name_hint
        for block in blocks[:-1]:
            if schedule.get(block).name_hint != gemm_name:
                schedule.compute_inline(block)
        left = list(schedule.get_child_blocks(root))
        if any(list(schedule.get_child_blocks(block)) for block in left):
            return None
        remaining = [schedule.get(block) for block in left]
    except (RuntimeError, ValueError):  # ScheduleError is a RuntimeError
        return None
    if not isinstance(remaining[0].body, tirx.BufferStore):
        return None
    if len(remaining) == 1 and remaining[0].name_hint == gemm_name:
        return remaining[0], None
    if len(remaining) == 2 and remaining[0].name_hint == gemm_name:
        return remaining[0], remaining[1]
    return None


def _spec_of_block(block, inputs, c_buffer) -> GemmSpec | None:
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    # Reduction axes of extent 1 (a 1x1 convolution's window) are the constant 0.
    unit = [iv.var for iv in reduce if _as_int(iv.dom.extent) == 1]
    reduce = [iv.var for iv in reduce if _as_int(iv.dom.extent) != 1]
    if len(reduce) != 1 or len(spatial) + 1 + len(unit) != len(block.iter_vars) \
            or len(spatial) < 2:
        return None
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not _is_zero_init(block.init, store):
        return None
    if not _same_vars(store.indices, spatial) or not c_buffer.same_as(store.buffer):
        return None
    loads = accumulated_product(store, spatial)
    if loads is None:
        return None
    analyzer = Analyzer()
    for var in unit:
        analyzer.bind(var, tirx.IntImm(str(var.ty.dtype), 0))
    operands = [(load.source, [analyzer.simplify(index) for index in load.indices])
                for load in loads]
    return _assign_operands(operands, spatial, reduce[0], inputs, block)


def _assign_operands(operands, spatial, k_var, inputs, block) -> GemmSpec | None:
    i_var, j_var, batch_vars = spatial[-2], spatial[-1], spatial[:-2]
    roles = {}
    for source, indices in operands:
        role = _operand_role(indices, batch_vars, i_var, j_var, k_var)
        if role is None or role[0] in roles:
            return None
        roles[role[0]] = (source,) + role[1:]
    if set(roles) != {"A", "B"}:
        return None
    positions = {}
    for name, (buffer, _, _) in roles.items():
        found = [n for n, p in enumerate(inputs) if p.same_as(buffer)]
        if len(found) != 1:
            return None
        positions[name] = found[0]
    if positions["A"] == positions["B"]:
        return None
    if any(_as_int(iv.dom.min) != 0 for iv in block.iter_vars):
        return None
    extents = {iv.var: iv.dom.extent for iv in block.iter_vars}
    sizes = [_as_int(extents[v]) for v in spatial + [k_var]]
    if any(size is None or size < 1 or size > _INT32_MAX for size in sizes):
        return None
    return GemmSpec(batch_shape=tuple(sizes[:-3]), m=sizes[-3], n=sizes[-2], k=sizes[-1],
                    transpose_a=roles["A"][1], transpose_b=roles["B"][1],
                    a_batched=roles["A"][2], b_batched=roles["B"][2],
                    a_input=positions["A"], b_input=positions["B"])


def accumulated_product(store, spatial):
    """[A's load, B's load] when `store` is `C[spatial] = C[spatial] + A[..] * B[..]`."""
    value = store.value
    if not (isinstance(value, tirx.Add) and isinstance(value.a, tvm.ir.TensorLoad)
            and value.a.source.same_as(store.buffer) and _same_vars(value.a.indices, spatial)
            and isinstance(value.b, tirx.Mul)):
        return None
    loads = [value.b.a, value.b.b]
    return loads if all(isinstance(load, tvm.ir.TensorLoad) for load in loads) else None


def _operand_role(indices, batch_vars, i_var, j_var, k_var):
    """("A"|"B", transposed, batched) from an operand's index list, or None."""
    indices = list(indices)
    if len(indices) < 2 or not all(isinstance(index, tirx.Var) for index in indices[-2:]):
        return None
    lead, last = indices[:-2], indices[-2:]
    # Leading indices are C's batch axes (batched) or all 0 (one matrix shared by every batch).
    shared = all(_as_int(index) == 0 for index in lead)
    if not shared and not _same_vars(lead, batch_vars):
        return None
    batched = not shared
    for role, row, transposed in (("A", i_var, False), ("A", i_var, True),
                                  ("B", j_var, False), ("B", j_var, True)):
        ordered = [k_var, row] if (role == "A") == transposed else [row, k_var]
        if all(x.same_as(y) for x, y in zip(last, ordered)):
            return role, transposed, batched
    return None


def _is_zero_init(init, store) -> bool:
    return (isinstance(init, tirx.BufferStore) and init.buffer.same_as(store.buffer)
            and isinstance(init.value, tirx.FloatImm) and float(init.value.value) == 0.0
            and len(init.indices) == len(store.indices)
            and all(a.same_as(b) for a, b in zip(init.indices, store.indices)))


def _same_vars(indices, variables) -> bool:
    return len(indices) == len(variables) and all(
        isinstance(x, tirx.Var) and x.same_as(v) for x, v in zip(indices, variables))


def _as_int(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tirx.IntImm) else None
