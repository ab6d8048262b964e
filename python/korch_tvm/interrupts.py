"""Ctrl-C in a command-line run: remember that it was pressed.

Python raises KeyboardInterrupt wherever the main thread happens to be. When that is a Python
callback TVM called from C++ (applying tuning records through the log's database, say), TVM
hands it back as a plain RuntimeError with no message. The command line asks `pressed()` before
reporting such an error as an internal one, so an interrupted run still ends as interrupted.
"""

from __future__ import annotations

import signal
import sys
import threading

_PRESSED = threading.Event()


def note_and_raise(signum, frame):
    """The command line's SIGINT handler: Python's default behaviour, remembered."""
    _PRESSED.set()
    raise KeyboardInterrupt


def install() -> None:
    """Use `note_and_raise` for SIGINT (main thread only, as `signal` requires).

    A KeyboardInterrupt raised where Python cannot pass it on (an object's `__del__`: TVM's
    worker pools are torn down in one) is printed as an ignored exception with a traceback and
    the run goes on; it is only noted here, and the command line ends the run as interrupted.
    """
    _PRESSED.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, note_and_raise)
    if sys.unraisablehook is not _quiet_interrupt:
        _quiet_interrupt.previous = sys.unraisablehook
        sys.unraisablehook = _quiet_interrupt


def _quiet_interrupt(unraisable) -> None:
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        _PRESSED.set()
    else:
        _quiet_interrupt.previous(unraisable)


_quiet_interrupt.previous = sys.__unraisablehook__


def note() -> None:
    """For other handlers (the profiler's stop-after-this-batch one) to record a Ctrl-C."""
    _PRESSED.set()


def pressed() -> bool:
    return _PRESSED.is_set()


def is_plain(handler) -> bool:
    """Whether `handler` only raises KeyboardInterrupt (Python's default or ours)."""
    return handler is signal.default_int_handler or handler is note_and_raise
