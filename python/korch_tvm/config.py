"""KorchConfig: every knob of a compile in one plain, immutable value."""

from __future__ import annotations

from dataclasses import dataclass, replace

# Activation layouts a compile can use (data_layout.py); "auto" plans each and keeps the faster.
LAYOUT_CHOICES = ("auto", "NCHW", "NHWC")
MEMORY_LIMITS = ("stock", "none")


@dataclass(frozen=True)
class KorchConfig:
    """What to compile for and how much effort to spend.

    `trials` is the total MetaSchedule budget of one compile, shared by every kernel that the
    tuning log does not already hold; 0 means no search (untuned kernels are measured once with
    their default schedule). `tuning_logs` is the root directory of the on-disk logs (one
    sub-directory per target); None keeps records in memory only, for this compile.
    """

    target: object = "llvm"
    tuning_logs: str | None = None
    trials: int = 0
    # Instead of a total: this many trials per kernel that gets tuned (the budget is this times
    # the number of kernels, still split by latency share and headroom). MetaSchedule users
    # think per task.
    trials_per_kernel: int | None = None
    time_budget: float | None = None
    # Candidates per primitive grow from 7.0 (6) to 10.1 (8) on SegFormer-b0 (candidates.py), and
    # every candidate is a kernel to measure; TVM's larger fusion groups are candidates anyway.
    max_kernel_size: int = 6
    max_subproblem_nodes: int = 48
    prune_margin: float = 0.5
    # Lazy costing (lazy_costing.py): how much cheaper than its calibrated prediction a kernel no
    # plan has chosen yet may turn out. Larger measures more; prune_margin=inf measures all.
    lazy_margin: float = 0.2
    # Vectorisable exp/sigmoid/tanh/erf on both paths (fast_math.py); off = TVM's libm calls.
    fast_math: bool = True
    # Activation layout (data_layout.py): "NCHW", "NHWC", or "auto" = plan both, keep the
    # cheaper (a model with convolutions is then costed and tuned in both layouts).
    layout: str = "auto"
    solver_time_limit: float = 10.0
    # "stock": the plan may not need more activation storage than TVM's own fusion groups
    # (memory_plan.py; pieces go back to their stock plan until it fits); "none": latency alone.
    memory_limit: str = "stock"
    num_threads: int | None = None
    rpc_tracker: str | None = None
    rpc_key: str | None = None
    progress: bool | None = None
    seed: int = 0

    def with_changes(self, **changes) -> "KorchConfig":
        return replace(self, **changes)

    @property
    def tunes(self) -> bool:
        return tunes(self.trials, self.trials_per_kernel)

    def trial_budget(self, kernels_to_tune: int) -> int:
        return trial_budget(self.trials, self.trials_per_kernel, kernels_to_tune)


def tunes(trials: int, trials_per_kernel: int | None) -> bool:
    """Whether a budget given either way asks for any search."""
    return trials > 0 or bool(trials_per_kernel)


def trial_budget(trials: int, trials_per_kernel: int | None, kernels_to_tune: int) -> int:
    """Total trials: `trials`, or `trials_per_kernel` for each of `kernels_to_tune` kernels."""
    if trials_per_kernel is None:
        return trials
    return trials_per_kernel * kernels_to_tune
