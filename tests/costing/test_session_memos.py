"""What a costing session remembers belongs to it: a second session (a second compile) starts
afresh, and nothing a session remembers lives in a module."""

import pytest

from korch_tvm.config import KorchConfig
from korch_tvm.costing import cost_model
from korch_tvm.costing.session import CostingSession

from test_measure import TARGET, legalized_kernels


@pytest.fixture
def counted_estimates(monkeypatch):
    """The kernels `analytic_estimate` was asked about, in order."""
    asked = []
    real = cost_model.analytic_estimate

    def counting(module, target="llvm"):
        asked.append(module)
        return real(module, target)

    monkeypatch.setattr(cost_model, "analytic_estimate", counting)
    return asked


def test_each_session_keeps_its_own_analytic_estimates(tmp_path, counted_estimates):
    kernels = legalized_kernels(16)
    config = KorchConfig(tuning_logs=str(tmp_path), target=TARGET)
    with CostingSession.open(config) as first:
        once = cost_model.predict_kernels(first.tuning_log, TARGET, kernels, first.estimates)
        again = cost_model.predict_kernels(first.tuning_log, TARGET, kernels, first.estimates)
        assert again == once and len(counted_estimates) == len(kernels)  # asked once a session
    with CostingSession.open(config) as second:
        assert len(second.estimates) == 0
        assert cost_model.predict_kernels(second.tuning_log, TARGET, kernels,
                                          second.estimates) == once
    assert len(counted_estimates) == 2 * len(kernels)  # the second session asked again
    cost_model.predict_kernels(second.tuning_log, TARGET, kernels)  # no memo: this call only
    assert len(counted_estimates) == 3 * len(kernels)


def test_sessions_judge_log_lines_through_the_process_verdicts_unless_given_others(tmp_path):
    """The one thing kept between compiles, on purpose and in sight: the line verdicts."""
    from korch_tvm.costing.log_lines import LineVerdicts
    from korch_tvm.costing.session import PROCESS_VERDICTS

    config = KorchConfig(tuning_logs=str(tmp_path), target=TARGET)
    with CostingSession.open(config) as first, CostingSession.open(config) as second:
        assert first.tuning_log is not second.tuning_log
        assert first.tuning_log.verdicts is second.tuning_log.verdicts is PROCESS_VERDICTS
    own = LineVerdicts()
    with CostingSession.open(config, verdicts=own) as session:
        assert session.tuning_log.verdicts is own
