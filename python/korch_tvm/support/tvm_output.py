"""Keeps TVM's memory-scope warnings out of the terminal.

TVM's VM executable logs a "Warning: Scope Saving:" line for each constant when a library is
exported and a "Warning: Scope Loaded:" line for each when it is loaded; a compile prints a
screenful of them, almost always with an empty scope, and they say nothing a user can act on.
TVM writes them from C++ straight to file descriptor 2, past every Python logging setting, so
they can only be filtered there: `run_without_tvm_noise` puts a pipe in place of descriptor 2
(a pseudo-terminal when stderr is a terminal, so that whatever checks `isatty()`, such as the
progress line, behaves as before) and a thread forwards everything else, in order, to the real
stderr. TVM's FFI releases the GIL during its calls, so the thread keeps draining while C++ writes.
"""

from __future__ import annotations

import os
import re
import select
import sys
import threading

# "[19:12:25] /project/src/runtime/vm/executable.cc:276: Warning: Scope Saving:<scope>"
NOISE_LINE = re.compile(
    rb"^(?:\[[^\]\n]*\] )?\S*executable\.cc:\d+: Warning: Scope (?:Saving|Loaded):[^\n]*$")

# How long the reader waits for the rest of a line that might be noise before forwarding it.
_PARTIAL_LINE_SECONDS = 0.05
_DRAIN_TIMEOUT_SECONDS = 5.0


class LineFilter:
    """Bytes in, bytes out: drops whole noise lines and passes everything else unchanged.

    A trailing fragment is held back only while it could still become a noise line (it starts
    with TVM's "[" timestamp); any other fragment, a progress line ending in "\\r" say, passes at
    once. `release_partial` lets a held fragment go when nothing more arrives."""

    def __init__(self):
        self._held = b""
        self._mid_line = False  # part of the current line already went out: it is not noise

    def feed(self, data: bytes) -> bytes:
        data, self._held = self._held + data, b""
        lines = data.split(b"\n")
        fragment = lines.pop()
        kept = []
        for line in lines:
            if self._mid_line or not NOISE_LINE.match(line.rstrip(b"\r")):
                kept.append(line + b"\n")
            self._mid_line = False
        if fragment.startswith(b"[") and b"\r" not in fragment and not self._mid_line:
            self._held = fragment
        elif fragment:
            kept.append(fragment)
            self._mid_line = True
        return b"".join(kept)

    def release_partial(self) -> bytes:
        held, self._held = self._held, b""
        if held:
            self._mid_line = True
        return held


class _Redirect:
    """Descriptor 2 pointed at a pipe (or pseudo-terminal) that a daemon thread filters into
    the descriptor 2 there was before. The thread outlives `restore` on purpose: worker processes
    started meanwhile inherited the pipe, and whatever they still write must reach stderr too."""

    def __init__(self):
        self._target = os.dup(2)
        self._read_fd, write_fd = _open_channel(self._target)
        self._filter = LineFilter()
        self._drain_requested = threading.Event()
        self._drained = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="korch-stderr-filter",
                                        daemon=True)
        sys.stderr.flush()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread.start()

    def restore(self) -> None:
        """Puts descriptor 2 back and returns once all that was written before has gone out."""
        _flush_python_stderr()
        os.dup2(self._target, 2)
        self._drain_requested.set()
        self._drained.wait(_DRAIN_TIMEOUT_SECONDS)

    def _pump(self) -> None:
        try:
            self._forward_until_closed()
        finally:
            self._write(self._filter.release_partial())
            self._drained.set()
            os.close(self._read_fd)
            os.close(self._target)

    def _forward_until_closed(self) -> None:
        while True:
            ready, _, _ = select.select([self._read_fd], [], [], _PARTIAL_LINE_SECONDS)
            if not ready:  # quiet: a held fragment is not the start of a noise line after all
                self._write(self._filter.release_partial())
                if self._drain_requested.is_set():
                    self._drained.set()
                continue
            try:
                data = os.read(self._read_fd, 65536)
            except OSError:  # a pseudo-terminal reads EIO once no writer is left
                data = b""
            if not data:
                return
            self._write(self._filter.feed(data))

    def _write(self, data: bytes) -> None:
        while data:
            try:
                written = os.write(self._target, data)
            except OSError:  # the real stderr is gone; nothing left to show the bytes on
                return
            data = data[written:]


def _open_channel(target_fd: int) -> tuple[int, int]:
    """(read end, write end): a raw pseudo-terminal of the terminal's size when `target_fd` is
    a terminal (no newline translation, no echo), else a pipe."""
    if not os.isatty(target_fd):
        return os.pipe()
    import fcntl
    import termios
    import tty

    master, slave = os.openpty()
    tty.setraw(slave)
    try:
        size = fcntl.ioctl(target_fd, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    except OSError:
        pass
    return master, slave


def _flush_python_stderr() -> None:
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def run_without_tvm_noise(command, args, *, enabled: bool = True):
    """`command(args)` with TVM's scope warnings filtered out of descriptor 2 (when `enabled`,
    and where descriptor 2 exists); everything else written to stderr still arrives, in order,
    before this returns or raises."""
    if not enabled:
        return command(args)
    try:
        redirect = _Redirect()
    except OSError:  # no descriptor 2 to filter (a daemon, say): run as it is
        return command(args)
    try:
        return command(args)
    finally:
        redirect.restore()
