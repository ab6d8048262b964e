"""Ctrl-C in a command-line run: remember that it was pressed.

Python raises KeyboardInterrupt wherever the main thread happens to be. When that is a Python
callback TVM called from C++ (applying tuning records through the log's database, say), TVM
hands it back as a plain RuntimeError with no message. The command line asks `pressed()` before
reporting such an error as an internal one, so an interrupted run still ends as interrupted.

Ctrl-C in a terminal goes to every process of the foreground group, so also to the builder
and runner workers TVM starts; one that was still importing TVM printed a page of traceback,
and a pool whose worker died so could hang the run. During a command-line run the main thread
therefore blocks SIGINT, which every thread and process it starts afterwards inherits (a
blocked mask survives fork and exec), and one listener thread takes the signal and hands it to
the main thread's handler. Workers never see Ctrl-C; they end when their pool is shut down.
A blocked SIGINT no longer cuts short a wait of the main thread (a lock, a future), so the
listener then also sends the main thread SIGURG (ignored by default, so harmless to anything
else), whose empty handler makes the wait return and the SIGINT handler run at once.

While MetaSchedule works (`stopping_after_batch`), the same handler does not raise at the first
Ctrl-C: MetaSchedule calls Python (builder, runner) from C++, a KeyboardInterrupt raised inside
such a callback comes back as a plain RuntimeError, and under load it crashed TVM's worker pools
(a segfault instead of exit 130). So the first Ctrl-C only asks to stop: the batch in flight
finishes, its records are written, and the next check between batches (`raise_if_stopped`)
raises KeyboardInterrupt. A second Ctrl-C stops at once (`aborted()` then says so).
"""

from __future__ import annotations

import _thread
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("korch_tvm.profiler")

_PRESSED = threading.Event()
_LISTENING = threading.Event()
_STOP = threading.Event()  # stop requested during a batch (first Ctrl-C)
_ABORT = threading.Event()  # stop at once (second Ctrl-C): the batch in flight is not recorded
_listener: threading.Thread | None = None
_batch_depth = 0  # how many `stopping_after_batch` blocks the main thread is in


def note_and_raise(signum, frame):
    """The SIGINT handler: Python's default behaviour, remembered; inside
    `stopping_after_batch`, the first Ctrl-C only asks to stop after the batch in flight."""
    _PRESSED.set()
    if _batch_depth and not _STOP.is_set():
        _STOP.set()
        logger.warning("stopping after the current batch; its records are kept "
                       "(Ctrl-C again to stop at once)")
        return
    if _batch_depth:
        _ABORT.set()
    raise KeyboardInterrupt


@contextmanager
def stopping_after_batch() -> Iterator[None]:
    """Work in batches that a Ctrl-C lets finish (see the module docstring).

    Inside, call `raise_if_stopped()` between batches. The command line installs the handler
    (`install`); a library caller that left Python's default handler in place gets it for the
    duration, so both stop the same way. Any other handler, or a thread other than the main
    one, is left alone: Ctrl-C then does what that handler does.
    """
    global _batch_depth
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not is_plain(previous):
        yield
        return
    if not _batch_depth:
        _STOP.clear()
        _ABORT.clear()
    if previous is not note_and_raise:
        signal.signal(signal.SIGINT, note_and_raise)
    _batch_depth += 1
    try:
        yield
        raise_if_stopped()
    finally:
        _batch_depth -= 1
        if previous is not note_and_raise:
            signal.signal(signal.SIGINT, previous)


def raise_if_stopped() -> None:
    """KeyboardInterrupt when a Ctrl-C asked to stop (call it between batches)."""
    if _STOP.is_set():
        _quiet_pool_teardown()
        raise KeyboardInterrupt


def aborted() -> bool:
    """Whether a second Ctrl-C asked to stop at once (the batch in flight is then no failure
    to record)."""
    return _ABORT.is_set()


def _quiet_pool_teardown() -> None:
    """After Ctrl-C, TVM's worker pools get collected on their own threads, and their __del__
    prints 'cannot join current thread' as a raw traceback; send that to the debug log."""
    previous = sys.unraisablehook
    if getattr(previous, "korch_quiet", False):
        return

    def hook(unraisable):
        if "PopenPool" in repr(unraisable.object):
            logger.debug("ignored while stopping worker pools: %s", unraisable.exc_value)
            return
        previous(unraisable)

    hook.korch_quiet = True
    sys.unraisablehook = hook


def install() -> None:
    """Use `note_and_raise` for SIGINT (main thread only, as `signal` requires).

    A KeyboardInterrupt raised where Python cannot pass it on (an object's `__del__`: TVM's
    worker pools are torn down in one) is printed as an ignored exception with a traceback and
    the run goes on; it is only noted here, and the command line ends the run as interrupted.
    """
    _PRESSED.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, note_and_raise)
        _start_listener()
    if sys.unraisablehook is not _quiet_interrupt:
        _quiet_interrupt.previous = sys.unraisablehook
        sys.unraisablehook = _quiet_interrupt


def uninstall() -> None:
    """Undo `install`'s signal mask (the handler stays): for a caller that goes on after the
    command, such as a test running the command line in its own process."""
    global _listener
    if _listener is None or threading.current_thread() is not threading.main_thread():
        return
    _LISTENING.clear()
    signal.pthread_kill(_listener.ident, signal.SIGINT)  # wakes it; it sees it should stop
    _listener.join(timeout=5)
    _listener = None
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGURG, _wake_main.previous)


def _start_listener() -> None:
    """Block SIGINT here (and so in everything started from now on) and listen for it on a
    thread of ours, which passes it to whatever SIGINT handler the main thread has then."""
    global _listener
    if _listener is not None or not hasattr(signal, "pthread_sigmask"):
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    _wake_main.previous = signal.signal(signal.SIGURG, _wake_main)
    _LISTENING.set()
    _listener = threading.Thread(target=_listen, name="korch-ctrl-c", daemon=True)
    _listener.start()


def _listen() -> None:
    while True:
        signal.sigwait({signal.SIGINT})
        if not _LISTENING.is_set():
            return
        _thread.interrupt_main(signal.SIGINT)  # runs the main thread's SIGINT handler
        signal.pthread_kill(threading.main_thread().ident, signal.SIGURG)


def _wake_main(signum, frame) -> None:
    """Nothing: arriving is enough to end the main thread's wait (see the module docstring)."""


_wake_main.previous = signal.SIG_DFL


def _quiet_interrupt(unraisable) -> None:
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        _PRESSED.set()
    else:
        _quiet_interrupt.previous(unraisable)


_quiet_interrupt.previous = sys.__unraisablehook__


def note() -> None:
    """Record a Ctrl-C that arrived some other way (a test standing in for the handler)."""
    _PRESSED.set()


def pressed() -> bool:
    """Whether Ctrl-C was pressed since `install` (an error TVM made of it is an interruption)."""
    return _PRESSED.is_set()


def is_plain(handler) -> bool:
    """Whether `handler` only raises KeyboardInterrupt (Python's default or ours)."""
    return handler is signal.default_int_handler or handler is note_and_raise
