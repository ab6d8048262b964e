"""The compile's IRModule -> IRModule steps as named passes, and the two pipelines made of them.

Each pass is a thin, named wrapper over a stage function that already exists (the stage
modules stay plain functions, testable on their own): its `__init__` takes what the step needs
and its `transform_module` hands the module to that function. `stock_pipeline(config,
session)` and `korch_pipeline(config, session)` are the `tvm.transform.Sequential` lists
`compile_model` runs, all of their passes costed through the compile's one `CostingSession`;
print one to read the path, or build your own list from the passes here.

The first pass of each pipeline, `StockPass` or `PlanKorch`, searches over activation layouts
and spends one trial budget across them, so its per-layout steps (layout conversion, fission
or stock fusion, costing) run inside it, as calls of the same stage functions the stage
passes below wrap. `KorchPass` is the whole Korch pipeline as one pass, for a user's own
Sequential.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import tvm

from ..backend.rewrite import apply_tuning_log, share_identical_kernels, use_library_kernels
from ..config import KorchConfig
from ..costing.cache_state import for_model
from ..costing.session import CostingSession, open_tuning_log
from ..kernels.weight_packing import mark_layout_free_weights
from ..layout.activations import convert_layout
from ..lowering.constant_folding import fold_constants
from ..lowering.fission import lower_to_primitives
from . import korch
from .korch import korch_report, plan_korch
from .layout_plan import KorchPlan
from .stock import StockChoice, choose_stock_layout, stock_fusion

__all__ = ["ApplyTuningLog", "ConvertLayout", "FoldConstants", "KorchPass", "LowerToPrimitives",
           "MarkLayoutFreeWeights", "PlanKorch", "ShareIdenticalKernels", "StockFusion",
           "StockPass", "UseLibraryKernels", "korch_pipeline", "run_pipeline", "stock_pipeline"]


# ------------------------------------------------------------------------- stage passes
@tvm.transform.module_pass(opt_level=0, name="korch_tvm.ConvertLayout")
class ConvertLayout:
    """Convolutions (and what follows them) in `layout` ("NCHW" or "NHWC"); constants folded."""

    def __init__(self, layout: str):
        self.layout = layout

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return convert_layout(mod, self.layout)


class _StageFunction:
    """A pass that takes no settings: the module goes to the class's `stage` function."""

    stage = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return type(self).stage(mod)


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.FoldConstants")
class FoldConstants(_StageFunction):
    """Relax's FoldConstant, with constants' reshapes and transposes done in numpy first."""

    stage = staticmethod(fold_constants)


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.LowerToPrimitives")
class LowerToPrimitives(_StageFunction):
    """Operator fission (composite operators into primitive ones) and its clean-up."""

    stage = staticmethod(lower_to_primitives)


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.StockFusion")
class StockFusion:
    """TVM's own fusion (LegalizeOps with fast math, FuseOps, FuseTIR) for `target`."""

    def __init__(self, target: tvm.target.Target, fast_math: bool = True):
        self.target = target
        self.fast_math = fast_math

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return stock_fusion(mod, self.target, fast_math=self.fast_math)


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.MarkLayoutFreeWeights")
class MarkLayoutFreeWeights(_StageFunction):
    """Each kernel's constant weights marked layout free, so a schedule may repack them."""

    stage = staticmethod(mark_layout_free_weights)


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.ApplyTuningLog")
class ApplyTuningLog:
    """Each kernel's best schedule from `database` (the CPU default schedule where it has
    none), then, with `pack_weights`, the weights repacked once at compile time."""

    def __init__(self, database, target: tvm.target.Target, pack_weights: bool = True):
        self.database = database
        self.target = target
        self.pack_weights = pack_weights

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return apply_tuning_log(mod, self.database, self.target, pack_weights=self.pack_weights)


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.ShareIdenticalKernels")
class ShareIdenticalKernels(_StageFunction):
    """One PrimFunc per distinct kernel: calls to equal copies go to the first."""

    stage = staticmethod(share_identical_kernels)


# -------------------------------------------------------------------------- path passes
@contextmanager
def _keeping_raised(path_pass):
    """Remember what a pass raised: TVM's FFI carries only a few exception types across a
    pass (an OSError, a KeyboardInterrupt or a KorchError comes out as a RuntimeError), and
    `run_pipeline` re-raises the very exception, whose type says whose fault it is."""
    path_pass.raised = None
    try:
        yield
    except BaseException as err:
        path_pass.raised = err
        raise


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.PlanKorch")
class PlanKorch:
    """Fission, candidates, costing and orchestration (`plan_korch`) through `session` (None:
    one of its own); returns the plan's partition module: `main` calling one unscheduled
    kernel per chosen group. The plan is kept in `last_plan`, and the `time.perf_counter()`
    at which planning ended in `planned_at` (the rewrite's stage time starts there)."""

    def __init__(self, config: KorchConfig, session: CostingSession | None = None):
        self.config, self.session = config, session
        self.last_plan: KorchPlan | None = None
        self.planned_at: float | None = None
        self.raised: BaseException | None = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        with _keeping_raised(self):
            self.last_plan = plan_korch(mod, self.config, session=self.session)
            self.planned_at = time.perf_counter()
            return korch.partition_module(self.last_plan)


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.UseLibraryKernels")
class UseLibraryKernels:
    """The kernels of `planning`'s last plan whose cost is a library call's
    (costing/library_costs.py) become that call; the rest stay for `ApplyTuningLog`, which
    must come after: a library call is matched on the unscheduled kernel."""

    def __init__(self, planning: PlanKorch):
        self.planning = planning

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        plan = self.planning.last_plan
        return use_library_kernels(mod, korch.library_kernels(plan), plan.target)


