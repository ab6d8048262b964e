"""One Ctrl-C mechanism: the handler the command line installs stops MetaSchedule work after
the batch in flight, and a library caller with Python's default handler gets the same."""

import signal

import pytest

from korch_tvm.support import interrupts


@pytest.fixture
def default_handler():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_first_ctrl_c_in_a_batch_stops_after_it_and_the_second_at_once(default_handler, caplog):
    with pytest.raises(KeyboardInterrupt):
        with interrupts.stopping_after_batch():
            handler = signal.getsignal(signal.SIGINT)
            assert handler is interrupts.note_and_raise  # the one handler, for the duration
            handler(signal.SIGINT, None)  # first Ctrl-C: noted, the batch goes on
            assert interrupts.pressed() and not interrupts.aborted()
            assert "stopping after the current batch" in caplog.text
            with pytest.raises(KeyboardInterrupt):
                handler(signal.SIGINT, None)  # second: at once
            assert interrupts.aborted()
            interrupts.raise_if_stopped()  # the check between batches raises
            pytest.fail("raise_if_stopped did not raise")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_outside_a_batch_ctrl_c_raises_and_a_new_batch_starts_clean(default_handler):
    with pytest.raises(KeyboardInterrupt):
        interrupts.note_and_raise(signal.SIGINT, None)
    with interrupts.stopping_after_batch():
        interrupts.raise_if_stopped()  # nothing asked to stop in this batch
        assert not interrupts.aborted()


def test_a_handler_of_someone_else_is_left_alone():
    def theirs(signum, frame):
        raise RuntimeError("their handler")

    previous = signal.signal(signal.SIGINT, theirs)
    try:
        with interrupts.stopping_after_batch():
            assert signal.getsignal(signal.SIGINT) is theirs
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_command_lines_handler_stays_installed_after_a_batch(default_handler):
    signal.signal(signal.SIGINT, interrupts.note_and_raise)
    with interrupts.stopping_after_batch():
        pass
    assert signal.getsignal(signal.SIGINT) is interrupts.note_and_raise
