"""The BLAS extension, built once per test session (a no-op after `make install`)."""

import pytest


@pytest.fixture(scope="session")
def blas_extension():
    """Build (or reuse) and load the extension; skip where this machine cannot build it."""
    from korch_tvm.library import LibraryBuildError, build_blas_extension, load_blas_extension

    try:
        path = build_blas_extension()
    except LibraryBuildError as error:
        pytest.skip(f"the BLAS extension cannot be built here: {error}")
    assert load_blas_extension(), f"built {path} but it did not load"
    return path
