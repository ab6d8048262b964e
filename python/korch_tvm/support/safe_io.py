"""Output files: checked before a long compile, written whole or not at all, faults in one line.

A compile can take minutes; finding only afterwards that `-o` names a read-only mount or a
directory wastes them. And a file written in place on a full disk is left cut short, which a
later run may read as valid. So outputs are checked up front and written through a temporary
file in the same directory that is renamed over the target (a rename within one directory is
atomic on POSIX filesystems).
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable

from ..errors import EnvironmentFault, KorchError


def os_error_message(err: OSError, path: str | None = None, action: str = "write") -> str:
    """'cannot write PATH: No space left on device' - the path and the cause, never empty."""
    shown = path or err.filename or "a file"
    cause = err.strerror or (errno.errorcode.get(err.errno) if err.errno else None) or str(err)
    return f"cannot {action} '{shown}': {cause or type(err).__name__}"


def fault_from_os_error(err: OSError, path: str | None = None) -> KorchError:
    """The exception to raise for `err`: an `EnvironmentFault` (exit 1) for the machine's
    refusals, a plain `KorchError` (exit 2) for a path that cannot be a file (a directory)."""
    message = os_error_message(err, path)
    if err.errno in (errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG, errno.EINVAL):
        return KorchError(message)
    return EnvironmentFault(message)


def check_output_path(path: str, flag: str) -> str:
    """Make sure `path` can be written as a file, before any work; returns its absolute form.

    Creates the directory when missing (as the writers did), refuses a directory given as the
    file (exit 2), and a directory that cannot be written or sits on a read-only mount (exit 1);
    a test file is created and removed, which is the only sure check of permissions.
    """
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise KorchError(f"{flag} '{path}' is a directory; give a file name inside it")
    directory = os.path.dirname(target)
    try:
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(target) and not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), target)
        handle, probe = tempfile.mkstemp(prefix=".korch-write-check-", dir=directory)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise _with_flag(fault_from_os_error(err, path), flag) from None
    return target


def write_atomically(path: str, write: Callable[[str], None]) -> None:
    """`write(temporary_path)` and rename the result over `path`; on any failure the target is
    left as it was and the temporary file removed. OS faults become one-line errors."""
    target = os.path.abspath(path)
    directory = os.path.dirname(target)
    try:
        os.makedirs(directory, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.",
                                             suffix=os.path.splitext(target)[1], dir=directory)
        os.close(handle)
    except OSError as err:
        raise fault_from_os_error(err, target) from None
    try:
        write(temporary)
        os.replace(temporary, target)
    except OSError as err:
        raise fault_from_os_error(err, target) from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_text_atomically(path: str, text: str) -> None:
    """`text` into `path` (UTF-8), whole or not at all."""
    def write(temporary: str) -> None:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    write_atomically(path, write)


def _with_flag(error: KorchError, flag: str) -> KorchError:
    return type(error)(f"{flag}: {error}")
