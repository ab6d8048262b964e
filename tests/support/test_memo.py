"""The bounded memo costing sessions, line verdicts and the memory plan keep facts in."""

from korch_tvm.support.memo import KeyedMemo


def test_computes_once_per_key_and_starts_over_when_full():
    calls = []

    def compute(value):
        return lambda: calls.append(value) or value

    memo = KeyedMemo(kept=2)
    assert memo.get("a", compute(1)) == 1
    assert memo.get("a", compute(99)) == 1  # remembered: not computed again
    assert memo.get("b", compute(2)) == 2 and calls == [1, 2] and len(memo) == 2
    assert memo.get("c", compute(3)) == 3 and len(memo) == 1  # full: cleared, then kept
    assert memo.get("a", compute(4)) == 4 and calls == [1, 2, 3, 4]
