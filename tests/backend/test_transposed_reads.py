"""A kernel that writes its input transposed loops over the input's innermost dimension between
the vector and the vector's outer loop, so each tile of outputs reads a patch of the input that
stays in cache."""

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.s_tir.dlight.analysis import normalize_prim_func

from test_cpu_schedule import _te_kernel as module
from korch_tvm.backend.cpu_schedule import default_schedule
from korch_tvm.backend.transposed_reads import transposed_loop

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def loop_extents(mod: tvm.IRModule) -> list[int]:
    """Extents of the loops around the kernel's one block, outermost first."""
    schedule = tvm.s_tir.Schedule(mod)
    (block,) = schedule.get_child_blocks(schedule.get_sblock("root"))
    return [int(schedule.get(loop).extent) for loop in schedule.get_loops(block)]


def run(mod: tvm.IRModule, inputs: list[np.ndarray], out_shape) -> np.ndarray:
    library = tvm.compile(mod, target=TARGET)
    args = [tvm.runtime.tensor(a, tvm.cpu()) for a in inputs]
    args.append(tvm.runtime.empty(out_shape, "float32", tvm.cpu()))
    library["main"](*args)
    return args[-1].numpy()


def moved_position(mod: tvm.IRModule) -> int | None:
    schedule = tvm.s_tir.Schedule(mod)
    (block,) = normalize_prim_func(schedule)
    return transposed_loop(schedule, block)


def test_nhwc_to_nchw_sweeps_the_channels_inside_each_row():
    """Output (n, c, y, x): the channel loop, outermost in the output's order, runs inside
    the parallel rows and the 4 vectors of each row, around the 16 columns of a vector."""
    x = te.placeholder((1, 64, 64, 5), name="x")
    mod = module(x, topi.transpose(x, (0, 3, 1, 2)))
    assert moved_position(mod) == 0  # of (c, y, x): n, of extent 1, has no loop
    scheduled = default_schedule(mod, TARGET).mod
    assert loop_extents(scheduled) == [64, 4, 5, 16]
    data = np.random.default_rng(0).standard_normal((1, 64, 64, 5)).astype("float32")
    np.testing.assert_array_equal(run(scheduled, [data], (1, 5, 64, 64)),
                                  data.transpose(0, 3, 1, 2))


def test_a_concat_into_nchw_gets_the_same_order():
    parts = [te.placeholder((1, 32, 32, 4), name=f"x{i}") for i in range(3)]
    mod = module(*parts, topi.transpose(topi.concatenate(parts, axis=3), (0, 3, 1, 2)))
    scheduled = default_schedule(mod, TARGET).mod
    assert loop_extents(scheduled) == [32, 2, 12, 16]
    rng = np.random.default_rng(1)
    data = [rng.standard_normal((1, 32, 32, 4)).astype("float32") for _ in parts]
    np.testing.assert_array_equal(run(scheduled, data, (1, 12, 32, 32)),
                                  np.concatenate(data, axis=3).transpose(0, 3, 1, 2))


def test_nchw_to_nhwc_sweeps_the_columns_inside_each_vector_of_channels():
    """Output (n, y, x, c): the column loop goes inside the 2 vectors of channels, so 16
    channel rows of the input are read along the columns while they are in cache."""
    x = te.placeholder((1, 32, 16, 16), name="x")
    mod = module(x, topi.transpose(x, (0, 2, 3, 1)))
    assert moved_position(mod) == 1
    scheduled = default_schedule(mod, TARGET).mod
    assert loop_extents(scheduled) == [32, 16, 16]  # (y, vectors of c) fused, x, 16 lanes
    data = np.random.default_rng(2).standard_normal((1, 32, 16, 16)).astype("float32")
    np.testing.assert_array_equal(run(scheduled, [data], (1, 16, 16, 32)),
                                  data.transpose(0, 2, 3, 1))


def _elementwise():
    a, b = te.placeholder((8, 32), name="a"), te.placeholder((8, 32), name="b")
    return module(a, b, topi.add(a, b))


def _heads_first():
    """(tokens, heads, d) -> (heads, tokens, d): the innermost dimension stays innermost."""
    x = te.placeholder((1, 16, 4, 32), name="x")
    return module(x, topi.transpose(x, (0, 2, 1, 3)))


def _matmul():
    a, b = te.placeholder((16, 32), name="a"), te.placeholder((32, 16), name="b")
    k = te.reduce_axis((0, 32), "k")
    return module(a, b, te.compute((16, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k)))


@pytest.mark.parametrize("make", [_elementwise, _heads_first, _matmul])
def test_kernels_that_read_along_their_output_keep_its_order(make):
    assert moved_position(make()) is None
