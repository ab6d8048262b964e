"""A kernel's canonical form and its key: what the tuning log and the task list are keyed by.

Keys: MetaSchedule's database hashes ``_normalize_mod(func)``, which adds ``global_symbol="main"``
(if absent) and ``tirx.noalias``, and counts every attribute. A kernel is therefore kept in one
canonical form (`canonical_prim_func`: only ``s_tir`` and ``tirx.noalias`` attributes, no
``global_symbol``), and `kernel_module` is exactly what MetaSchedule normalises it to. Whoever
puts a tuned kernel into the final model must insert the canonical PrimFunc itself. The one
attribute that says something about the call site, ``layout_free_buffers`` (the parameters fed
by constant weights, which tuning may pre-pack), is kept; it is set by the same rule here and in
the model (`layout.mark_layout_free_weights`).
"""

from __future__ import annotations

import weakref
from typing import Mapping

import tvm
import tvm_ffi

from .weight_packing import LAYOUT_FREE_ATTR

# layout_free_buffers (set from the call sites, see kernels/weight_packing.py) lets MetaSchedule
# pre-pack weights; it is part of the key, so the standalone kernel and the model's kernel must
# both carry it.
_KEPT_ATTRS = ("s_tir", "tirx.noalias", LAYOUT_FREE_ATTR)


def canonical_prim_func(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """Strip attributes that vary between otherwise identical kernels (names, op_pattern...)."""
    for key in list(func.attrs.keys()) if func.attrs is not None else []:
        if key not in _KEPT_ATTRS or (key == LAYOUT_FREE_ATTR and len(func.attrs[key]) == 0):
            func = func.without_attr(key)
    return func.with_attr("tirx.noalias", True)


def kernel_module(func: tvm.tirx.PrimFunc) -> tvm.IRModule:
    """The standalone module of a kernel, as MetaSchedule normalises it (tune and look up this)."""
    return tvm.IRModule({"main": canonical_prim_func(func).with_attr("global_symbol", "main")})


def structural_key(kernel_mod: tvm.IRModule) -> str:
    """Hex structural hash of a `kernel_module`: equal kernels (any names) share a key."""
    return format(module_hash(kernel_mod) & (2**64 - 1), "016x")


_HASHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def module_hash(kernel_mod: tvm.IRModule) -> int:
    """`tvm_ffi.structural_hash`, remembered for as long as the module lives: a compile looks
    the same kernel modules up in the log again every costing round (a detection head's compile
    hashed 33,643 times, 5.5 s). Kernel modules are never changed in place once built."""
    known = _HASHES.get(kernel_mod)
    if known is None:
        known = _HASHES[kernel_mod] = tvm_ffi.structural_hash(kernel_mod)
    return known


def structurally_equal_groups(items: Mapping) -> dict:
    """{first key: [keys whose values are structurally equal to its value]}, in `items`' order
    (a module or PrimFunc per key): what is measured once, or compiled once."""
    groups: dict = {}
    by_hash: dict[int, list] = {}
    for key, value in items.items():
        bucket = by_hash.setdefault(module_hash(value), [])
        first = next((kept for kept in bucket if tvm_ffi.structural_equal(items[kept], value)),
                     None)
        if first is None:
            bucket.append(key)
            groups[key] = [key]
        else:
            groups[first].append(key)
    return groups
