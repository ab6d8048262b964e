"""The compile summary's counts say what they count: a kernel with a recorded default schedule
is scheduled from the log but not tuned; only a search's schedule is."""

import math

import pytest

from conftest import make_tiny_onnx
from korch_tvm import compile_model
from korch_tvm.backend.schedule_counts import improved_by_search, split_count
from korch_tvm.report.text import summary_lines


@pytest.mark.parametrize("korch", [True, False], ids=["korch", "stock"])
def test_zero_trials_tunes_nothing_and_the_summary_says_so(tmp_path, korch):
    _, report = compile_model(make_tiny_onnx(), korch=korch, tuning_logs=str(tmp_path),
                              trials=0, verify=False)
    tuning = report["tuning"]
    assert tuning["tuned"] == 0 and tuning["trials_run"] == 0 and tuning["measured"] > 0
    from_log, built = split_count(report["kernels_scheduled_from_log"])
    searched, planned = split_count(report["kernels_with_searched_schedule"])
    # every kernel runs the default schedule its measurement recorded; none was searched
    assert 0 < from_log <= built and searched == 0 and planned > 0
    assert "kernels_with_tuned_schedule" not in report
    text = "\n".join(summary_lines(report))
    assert f"searched now 0, default schedule measured now {tuning['measured']}," in text
    assert "trials run 0 of budget 0" in text
    assert (f"built kernels: {from_log}/{built} scheduled from log records; 0/{planned} planned "
            "kernels with a schedule from a tuning search") in text
    assert " tuned " not in text


class _Log:
    """A tuning log stand-in: trials asked of MetaSchedule, best and default-schedule times."""

    def __init__(self, attempts, best, default):
        self.answers = attempts, best, default

    def tuning_attempts(self, _):
        return self.answers[0]

    def best_seconds(self, _):
        return self.answers[1]

    def default_seconds(self, _):
        return self.answers[2]


def test_only_a_search_that_beat_the_default_schedule_counts_as_searched():
    assert improved_by_search(_Log(64, 1e-4, 2e-4), None)
    assert not improved_by_search(_Log(0, 1e-4, 2e-4), None)      # faster, but no search ran
    assert not improved_by_search(_Log(64, 2e-4, 2e-4), None)      # the default stayed best
    assert not improved_by_search(_Log(64, math.inf, math.inf), None)  # every record failed
    assert not improved_by_search(_Log(8, None, None), None)
    assert split_count("3/16") == (3, 16) and split_count(None) is None


def test_the_summary_names_convolutions_given_fewer_taps_only_when_there_are_some():
    lowering = {"primitives_by_kind": {"linear": 9},
                "convolutions": {"dead_taps_cut": 2, "summed_over_live_taps": 1}}
    lines = summary_lines({"lowering": lowering})
    assert ("  convolutions with fewer taps: 2 with dead taps cut, 1 summed over their live taps"
            in lines)
    lowering["convolutions"] = {"dead_taps_cut": 0, "summed_over_live_taps": 0}
    assert not any("fewer taps" in line for line in summary_lines({"lowering": lowering}))
