"""LibraryExecutable: a user's plain `executable.export_library(path)` links the extension."""

import subprocess
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from korch_tvm.backend.executable import build_executable
from korch_tvm.library import LibraryExecutable, UseLibraryGemm, self_contained
from test_library_export import CASES, FRESH_RUN, gemm_module


@pytest.mark.parametrize("build", ["tvm.compile", "build_executable"])
def test_its_own_export_library_runs_in_a_fresh_process(blas_extension, tmp_path, build):
    rewritten = UseLibraryGemm()(gemm_module({"plain": CASES["plain"]}))
    if build == "tvm.compile":
        executable = self_contained(tvm.compile(rewritten, target="llvm"), rewritten)
        assert isinstance(executable, LibraryExecutable)
    else:  # what a compile returns: exported with the extension once, loaded, copied here
        executable = build_executable(rewritten, tvm.target.Target("llvm"), threads=2)
        assert isinstance(executable.built, LibraryExecutable)
    assert isinstance(executable, relax.VMExecutable)
    executable.export_library(str(tmp_path / "model.so"))   # what a user writes
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal(s, dtype="float32") for s in CASES["plain"][:2])
    np.save(tmp_path / "plain0.npy", a)
    np.save(tmp_path / "plain1.npy", b)
    done = subprocess.run([sys.executable, "-c", FRESH_RUN, str(tmp_path), "plain"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "korch_tvm imported: False" in done.stdout
    np.testing.assert_allclose(np.load(tmp_path / "plain_out.npy"), a @ b + 1.0, rtol=1e-5,
                               atol=1e-4)


def test_a_module_without_library_calls_keeps_its_executable(blas_extension):
    mod = gemm_module({"plain": CASES["plain"]})
    executable = tvm.compile(mod, target="llvm")
    assert self_contained(executable, mod) is executable
