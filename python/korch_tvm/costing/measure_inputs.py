"""The inputs a kernel is timed on: random floats, integers and booleans zero.

MetaSchedule's runners fill every argument with `tvm.contrib.random.random_fill_for_measure`,
which writes random bits whatever the dtype: an int64 buffer comes out holding values near
4.6e18. A kernel that uses such an input as an index (an embedding `take`, a gather) then reads
far outside its table and the runner's worker dies ("Subprocess terminated"), so the kernel was
reported as failed however fast it runs. Zero is a valid index into any non-empty axis, also
after the frontend's negative-index normalization (`where(i < 0, i + n, i)`) and for a boolean
that selects between two indices, so integer and boolean inputs are zero here; floats keep
MetaSchedule's random fill, so float kernels are timed exactly as before.
(costing/record_check.py runs kernels on the same convention.)

A gather timed on zero indices reads one row of its table over and over, which is kinder to the
cache than distinct rows; every kernel is timed so, which keeps their costs comparable.
"""

from __future__ import annotations

import numpy as np

RANDOM_FILL = "tvm.contrib.random.random_fill_for_measure"


def is_float_dtype(dtype: str) -> bool:
    """Whether MetaSchedule's random fill is a fair input for a buffer of `dtype`."""
    return str(dtype).startswith(("float", "bfloat"))


def _filled(empty, random_fill, args_info, alloc_repeat: int) -> list[list]:
    """`alloc_repeat` argument lists for `args_info` (MetaSchedule's JSON form of each argument:
    ["TENSOR", dtype, shape]); `empty(shape, dtype)` allocates on the runner's device."""
    repeated = []
    for _ in range(alloc_repeat):
        args = []
        for info in args_info:
            kind, dtype, shape = info[0], str(info[1]), [int(d) for d in info[2]]
            assert kind == "TENSOR", f"a kernel argument of kind {kind!r} cannot be allocated"
            tensor = empty(shape, dtype)
            if is_float_dtype(dtype):
                random_fill(tensor)
            else:
                tensor.copyfrom(np.zeros(shape, dtype=dtype))
            args.append(tensor)
        repeated.append(args)
    return repeated


def alloc_in_range_arguments(device, args_info, alloc_repeat: int) -> list[list]:
    """LocalRunner's `f_alloc_argument`: runs in the runner's worker process."""
    import tvm

    random_fill = tvm.get_global_func(RANDOM_FILL)
    return _filled(lambda shape, dtype: tvm.runtime.empty(shape, dtype, device),
                   random_fill, args_info, alloc_repeat)


def rpc_alloc_in_range_arguments(session, device, args_info, alloc_repeat: int) -> list[list]:
    """RPCRunner's `f_alloc_argument`: the same inputs, allocated on the remote device."""
    import tvm

    random_fill = session.get_function(RANDOM_FILL)
    return _filled(lambda shape, dtype: tvm.runtime.empty(shape, dtype, device),
                   random_fill, args_info, alloc_repeat)
