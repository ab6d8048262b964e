"""Padding that a reduction reads is kept as its own loop nest by the CPU default schedule, so the
reduction's inner loops read the padded input without a bounds test; other padding inlines."""

import numpy as np
import pytest
import tvm
from tvm import te, topi

from test_cpu_schedule import _te_kernel as module, run_kernel
from korch_tvm.backend.cpu_schedule import default_schedule
from korch_tvm.backend.schedule_variants import default_schedules
from korch_tvm.backend.kept_padding import padding_read_by_reductions
from korch_tvm.orchestration.memory_plan import kernel_workspace_bytes

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def padded_conv(size: int = 24, channels: int = 48) -> tvm.IRModule:
    """A 3x3 NHWC convolution, padding 1, with a bias and a ReLU, as ResNet has them."""
    x = te.placeholder((1, size, size, channels), name="x")
    w = te.placeholder((3, 3, channels, channels), name="w")
    b = te.placeholder((channels,), name="b")
    y = topi.nn.conv2d_nhwc(x, w, 1, 1, 1, out_dtype="float32")
    return module(x, w, b, te.compute(y.shape, lambda *i: te.max(y(*i) + b[i[-1]], 0.0)))


def block_text(func, name: str) -> str:
    """The TVMScript of the block statements named `name` (its body follows the header)."""
    text = func.script()
    start = text.index(f'T.sblock("{name}")')
    end = text.find("T.sblock(", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_a_convolution_reads_its_padding_from_a_loop_nest_of_its_own():
    mod = padded_conv()
    assert kept_padding(mod) == {"pad_temp"}
    schedules = default_schedules(mod, TARGET)
    assert len(schedules) >= 3  # the rule, packed and not, and its variants
    reference = run_kernel(mod)
    for schedule in schedules:
        func = schedule.mod["main"]
        assert func.script().count('T.sblock("pad_temp")') == 1
        assert "if_then_else" not in block_text(func, "conv2d_nhwc_update")
        np.testing.assert_allclose(run_kernel(schedule.mod), reference, rtol=1e-5, atol=1e-5)


def test_padding_an_elementwise_block_reads_is_inlined():
    x = te.placeholder((1, 8, 8, 16), name="x")
    padded = topi.nn.pad(x, (0, 1, 1, 0), (0, 1, 1, 0), name="pad_temp")
    mod = module(x, te.compute(padded.shape, lambda *i: padded(*i) * 2.0 + 1.0, name="out"))
    assert kept_padding(mod) == set()
    schedule = default_schedule(mod, TARGET)
    assert 'T.sblock("pad_temp")' not in schedule.mod["main"].script()
    np.testing.assert_allclose(run_kernel(schedule.mod), run_kernel(mod), rtol=1e-6)


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_padding_a_pooling_window_reads_is_inlined(pool):
    """A pooling window does a few operations per element (memory-bound): a second pass over
    the input would cost more than the bounds tests."""
    x = te.placeholder((1, 16, 16, 32), name="x")
    mod = module(x, topi.nn.pool2d(x, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), pool,
                                   layout="NHWC"))
    assert kept_padding(mod) == set()
    np.testing.assert_allclose(run_kernel(default_schedule(mod, TARGET).mod), run_kernel(mod),
                               rtol=1e-5, atol=1e-6)


def test_padding_that_grows_the_input_much_is_inlined():
    """A dilated convolution padded by its dilation: the padded map is (16 + 2 * 6)^2 / 16^2 =
    3x the input, so its copy would not be small beside the convolution."""
    x = te.placeholder((1, 16, 16, 64), name="x")
    w = te.placeholder((3, 3, 64, 64), name="w")
    mod = module(x, w, topi.nn.conv2d_nhwc(x, w, 1, 6, 6, out_dtype="float32"))
    assert kept_padding(mod) == set()
    assert kept_padding(padded_conv(32, 64)) == {"pad_temp"}  # undilated: 1.13x
    assert kept_padding(padded_conv(7, 64)) == {"pad_temp"}  # ResNet's last maps: 1.65x
    assert kept_padding(padded_conv(2, 64)) == set()  # 4x


def test_depthwise_padding_is_inlined():
    x = te.placeholder((1, 32, 32, 64), name="x")
    w = te.placeholder((3, 3, 64, 1), name="w")
    assert kept_padding(module(x, w, topi.nn.depthwise_conv2d_nhwc(x, w, 1, 1, 1))) == set()


def test_the_workspace_a_padded_convolution_needs_counts_its_padded_input():
    size, channels = 24, 48
    padded_bytes = (size + 2) ** 2 * channels * 4
    assert kernel_workspace_bytes(padded_conv(size, channels)["main"]) == padded_bytes


def kept_padding(mod) -> set[str]:
    schedule = tvm.s_tir.Schedule(mod)
    return padding_read_by_reductions(schedule,
                                      schedule.get_child_blocks(schedule.get_sblock("root")))
