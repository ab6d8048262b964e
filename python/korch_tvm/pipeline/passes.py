"""The compile's IRModule -> IRModule steps as named passes, and the two pipelines made of them.

Each pass is a thin, named wrapper over a stage function that already exists (the stage
modules stay plain functions, testable on their own): its `__init__` takes what the step needs
and its `transform_module` hands the module to that function. `stock_pipeline(config)` and
`korch_pipeline(config)` are the `tvm.transform.Sequential` lists `compile_model` runs; print
one to read the path, or build your own list from the passes here.

The two path passes, `StockPass` and `KorchPass`, each search over activation layouts and
spend one trial budget across them, so their per-layout steps (layout conversion, fission or
stock fusion, costing, the tuning log applied) run inside them, as calls of the same stage
functions the stage passes below wrap: those are for a pipeline of one's own.
"""

from __future__ import annotations

from contextlib import contextmanager

import tvm

from ..backend.rewrite import apply_tuning_log, share_identical_kernels
from ..config import KorchConfig
from ..kernels.weight_packing import mark_layout_free_weights
from ..layout.activations import convert_layout
from ..lowering.constant_folding import fold_constants
from ..lowering.fission import lower_to_primitives
from .korch import plan_korch, rewrite_plan
from .layout_plan import KorchPlan
from .stock import run_stock, stock_fusion

__all__ = ["ApplyTuningLog", "ConvertLayout", "FoldConstants", "KorchPass", "LowerToPrimitives",
           "MarkLayoutFreeWeights", "ShareIdenticalKernels", "StockFusion", "StockPass",
           "korch_pipeline", "run_pipeline", "stock_pipeline"]


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


@tvm.transform.module_pass(opt_level=0, name="KorchPass")
class KorchPass:
    """Use in place of FuseOps/FuseTIR: rebuild `main` as the optimal set of tuned kernels
    (`plan_korch`, then `rewrite_plan`: fission, candidates, costing, orchestration, rewrite).

    On the CPU the result goes straight to `tvm.compile` (its pipeline does not re-fuse); for
    CUDA build it with `korch_tvm.backend.cuda.build`, since TVM's CUDA pipeline runs FuseOps
    again. The plan and report of the last run are kept in `last_plan` and `last_report`.
    """

    def __init__(self, config: KorchConfig | None = None):
        self.config = config or KorchConfig()
        self.last_plan: KorchPlan | None = None
        self.last_report: dict | None = None
        self.raised: BaseException | None = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        with _keeping_raised(self):
            self.last_plan = plan_korch(mod, self.config)
            optimized, self.last_report = rewrite_plan(self.last_plan)
        return optimized


@tvm.transform.module_pass(opt_level=0, name="korch_tvm.StockPass")
class StockPass:
    """TVM's stock path (`run_stock`): per layout, stock fusion, the kernels costed and tuned
    through the tuning log, the log applied; the cheapest layout kept. The report of the last
    run is kept in `last_report`."""

    def __init__(self, config: KorchConfig | None = None):
        self.config = config or KorchConfig()
        self.last_report: dict | None = None
        self.raised: BaseException | None = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        with _keeping_raised(self):
            optimized, self.last_report = run_stock(mod, self.config)
        return optimized


# ----------------------------------------------------------------------------- pipelines
def stock_pipeline(config: KorchConfig, stock_pass: StockPass | None = None
                   ) -> tvm.transform.Sequential:
    """The baseline compile of `config`: TVM's fusion and tuning. Give `stock_pass` to read
    its `last_report` after the run."""
    return tvm.transform.Sequential([stock_pass or StockPass(config)],
                                    name="korch_tvm.stock_pipeline")


def korch_pipeline(config: KorchConfig, korch_pass: KorchPass | None = None
                   ) -> tvm.transform.Sequential:
    """The Korch compile of `config`: KorchPass in the place of FuseOps/FuseTIR. Give
    `korch_pass` to read its `last_plan` and `last_report` after the run."""
    return tvm.transform.Sequential([korch_pass or KorchPass(config)],
                                    name="korch_tvm.korch_pipeline")


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
