"""The build step's refusals, the loader's absent-extension path, and Implementation records."""

import logging
import math
import sys

import pytest
import tvm
from tvm import relax

from korch_tvm.library import build as build_command
from korch_tvm.library import cublas_build
from korch_tvm.library import compile_extension as library_build
from korch_tvm.library import implementations_for, load_blas_extension
from test_library_gemm_match import legalized_kernels


def test_no_compiler_is_one_clear_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CXX", "no-such-compiler-h6")
    with pytest.raises(library_build.LibraryBuildError, match="no C\\+\\+ compiler found"):
        library_build.build_blas_extension(tmp_path)
    assert build_command.main(["--directory", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("korch_tvm: library kernels not built: no C++ compiler found")
    assert err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_a_compile_error_names_the_step(monkeypatch, tmp_path):
    monkeypatch.setattr(library_build, "BLAS_SOURCE", tmp_path / "broken.cc")
    (tmp_path / "broken.cc").write_text("this is not C++\n")
    with pytest.raises(library_build.LibraryBuildError, match="compiling blas_ext.cc failed"):
        library_build.build_blas_extension(tmp_path / "out", force=True)
    assert not list((tmp_path / "out").iterdir())           # no partial outputs left


def test_an_unbuilt_extension_is_simply_unavailable(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="korch_tvm.library"):
        assert load_blas_extension(tmp_path) is False
    assert "BLAS library kernels unavailable" in caplog.text and "is not built" in caplog.text


def test_outputs_are_named_by_the_source_they_came_from(tmp_path):
    object_path, shared_path = library_build.blas_artifacts(tmp_path)
    key = library_build.build_key()
    assert object_path.name == f"korch_blas-{key}.o" and shared_path.name == f"korch_blas-{key}.so"
    if sys.prefix != sys.base_prefix:                           # inside a venv: the venv's
        assert library_build.library_dir().is_relative_to(sys.prefix)


def test_implementations_measure_themselves_and_emit_their_call(blas_extension):
    [kernel] = legalized_kernels([(2, 16, 8), (2, 8, 12)], relax.op.matmul)
    [implementation] = implementations_for(kernel)
    assert (implementation.name, implementation.function) == ("openblas.sbgemm",
                                                              "korch_tvm.blas.sbgemm")
    seconds = implementation.measure(repeats=3, min_repeat_seconds=1e-4)
    assert math.isfinite(seconds) and 0 < seconds < 0.1
    a, b = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in
            (("a", (2, 16, 8)), ("b", (2, 8, 12))))
    call = implementation.call([a, b], relax.TensorType((2, 16, 12), "float32"))
    assert call.op.same_as(tvm.ir.Op.get("relax.call_dps_packed"))
    assert str(call.args[0].global_symbol) == "korch_tvm.blas.sbgemm"
    assert [int(x.value) for x in call.args[1].fields[2:]] == [0, 0]
    [add] = legalized_kernels([(4, 4)], lambda x: relax.op.add(x, x))
    assert implementations_for(add) == []


def test_without_the_extension_a_gemm_kernel_has_no_implementation(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(library_build, "library_dir", lambda: tmp_path)
    monkeypatch.setattr(cublas_build, "library_dir", lambda: tmp_path)
    [kernel] = legalized_kernels([(4, 6), (6, 5)], relax.op.matmul)
    with caplog.at_level(logging.INFO, logger="korch_tvm.library"):
        assert implementations_for(kernel) == []
        assert implementations_for(kernel, device="cuda") == []
    assert "BLAS library kernels unavailable" in caplog.text
    assert "cuBLAS library kernels unavailable" in caplog.text
