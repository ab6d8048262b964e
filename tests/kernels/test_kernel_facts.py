"""kernel_facts: the blocks of a kernel, read off its statements."""

import tvm

from korch_tvm.backend.cpu_schedule import default_schedule
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.kernels.kernel_facts import kernel_blocks
from korch_tvm.pipeline.stock import stock_fusion

from test_weight_packing import TARGET, conv_block_onnx, prim_funcs


def blocks_by_schedule(kernel_mod: tvm.IRModule) -> list:
    """The reference: every block below the root, as TVM's schedule lists them."""
    schedule = tvm.s_tir.Schedule(kernel_mod)
    found, pending = [], [schedule.get_sblock("root", func_name="main")]
    while pending:
        children = list(schedule.get_child_blocks(pending.pop(0)))
        found += [schedule.get(child).name_hint for child in children]
        pending += children
    return found


def conv_kernels() -> list:
    fused = prim_funcs(stock_fusion(import_onnx(conv_block_onnx(), None), TARGET))
    return [tvm.IRModule({"main": func}) for func in fused.values()]


def test_kernel_blocks_are_the_blocks_tvm_lists_in_code_order():
    kernels = conv_kernels()
    assert len(kernels) == 3
    for kernel in kernels:
        names = [block.name_hint for block in kernel_blocks(kernel)]
        assert names == blocks_by_schedule(kernel)   # unscheduled: no nesting, same order
        assert len(names) >= 3                       # padding, convolution, bias + ReLU


def test_kernel_blocks_of_a_scheduled_kernel_include_the_nested_ones():
    for kernel in conv_kernels():
        scheduled = default_schedule(kernel, TARGET).mod
        names = [block.name_hint for block in kernel_blocks(scheduled)]
        reference = blocks_by_schedule(scheduled)
        assert sorted(names) == sorted(reference)
        assert any(name.endswith("_init") for name in names)   # the decomposed reduction's
