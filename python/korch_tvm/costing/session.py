"""One costing session per compile: the log, its seed, the runner, the builders and the deadline.

Both compile paths cost kernels through a session: the stock path (`profile`) and the Korch path
(`measure` in lazy rounds, then `tune` once), and so do the layout variants and the region-layout
planning of one compile. They share what is slow to make or must be one per compile: the tuning
log (read once) and the seed log it uses, one runner and one builder pool (their workers start
once), one time budget, and a scratch folder for the builders' artifacts, removed at the end.

What a session remembers (the analytic estimates, the seed it read) goes with it. One thing
outlives it, on purpose: `PROCESS_VERDICTS`, the policy's verdicts on the log lines already
judged (`log_lines.LineVerdicts`), which `open_tuning_log` hands to every compile's logs unless
given others.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import tvm

from ..backend.cuda import device_present, is_cuda
from ..backend.target import host_core_count, thread_count
from ..config import KorchConfig
from ..kernels.fused import structural_key
from ..layout.activations import layout_trial_share
from ..support.memo import KeyedMemo
from . import cache_state
from .call_overhead import call_overhead_seconds
from .cost_model import default_predictor
from .kernel_costs import KernelCost, Predictor, summarize
from .library_costs import LibraryCosts
from .log_lines import LineVerdicts
from .log_seeds import Seed, seed_log
from .measure import measure_kernels, profile_kernels, trial_allocation, tune_kernels
from .pooled_builder import PooledBuilder
from .runners import configured_runner, links_here, local_runner
from .tuning_log import TuningLog

@dataclass(frozen=True)
class Costing:
    """What `CostingSession.profile` found: a cost per kernel, and the report's counts."""

    costs: dict[str, KernelCost]  # name -> cost, for every kernel passed in
    summary: dict  # JSON-friendly counts for the report (`summarize`)
    tuning_log: TuningLog


# Candidate kernels a session keeps built: a large CNN's two layouts hold about 4,000.
BUILT_KERNELS_KEPT = 20_000
# Kept for the process: judging a 20 MB log's lines again costs about a second every compile.
PROCESS_VERDICTS = LineVerdicts()


def open_tuning_log(config: KorchConfig, scratch: str | None = None,
                    verdicts: LineVerdicts | None = None) -> tuple[TuningLog, Seed | None]:
    """The configured log, or a throw-away one under `scratch` (None: the temporary folder,
    removed when the log object goes) when the user keeps no logs, seeded when it is empty
    (costing/log_seeds.py), and the foreign seed it uses for predictions and starting points.
    Both judge their lines through `verdicts` (None: `PROCESS_VERDICTS`)."""
    root = config.tuning_logs or tempfile.mkdtemp(prefix="korch-tvm-log-", dir=scratch)
    verdicts = PROCESS_VERDICTS if verdicts is None else verdicts
    tuning_log = TuningLog(root, config.target, verdicts=verdicts,
                           cache_state=cache_state.configured(config))
    if not config.tuning_logs:  # the plan keeps the log past the session: it goes with the log
        weakref.finalize(tuning_log, shutil.rmtree, root, ignore_errors=True)
    return tuning_log, seed_log(tuning_log)


