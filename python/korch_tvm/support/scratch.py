"""A compile's scratch folder for its own temporary files, and the user's folder beside it.

During a compile Python's `tempfile.tempdir` points at a scratch folder removed at the end, so
nothing the compile leaves behind in the temporary folder outlives it. What must outlive the
compile (the library an executable was loaded from, backend/executable.py) goes into the
user's own temporary folder instead.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile

_USER_FOLDERS: list[str] = []  # the user's temporary folder, one entry per open scratch


@contextlib.contextmanager
def scratch_directory():
    """A temporary folder for this process's own temporary files during a compile (a
    throw-away tuning log, a read-only seed log's copy), removed at the end.

    Only Python's `tempfile.tempdir` of this process changes, and is restored after; the
    environment (TMPDIR) is left alone, so the worker processes a compile starts keep the
    user's temporary folder: builders export into their costing session's scratch folder
    instead (`costing.metaschedule_setup.export_into`). One compile at a time per process, as
    TVM's own global state already requires.
    """
    previous_folder = tempfile.tempdir
    user_folder = tempfile.gettempdir()
    scratch = tempfile.mkdtemp(prefix="korch-tvm-scratch-", dir=user_folder)
    _USER_FOLDERS.append(user_folder)
    tempfile.tempdir = scratch
    try:
        yield scratch
    finally:
        tempfile.tempdir = previous_folder
        _USER_FOLDERS.pop()
        shutil.rmtree(scratch, ignore_errors=True)


def user_temporary_folder() -> str:
    """The temporary folder outside any open scratch folder."""
    return _USER_FOLDERS[0] if _USER_FOLDERS else tempfile.gettempdir()
