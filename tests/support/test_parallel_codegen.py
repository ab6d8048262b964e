"""Kernels built and exported on several threads; the executable exported once and loaded."""

import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from korch_tvm.backend.executable import ExportedExecutable, build_executable
from korch_tvm.support.parallel_codegen import balanced_groups, build_in_parts, export_in_parts
from korch_tvm.support.scratch import scratch_directory, user_temporary_folder

TARGET = tvm.target.Target({"kind": "llvm"})


@I.ir_module
class Small:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")):
        y = R.nn.relu(R.matmul(x, w))
        z = R.add(R.exp(y), R.const(np.arange(8, dtype="float32")))
        return R.multiply(z, x)


def small_module():
    return relax.transform.LegalizeOps()(Small)


def inputs():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((4, 8)).astype("float32"),
            rng.standard_normal((8, 8)).astype("float32")]


def run(executable):
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in inputs()]).numpy()


def expected():
    x, w = inputs()
    return (np.exp(np.maximum(x @ w, 0)) + np.arange(8, dtype="float32")) * x


def test_balanced_groups_put_the_largest_items_apart():
    groups = balanced_groups([5, 1, 4, 2, 3, 3], 2, lambda item: item)
    assert sorted(sum(group) for group in groups) == [9, 9]
    assert sorted(len(group) for group in groups) == [3, 3]
    assert balanced_groups([7], 4, lambda item: item) == [[7]]  # never an empty group


def test_kernels_built_in_parts_compute_what_tvm_compile_builds():
    built = build_in_parts(small_module(), TARGET, 2)
    # three kernels (matmul, relu, exp+add, multiply in some grouping) in two LLVM modules
    assert len(built.mod._collect_dso_modules()) == 2
    np.testing.assert_allclose(run(built), expected(), rtol=1e-5)
    np.testing.assert_allclose(run(built), run(tvm.compile(small_module(), TARGET)), rtol=1e-6)


def test_parts_exported_on_threads_load_and_run_in_a_fresh_process(tmp_path):
    built = build_in_parts(small_module(), TARGET, 2)
    path = tmp_path / "model.so"
    export_in_parts(built, str(path), threads=2)
    np.save(tmp_path / "x.npy", inputs()[0])
    np.save(tmp_path / "w.npy", inputs()[1])
    script = ("import sys, numpy as np, tvm\nfrom tvm import relax\nd = sys.argv[1]\n"
              "vm = relax.VirtualMachine(tvm.runtime.load_module(d + '/model.so'), tvm.cpu())\n"
              "args = [tvm.runtime.tensor(np.load(d + f'/{n}.npy')) for n in ('x', 'w')]\n"
              "np.save(d + '/out.npy', vm['main'](*args).numpy())\n")
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected(), rtol=1e-5)


def test_the_executable_runs_from_its_library_and_exports_as_a_copy(tmp_path):
    executable = build_executable(small_module(), TARGET, threads=2)
    assert isinstance(executable, ExportedExecutable)
    assert executable.mod.imports[0].kind == "library"  # loaded, not JIT-compiled
    np.testing.assert_allclose(run(executable), expected(), rtol=1e-5)
    copy = tmp_path / "copy.so"
    executable.export_library(str(copy))
    assert copy.read_bytes() == executable.path.read_bytes()
    # other export settings export the in-memory executable
    executable.export_library(str(tmp_path / "model.tar"))
    with tarfile.open(tmp_path / "model.tar") as archive:
        assert any(name.endswith(".o") for name in archive.getnames())


def test_the_library_outlives_the_compile_scratch_and_goes_with_its_executable():
    outside = tempfile.gettempdir()
    with scratch_directory() as scratch:
        assert tempfile.gettempdir() == scratch
        assert user_temporary_folder() == outside
        executable = build_executable(small_module(), TARGET, threads=2)
    assert not os.path.exists(scratch)
    folder = executable.path.parent
    assert folder.parent == type(folder)(outside) and executable.path.is_file()
    np.testing.assert_allclose(run(executable), expected(), rtol=1e-5)
    del executable
    assert not folder.exists()


@pytest.mark.parametrize("parts", [1, 3])
def test_one_part_is_plain_tvm_compile_and_more_parts_than_kernels_are_fewer(parts):
    built = build_in_parts(small_module(), TARGET, parts)
    kernels = sum(1 for _, f in small_module().functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc))
    assert len(built.mod._collect_dso_modules()) == min(parts, kernels)
    np.testing.assert_allclose(run(built), expected(), rtol=1e-5)


def test_primfuncs_built_in_parts_into_a_loaded_library_run_and_leave_no_file(tmp_path):
    from korch_tvm.support.parallel_codegen import library_in_parts

    kernels = {gv.name_hint: f.with_attr("global_symbol", gv.name_hint)
               for gv, f in small_module().functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    tempfile.tempdir = str(tmp_path)  # where the library is linked, for a moment
    try:
        library = library_in_parts(tvm.IRModule(kernels), {"kind": "llvm", "opt-level": 0}, 2)
    finally:
        tempfile.tempdir = None
    assert list(tmp_path.iterdir()) == []
    assert library.kind == "library" and all(library.implements_function(n) for n in kernels)
    x, w = inputs()
    out = tvm.runtime.tensor(np.empty((4, 8), "float32"))
    library["matmul"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
    np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5)


def test_where_nothing_can_link_the_executable_runs_from_memory(monkeypatch, caplog):
    from korch_tvm.backend import executable as module

    def no_linker(*args, **kwargs):
        raise RuntimeError("Compilation error: g++: not found")

    monkeypatch.setattr(module, "export_in_parts", no_linker)
    built = build_executable(small_module(), TARGET, threads=2)
    assert not isinstance(built, ExportedExecutable)
    assert "cannot be linked here (Compilation error: g++: not found)" in caplog.text
    np.testing.assert_allclose(run(built), expected(), rtol=1e-5)