class CostingSession:
    """The costing of one compile (see the module docstring); made by `CostingSession.open`.

    `config` is the compile's configuration, `target` its resolved target, `tuning_log` and
    `seed` the log and the seed log it uses, `scratch` the folder builders export into. Its
    runner, builder pool and cost model are made on first use and serve every later call;
    `estimates` keeps the analytic estimates (by kernel key and target) its planning asks for
    (`cost_model.predict_kernels`), and `built_kernels` the candidate kernels built (by
    wiring signature: kernels/fused.py), for this compile only; `form_choices` the default
    schedule's form that won per variant anchor (backend/schedule_variants.py), so that a
    kernel measured in a later call has only that form measured beside the rule's.
    `threads`: the CPU threads its runner's worker runs kernels on (`config.num_threads`,
    passed to the worker, as `configure_threads` sizes this process's pool).
    """

    def __init__(self, config: KorchConfig, tuning_log: TuningLog, seed: Seed | None,
                 scratch: str) -> None:
        self.config = config
        self.target = config.target  # resolved to a Target where the config is made
        self.threads = thread_count(config.num_threads)
        self.cache_state = cache_state.configured(config)
        self.tuning_log, self.seed, self.scratch = tuning_log, seed, scratch
        budget = config.time_budget
        self.deadline = math.inf if budget is None else time.perf_counter() + max(0.0, budget)
        self._runner, self._runner_made, self._builder = None, False, None
        self._predictor: Predictor | None = None
        self.estimates: KeyedMemo[float] = KeyedMemo()
        self.built_kernels: KeyedMemo[tuple] = KeyedMemo(kept=BUILT_KERNELS_KEPT)
        self.form_choices: dict = {}
        self._library, self._library_made = None, False
        self._call_seconds: float | None = None

    @classmethod
    @contextmanager
    def open(cls, config: KorchConfig, tuning_log: TuningLog | None = None,
             seed: Seed | None = None, verdicts: LineVerdicts | None = None
             ) -> Iterator[CostingSession]:
        """A session for `config`, closed (builder pool stopped, scratch folder removed) at the
        end. `tuning_log` (with its `seed`): one opened already, which then outlives the
        session; None: the configured one (a throw-away log goes with the scratch folder),
        its lines judged through `verdicts` (None: `PROCESS_VERDICTS`)."""
        scratch = tempfile.mkdtemp(prefix="korch-tvm-scratch-")
        try:
            if tuning_log is None:
                tuning_log, seed = open_tuning_log(config, scratch, verdicts)
            session = cls(config, tuning_log, seed, scratch)
            try:
                yield session
            finally:
                session.close()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def close(self) -> None:
        """Stop the builder pool (the scratch folder goes when `open`'s block ends)."""
        if self._builder is not None:
            self._builder.close()
            self._builder = None

    def seconds_left(self, time_budget: float | None = None) -> float | None:
        """What is left of the compile's time budget, at most `time_budget` (a part of it
        given to one layout variant, say); None when neither limits it."""
        left = max(0.0, self.deadline - time.perf_counter())
        if time_budget is not None:
            left = min(left, max(0.0, time_budget))
        return None if math.isinf(left) else left

    def runner(self):
        """The compile's runner, made on first use: the configured RPC runner, else this
        machine's; None where nothing can run (costs are then predicted)."""
        if not self._runner_made:
            self._runner = configured_runner(self.config)
            if self._runner is None and device_present(self.target):
                self._runner = local_runner(self.target, cache_state=self.cache_state,
                                            threads=self.threads)
            self._runner_made = True
        return self._runner

    def builder(self) -> PooledBuilder:
        """The pool that builds default-schedule measurements, started on first use; it links
        the kernels for this machine's CPU runner, not for a remote or GPU one."""
        if self._builder is None:
            self._builder = PooledBuilder(self.target, host_core_count(), scratch=self.scratch,
                                          linked=links_here(self.runner(), self.target))
        return self._builder

    def library(self) -> LibraryCosts | None:
        """The library implementations' costs (costing/library_costs.py), made on first use;
        None with `config.library == "off"`, or where the BLAS extension is not built (the
        loader says so in one info line; every cost is then TVM's, as before)."""
        if not self._library_made:
            self._library_made = True
            if self.config.library == "auto":
                from ..library import load_blas_extension, load_cublas_extension

                cuda = is_cuda(self.target)
                if (load_cublas_extension if cuda else load_blas_extension)():
                    self._library = LibraryCosts(self.tuning_log.directory,
                                                 "cuda" if cuda else "cpu", self.cache_state)
        return self._library

    def with_library(self, kernels: Mapping[str, tvm.IRModule],
                     costs: Mapping[str, KernelCost], measure: bool = True
                     ) -> dict[str, KernelCost]:
        """`costs` with each kernel that has a library implementation at the cheaper of the
        two (unchanged without a library); library times are measured once, then read (with
        `measure` False, as when the time budget is spent, only read)."""
        library = self.library()
        return dict(costs) if library is None else library.cheaper(kernels, costs, measure)

    def library_costs(self, kernels: Mapping[str, tvm.IRModule]) -> dict[str, KernelCost]:
        """The library call's time, as its cost, of each kernel that has a library
        implementation, TVM's kernel left unmeasured (lazy costing measures it where a plan
        wants it below that time); times are measured once, then read (only read once the
        time budget is spent)."""
        library = self.library()
        if library is None:
            return {}
        left = self.seconds_left()
        unmeasured = {key: KernelCost(math.inf, "failed", 0, error="not measured")
                      for key in kernels}
        costs = library.cheaper(kernels, unmeasured, measure=left is None or left > 0)
        return {key: cost for key, cost in costs.items() if cost.implementation is not None}

    def call_seconds(self) -> float:
        """The VM's time per kernel call on this machine (costing/call_overhead.py), read from
        the log's directory or measured on first use; 0 where kernels run elsewhere than this
        machine's CPU (a GPU, a remote runner), which this process cannot time."""
        if self._call_seconds is None:
            self._call_seconds = (call_overhead_seconds(self.tuning_log.directory, self.threads,
                                                        self.target)
                                  if cache_state.on_this_cpu(self.config) else 0.0)
        return self._call_seconds

    def predict(self, kernel_mod: tvm.IRModule) -> float:
        """The log's cost model's seconds for `kernel_mod` (else the analytic estimate): loaded
        once per session, on the first prediction asked, and never retrained during it."""
        if self._predictor is None:
            self._predictor = default_predictor(self.tuning_log, self.target)
        return self._predictor(kernel_mod)

    def measure(self, kernels: Mapping[str, tvm.IRModule], predictor: Predictor | None = None,
                time_budget: float | None = None) -> dict[str, KernelCost]:
        """Every kernel's best known cost: from the log, one default measurement (and the
        seed's schedule), or a prediction by `predictor` (None: the session's `predict`);
        the cheaper of that and its library implementation's time where it has one.
        `time_budget` bounds this call within what is left of the session's."""
        runner, left = self.runner(), self.seconds_left(time_budget)
        costs = measure_kernels(kernels, self.target, self.tuning_log,
                                time_budget=left, runner=runner,
                                builder=None if runner is None else self.builder(),
                                predictor=predictor or self.predict,
                                progress=self.config.progress, seed_log=self.seed,
                                form_choices=self.form_choices)
        return self.with_library(kernels, costs, measure=left is None or left > 0)

    def tune(self, kernels: Mapping[str, tvm.IRModule], shares: Mapping[str, float],
             costs: Mapping[str, KernelCost], time_budget: float | None = None
             ) -> dict[str, KernelCost]:
        """Spend the compile's trial budget on `kernels` by their latency `shares`; returns
        `costs` with the tuned kernels' costs updated (a tuned kernel still the cheaper of
        it and its library implementation). `time_budget` as in `measure`."""
        tunable = sum(1 for share in shares.values() if math.isfinite(share) and share > 0)
        allocation = trial_allocation(kernels, shares, self.config.trial_budget(tunable),
                                      self.tuning_log)
        tuned = tune_kernels(kernels, allocation, self.target, self.tuning_log,
                             time_budget=self.seconds_left(time_budget), runner=self.runner(),
                             progress=self.config.progress, seed=self.config.seed,
                             scratch=self.scratch)
        left = self.seconds_left(time_budget)
        return {**costs, **self.with_library(kernels, tuned, measure=left is None or left > 0)}

    def profile(self, kernels: Mapping[str, tvm.IRModule],
                weights: Mapping[str, float] | None = None,
                time_budget: float | None = None) -> Costing:
        """The stock path: measure every kernel, then tune within this layout's part of the
        trial budget (`layout_trial_share`), `weights` saying how often each kernel runs."""
        config, runner = self.config, self.runner()
        costs = profile_kernels(kernels, self.target, self.tuning_log, trials=config.trials,
                                trials_per_kernel=config.trials_per_kernel,
                                budget_share=layout_trial_share(),
                                time_budget=self.seconds_left(time_budget), weights=weights,
                                runner=runner,
                                builder=None if runner is None else self.builder(),
                                predictor=self.predict, progress=config.progress, seed=config.seed, seed_log=self.seed,
                                scratch=self.scratch)
        distinct = {structural_key(kernels[name]): costs[name] for name in kernels}
        return Costing(costs, summarize(distinct.values()), self.tuning_log)
