"""KorchConfig: every knob of a compile in one plain, immutable value."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from .errors import KorchError

# Activation layouts a compile can use (layout/activations.py); "auto" plans each and keeps the
# faster.
LAYOUT_CHOICES = ("auto", "NCHW", "NHWC")
MEMORY_LIMITS = ("stock", "none")
# Library kernels (costing/library_costs.py): "auto" offers a vendor BLAS call for every plain
# GEMM kernel where the extension is built; "off" costs and builds TVM kernels only.
LIBRARY_CHOICES = ("auto", "off")
# Substitutions (substitutions/offer.py): "on" offers every rule's alternatives to the solver
# beside the originals; "off" (the default: on the zoo they doubled compile time for a modelled
# gain under 1 %, bench/results/substitutions.md) plans the graph as lowered.
SUBSTITUTION_CHOICES = ("on", "off")
# The cache state CPU kernels are timed from (costing/cache_state.py): "auto" picks "l3" (private
# caches evicted, the L3 warm) for a model within a fifth of the L3 and "cold" (operands flushed
# to memory) for a larger one.
CACHE_STATES = ("auto", "cold", "l3")


@dataclass(frozen=True)
class KorchConfig:
    """What to compile for and how much effort to spend.

    `trials` is the MetaSchedule budget of the model's kernels in all: trials the tuning log
    already holds for them count, so a compile runs what is left of it (a second compile with
    the same budget runs none); 0 means no search (untuned kernels are measured once with
    their default schedule). `tuning_logs` is the root directory of the on-disk logs (one
    sub-directory per target); None keeps records in memory only, for this compile.

    `target` may be given as anything `target_spec.parse_target` reads (`"llvm"`, `"cuda"`, a
    JSON dict or its text, a `Target`); it is resolved once, here, so `config.target` is always a
    `tvm.target.Target` (for `llvm`: this CPU's `mcpu` and core count filled in).
    """

    target: object = "llvm"
    tuning_logs: str | None = None
    trials: int = 0
    # Instead of a total: this many trials per kernel that gets tuned (the budget is this times
    # the number of kernels, still split by latency share and headroom). MetaSchedule users
    # think per task.
    trials_per_kernel: int | None = None
    time_budget: float | None = None
    # The number of candidates per primitive grows with this size (candidates/enumerate.py), and
    # every candidate is a kernel to measure; TVM's larger fusion groups are candidates anyway.
    max_kernel_size: int = 6
    max_subproblem_nodes: int = 48
    prune_margin: float = 0.5
    # Lazy costing (costing/lazy.py): how much cheaper than its calibrated prediction a kernel no
    # plan has chosen yet may turn out. Larger measures more; prune_margin=inf measures all.
    lazy_margin: float = 0.2
    # ... and when the best plan of measured kernels models within this fraction of the
    # optimistic plan, the rounds stop: measuring more could gain no more than that (and in
    # logged cold compiles gained 0.3 % on average: bench/results/compile-time/settle-gap/).
    settle_gap: float = 0.03
    # Vectorisable exp/sigmoid/tanh/erf on both paths (lowering/fast_math.py); off = TVM's libm
    # calls.
    fast_math: bool = True
    # Activation layout (layout/activations.py): "NCHW", "NHWC", or "auto" = plan both, keep the
    # cheaper (a model with convolutions is then costed and tuned in both layouts).
    layout: str = "auto"
    solver_time_limit: float = 10.0
    # "stock": the plan may not need more activation storage than TVM's own fusion groups
    # (orchestration/memory_plan.py; pieces go back to their stock plan until it fits); "none":
    # latency alone.
    memory_limit: str = "stock"
    num_threads: int | None = None
    rpc_tracker: str | None = None
    rpc_key: str | None = None
    progress: bool | None = None
    seed: int = 0
    # Largest accepted verification error relative to each output's scale; None: by the
    # output's dtype (verify.tolerance_for).
    verify_tolerance: float | None = None
    # "auto": a plain GEMM kernel costs the cheaper of TVM's kernel and the BLAS call, and the
    # Korch plan's kernels whose cost is the BLAS's run as BLAS calls; "off": TVM kernels only.
    library: str = "auto"
    substitutions: str = "off"
    cache_state: str = "auto"

    def __post_init__(self):
        # A frozen dataclass: the resolved target replaces the spec once, before validation.
        from .target_spec import parse_target  # imports TVM: only when a config is made

        object.__setattr__(self, "target", parse_target(self.target))
        validate(self)

    def __eq__(self, other) -> bool:
        # TVM compares Targets by identity; two configs for the same target are equal.
        if not isinstance(other, KorchConfig):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def _fields(self) -> tuple:
        return tuple(str(value) if name == "target" else value
                     for name, value in vars(self).items())

    def with_changes(self, **changes) -> "KorchConfig":
        return replace(self, **changes)

    def overridden(self, **changes) -> "KorchConfig":
        """This config with the keyword arguments that were given: a None means "as configured",
        so `compile_model(m, config=KorchConfig(trials=8))` keeps the 8."""
        given = {name: value for name, value in changes.items() if value is not None}
        return replace(self, **given) if given else self

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


def validate(config: KorchConfig) -> None:
    """Every knob of a compile checked in one place; each failure is a one-line `KorchError`
    naming the command-line flag (the Python keyword has the same name without dashes)."""
    check_count("--trials", config.trials)
    if config.trials_per_kernel is not None:
        check_count("--trials-per-kernel", config.trials_per_kernel)
        if config.trials:
            raise KorchError("give --trials (a total) or --trials-per-kernel, not both")
    if config.time_budget is not None:
        # 0 is a budget that is spent: every cost is then predicted, nothing measured.
        check_number("--time-budget", config.time_budget, minimum=0.0, allow_minimum=True)
    if config.num_threads is not None:
        check_count("--threads", config.num_threads, minimum=1)
    if config.verify_tolerance is not None:
        check_number("--verify-tolerance", config.verify_tolerance, minimum=0.0, finite=True)
    check_choice("--layout", config.layout, LAYOUT_CHOICES)
    check_choice("--memory-limit", config.memory_limit, MEMORY_LIMITS)
    check_choice("--library", config.library, LIBRARY_CHOICES)
    check_choice("--substitutions", config.substitutions, SUBSTITUTION_CHOICES)
    check_choice("--cache-state", config.cache_state, CACHE_STATES)
    check_count("max_kernel_size", config.max_kernel_size, minimum=1)
    check_number("solver_time_limit", config.solver_time_limit, minimum=0.0)


def check_count(flag: str, value, minimum: int = 0) -> int:
    """An integer (not a bool, not a float) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise KorchError(f"{flag} must be a whole number, got {value!r}")
    if value < minimum:
        raise KorchError(f"{flag} must be >= {minimum}, got {value}")
    return int(value)


def check_number(flag: str, value, minimum: float, allow_minimum: bool = False,
                 finite: bool = False) -> float:
    """A real number above `minimum` (or equal to it when `allow_minimum`); NaN is refused,
    infinity too when `finite` (else it reads as "no bound")."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
        raise KorchError(f"{flag} must be a number, got {value!r}")
    if finite and math.isinf(value):
        raise KorchError(f"{flag} must be finite, got {value:g}")
    if value < minimum or (value == minimum and not allow_minimum):
        relation = ">=" if allow_minimum else ">"
        raise KorchError(f"{flag} must be {relation} {minimum:g}, got {value:g}")
    return float(value)


def check_choice(flag: str, value, choices) -> str:
    if value not in choices:
        raise KorchError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
    return value