@tvm.transform.module_pass(opt_level=0, name="KorchPass")
class KorchPass:
    """Use in place of FuseOps/FuseTIR: rebuild `main` as the optimal set of tuned kernels
    (the Korch pipeline: `PlanKorch`, `ApplyTuningLog`, `ShareIdenticalKernels`), costed
    through `session` (None: a session of its own, whose log outlives it in `last_plan`).

    On the CPU the result goes straight to `tvm.compile` (its pipeline does not re-fuse); for
    CUDA build it with `korch_tvm.backend.cuda.build`, since TVM's CUDA pipeline runs FuseOps
    again. The plan and report of the last run are kept in `last_plan` and `last_report`.
    """

    def __init__(self, config: KorchConfig | None = None,
                 session: CostingSession | None = None):
        self.config, self.session = config or KorchConfig(), session
        self.last_plan: KorchPlan | None = None
        self.last_report: dict | None = None
        self.raised: BaseException | None = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        config = for_model(self.config, mod)
        with _keeping_raised(self), _given_or_own(config, self.session) as session:
            planning = PlanKorch(config, session)
            optimized = run_pipeline(korch_pipeline(config, session, planning), mod, planning)
            self.last_plan = planning.last_plan
            self.last_report = korch_report(self.last_plan, optimized, planning.planned_at)
        return optimized


def _given_or_own(config: KorchConfig, session: CostingSession | None):
    """`session` as a context (left open), or a new one on `config`'s tuning log, opened
    outside the session so that the plan may keep using it."""
    if session is not None:
        return nullcontext(session)
    return CostingSession.open(config, *open_tuning_log(config))


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.StockPass")
class StockPass:
    """TVM's stock fusion of the cheapest layout (`choose_stock_layout`): per layout, stock
    fusion and the kernels costed and tuned through `session` (None: one of its own); returns
    the fused module of the layout kept, unscheduled (`ApplyTuningLog` schedules it). What it
    chose is kept in `last_choice` (`stock.StockChoice`: fused module, kernels, report)."""

    def __init__(self, config: KorchConfig | None = None,
                 session: CostingSession | None = None):
        self.config, self.session = config or KorchConfig(), session
        self.last_choice: StockChoice | None = None
        self.raised: BaseException | None = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        with _keeping_raised(self):
            self.last_choice = choose_stock_layout(mod, self.config, self.session)
        return self.last_choice.fused


# ----------------------------------------------------------------------------- pipelines
def stock_pipeline(config: KorchConfig, session: CostingSession,
                   stock_pass: StockPass | None = None) -> tvm.transform.Sequential:
    """The baseline compile of `config`, costed through `session`: TVM's fusion in the
    cheapest layout, then the schedules of the session's tuning log. Give `stock_pass` (made
    with the same session) to read its `last_choice` after the run."""
    return tvm.transform.Sequential([
        stock_pass or StockPass(config, session),
        ApplyTuningLog(session.tuning_log.database, session.target),
    ], name="korch_tvm.stock_pipeline")


def korch_pipeline(config: KorchConfig, session: CostingSession,
                   planning: PlanKorch | None = None) -> tvm.transform.Sequential:
    """The Korch compile of `config`, costed through `session`: the plan's kernels, those a
    library runs cheaper as library calls, the others' schedules from the session's tuning
    log, equal kernels shared. Give `planning` (a `PlanKorch` made with the same session) to
    read its `last_plan` after the run."""
    planning = planning or PlanKorch(config, session)
    return tvm.transform.Sequential([
        planning,
        UseLibraryKernels(planning),
        ApplyTuningLog(session.tuning_log.database, session.target),
        ShareIdenticalKernels(),
    ], name="korch_tvm.korch_pipeline")


def run_pipeline(pipeline: tvm.transform.Pass, mod: tvm.IRModule, *path_passes
                 ) -> tvm.IRModule:
    """`pipeline(mod)`; when one of `path_passes` (in it) failed, its very exception is raised
    (see `_keeping_raised`), not the RuntimeError TVM made of it."""
    try:
        return pipeline(mod)
    except BaseException:
        for path_pass in path_passes:
            if path_pass.raised is not None:
                raise path_pass.raised from None
        raise
