"""A Relax module's kernels compiled, and their object code emitted, on several threads.

`tvm.compile` lowers all PrimFuncs of a module into one LLVM module on one thread, and
`export_library` emits that module's object code on one thread again: the longest serial steps
left in a cold compile (bench/results/compile-time.md). LLVM modules are independent of one
another and TVM's FFI calls release the GIL, so here the PrimFuncs are split into one LLVM
module per thread, of about equal size, and each is built and emitted on its own thread. The
executable is the one `tvm.compile` makes (the same Relax pipeline, bytecode, constants); its
first LLVM module imports the others, as TVM's own build imports device modules.

Relies on `tvm.relax.vm_build`'s codegen and link steps and the runtime's import packing, which
are private to TVM 0.27 (pinned): tests/support/test_parallel_codegen.py checks them.
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import tvm
from tvm import relax
from tvm.relax import vm_build

SHARED_LIBRARY_SUFFIXES = (".so",)


def build_in_parts(mod: tvm.IRModule, target, parts: int) -> relax.VMExecutable:
    """`tvm.compile(mod, target)` for a CPU target, its PrimFuncs built as up to `parts` LLVM
    modules on as many threads (one part: `tvm.compile` itself)."""
    if parts <= 1 or (mod.attrs and mod.attrs.get("external_mods")):
        return tvm.compile(mod, target=target)
    with target:
        mod = relax.get_pipeline("default")(mod)
    attrs = dict(mod.attrs) if mod.attrs else {}
    params = dict(attrs.get("const_name_to_constant", {}))
    builder = relax.ExecBuilder()
    tir_mod = vm_build._filter_tir(vm_build._vmcodegen(builder, mod, "bytecode"))
    libs = _built_parts(tir_mod, target, parts) if tir_mod is not None else []
    for lib in libs[1:]:
        libs[0].import_module(lib)
    linked = vm_build._ffi_api.VMLink(builder, target, libs[0] if libs else None,
                                      list(attrs.get("external_mods", [])), params)
    return relax.VMExecutable(linked)


def _built_parts(tir_mod: tvm.IRModule, target, parts: int) -> list:
    """tir_mod's PrimFuncs as LLVM modules, built on one thread each."""
    groups = balanced_groups(list(tir_mod.functions_items()), parts,
                             lambda item: len(tvm.ir.save_json(item[1])))
    modules = [tvm.IRModule(dict(group), attrs=tir_mod.attrs) for group in groups]
    context = tvm.transform.PassContext.current()  # thread-local: each thread enters it again

    def build(module):
        with context:
            return tvm.tirx.build(module, target=target)

    return _on_threads(build, modules)


def balanced_groups(items: list, parts: int, size) -> list[list]:
    """`items` in at most `parts` non-empty groups of about equal total `size(item)`: the
    largest first, each into the group smallest so far."""
    groups = [[] for _ in range(min(parts, len(items)))]
    totals = [0] * len(groups)
    for item in sorted(items, key=size, reverse=True):
        smallest = totals.index(min(totals))
        groups[smallest].append(item)
        totals[smallest] += size(item)
    return groups


def export_in_parts(executable, path: str, addons=(), options=(), threads: int = 1) -> None:
    """`executable.export_library(path, addons=addons, options=options)`, the object code of
    its LLVM modules emitted on up to `threads` threads. Anything but LLVM host modules linked
    into a shared library goes through TVM's own export."""
    modules = executable.mod._collect_dso_modules()
    if (threads <= 1 or len(modules) <= 1 or not str(path).endswith(SHARED_LIBRARY_SUFFIXES)
            or any(module.kind != "llvm" or module["__tvm_is_system_module"]()
                   for module in modules)):
        executable.export_library(str(path), addons=list(addons), options=list(options))
        return
    from tvm.runtime import _ffi_api as runtime_api
    from tvm.support import cc

    with tempfile.TemporaryDirectory(prefix="korch-tvm-export-") as workspace:
        objects = _emitted(modules, workspace, threads)
        # the Relax executable and its import tree, as TVM's export packs them
        packed = os.path.join(workspace, "devc.o")
        target = modules[0]["_get_target_string"]()
        runtime_api.ModulePackImportsToLLVM(executable.mod, False, target, "").write_to_file(
            packed)
        cc.create_shared(str(path), objects + [packed] + list(addons), options=list(options))


def library_in_parts(tir_mod: tvm.IRModule, target, parts: int) -> tvm.runtime.Module:
    """tir_mod's PrimFuncs (each with its global symbol) compiled on up to `parts` threads
    into one shared library, and loaded: what running them costs where the JIT would compile
    the whole module on one thread first. The file goes at once (the library stays mapped)."""
    from tvm.support import cc

    modules = _built_parts(tir_mod, tvm.target.Target(target), parts)
    with tempfile.TemporaryDirectory(prefix="korch-tvm-library-") as folder:
        objects = _emitted(modules, folder, parts)
        path = os.path.join(folder, "library.so")
        cc.create_shared(path, objects)
        return tvm.runtime.load_module(path)


def _emitted(modules: list, folder: str, threads: int) -> list[str]:
    """The object files of LLVM `modules`, written into `folder` on up to `threads` threads."""
    objects = [os.path.join(folder, f"lib{index}.o") for index in range(len(modules))]
    _on_threads(lambda pair: pair[0].write_to_file(pair[1]), list(zip(modules, objects)),
                threads)
    return objects


def _on_threads(work, items: list, threads: int | None = None) -> list:
    """[work(item) for item in items], on up to `threads` (default: one per item) threads."""
    with ThreadPoolExecutor(max_workers=max(1, threads or len(items))) as pool:
        return list(pool.map(work, items))
