"""The files of one log directory: their names, and every read, write and lock of them.

Several processes share a log, and a record line names its workload by line number, so a write
must never interleave with another or be left half done: each is one `O_APPEND` write of whole
lines, cut back if it falls short, under an exclusive `fcntl` lock on `.korch.lock`; a file
rewritten is replaced whole. Every path is checked to stay inside the directory. A directory
that cannot be written is still read (its `writable` is False, and nothing is written).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..backend.target import inside_root
from ..errors import EnvironmentFault, KorchError

logger = logging.getLogger("korch_tvm.tuning_log")  # the log's one voice, whichever part speaks

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
LOCK_FILE = ".korch.lock"
# Trials asked of MetaSchedule per workload line, one JSON line [workload line, trials] per
# tuning round. A kernel whose search space is small yields fewer records than trials asked;
# without this it would look under-tuned, and be searched again, on every compile.
ATTEMPTS_FILE = "tuning_attempts.json"
REJECTED_SUFFIX = ".rejected"
REASONS_SUFFIX = ".rejected.reasons"


class LogDirectory:
    """The files of the log directory `directory` (created if missing, when it can be)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.writable = self._make_directory()
        self._thread_lock = threading.RLock()
        self._lock_depth = 0

    def path(self, name: str) -> str:
        """The file `name` of the log, refused if it resolves outside the directory (a symbolic link
        planted in a shared log must not make us write elsewhere)."""
        return inside_root(self.directory, name)

    def _make_directory(self) -> bool:
        for name in ("", WORKLOAD_FILE, RECORD_FILE):  # what is not a file cannot be a log
            path = self.path(name) if name else self.directory
            if os.path.exists(path) and os.path.isdir(path) != (not name):
                kind = "a directory" if name else "not a directory"
                raise KorchError(f"tuning log {path} is {kind}; move it away to start afresh")
        try:
            os.makedirs(self.directory, exist_ok=True)
            for name in (WORKLOAD_FILE, RECORD_FILE, LOCK_FILE):
                with open(self.path(name), "ab"):
                    pass
            return True
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise _fault("cannot create the tuning log", err.filename or self.directory,
                             err) from None
            logger.warning("tuning log %s is read-only (%s); new records stay in memory and are "
                           "lost at exit", self.directory, err.strerror)
            return False

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive lock across processes and threads, re-entrant within this object.

        (`flock` on a second descriptor of the same file would block this very process.)
        A read-only log has no writers to exclude.
        """
        with self._thread_lock:
            if not self.writable or self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            with open(self.path(LOCK_FILE), "ab") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                    fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def read(self, name: str, offset: int = 0) -> bytes:
        """The bytes of the file `name` from `offset` on (none if it does not exist)."""
        try:
            with open(self.path(name), "rb") as file:
                file.seek(offset)
                return file.read()
        except FileNotFoundError:
            return b""
        except OSError as err:  # unreadable, or a directory in its place
            raise _fault("cannot read the tuning log", self.path(name), err) from None

    def file_ids(self) -> tuple:
        """(inode, device) of the workload and record files: new ones when a file is replaced."""
        ids = []
        for name in (WORKLOAD_FILE, RECORD_FILE):
            try:
                stat = os.stat(self.path(name))
                ids.append((stat.st_ino, stat.st_dev))
            except FileNotFoundError:
                ids.append(None)
        return tuple(ids)

    def set_aside_corrupt(self, name: str, bad_lines: list[bytes], reasons: list[str]) -> None:
        """Warn about each of `bad_lines` of the file `name` (with its one of `reasons`) and keep
        them verbatim in `<name>.corrupt`, so nothing the user had is destroyed."""
        for line, reason in zip(bad_lines, reasons):
            logger.warning("tuning log %s: skipped a corrupt line (%s)", self.path(name), reason)
        if self.writable and bad_lines:
            self.write_whole(name + ".corrupt", b"".join(line + b"\n" for line in bad_lines))

    def keep_aside(self, name: str, lines: list[bytes], reasons: list[str]) -> None:
        """Append `lines` of the file `name` (refused or wrong) verbatim to `<name>.rejected`
        and their `reasons`, one line each, to `<name>.rejected.reasons` (line n of one matches
        line n of the other)."""
        if not (self.writable and lines):
            return
        self.write_whole(name + REJECTED_SUFFIX, b"".join(line + b"\n" for line in lines))
        self.write_whole(name + REASONS_SUFFIX, b"".join(
            " ".join(reason.split()).encode() + b"\n" for reason in reasons))

    def replace(self, name: str, lines: list[bytes]) -> None:
        """Make `lines` the whole of the file `name`, in one step: a temporary file, synced,
        then renamed over it; a reader sees the old file or the new one, never a mix."""
        temporary = self.path(f".{name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "wb") as file:
                file.write(b"".join(line + b"\n" for line in lines))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path(name))
        except OSError as err:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise _fault("cannot rewrite the tuning log", self.path(name), err) from None

    def append(self, name: str, line: bytes) -> None:
        """`write_whole` where the log is writable; nothing in a read-only one."""
        if self.writable:
            self.write_whole(name, line)

    def write_whole(self, name: str, data: bytes) -> None:
        """Append `data` to the file `name` whole or not at all: on a short write or an error
        (no space, say) the file is cut back to its old size, and the fault is raised naming
        the file."""
        path = self.path(name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise _fault("cannot write the tuning log", path, err) from None
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, f"short write, {written} of {len(data)} bytes")
                os.fsync(fd)
            except OSError as err:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                raise _fault("cannot write the tuning log", path, err) from None
        finally:
            os.close(fd)


def _split_lines(data: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines (without newline) and the unterminated tail, if any."""
    *lines, tail = data.split(b"\n")
    return lines, tail


def _fault(what: str, path: str, err: OSError) -> EnvironmentFault:
    """One line naming the file and the cause (errno's text)."""
    return EnvironmentFault(f"{what} {path}: {err.strerror or err}")
