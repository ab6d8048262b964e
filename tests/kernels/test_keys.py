"""Kernel keys: a module's structural hash is computed once while the module lives."""

import gc

import tvm
import tvm_ffi
from tvm import te

from korch_tvm.kernels import keys


def _add_one(size: int) -> tvm.IRModule:
    a = te.placeholder((size,), name="a")
    b = te.compute((size,), lambda i: a[i] + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def test_a_module_is_hashed_once_while_it_lives(monkeypatch):
    calls = []

    def counted(value):
        calls.append(1)   # not the module: that would keep it alive
        return tvm_ffi.structural_hash(value)

    counting_ffi = type("CountingFFI", (), {"structural_hash": staticmethod(counted)})
    monkeypatch.setattr(keys, "tvm_ffi", counting_ffi)
    first, twin = _add_one(16), _add_one(16)
    assert keys.module_hash(first) == tvm_ffi.structural_hash(first)
    assert keys.module_hash(first) == keys.module_hash(twin)   # equal structure, equal hash
    assert len(calls) == 2                                      # first once, its twin once
    expected_key = format(tvm_ffi.structural_hash(first) & (2**64 - 1), "016x")
    assert keys.structural_key(first) == expected_key
    assert len(calls) == 2
    gc.collect()   # earlier tests' modules that only a collection frees: gone before counting
    count = len(keys._HASHES)
    del twin
    gc.collect()
    assert len(keys._HASHES) == count - 1                       # gone with its module

