"""korch_tvm: optimal kernel orchestration (Korch, ASPLOS'24) as a plugin for Apache TVM Relax.

Public API:
* `compile_model(model, target="llvm", *, korch=True, tuning_logs=None, trials=0, ...)`
  -> `(executable, report)`
* `KorchPass(config)`: a `tvm.transform.Pass` to use in place of FuseOps/FuseTIR
* `korch_pipeline(config, session)`, `stock_pipeline(config, session)`: the two compile paths
  as `tvm.transform.Sequential` lists (print one to read it); more passes in `pipeline.passes`
* `CostingSession.open(config)`: a context manager; the costing of one compile (tuning log,
  runner, builders, cost model, time budget), which the pipelines above cost kernels through
* `KorchConfig`: every knob of a compile (its `target` resolved to a `tvm.target.Target` when made)
* `PrimitiveLowering()`: the operator-fission pass on its own
* `parse_target(spec)`: `llvm` (this CPU), `cuda`, or a JSON target dict -> `tvm.target.Target`
* `user_log_root()`: where the CLI keeps tuning logs (the user's cache), for `tuning_logs=`
"""

from .errors import KorchError

# Submodules import TVM (about a second); load them on first use so that `korch-tvm --help`
# and error paths stay fast.
_LAZY = {
    "compile_model": ("pipeline.compile", "compile_model"),
    "KorchPass": ("pipeline.passes", "KorchPass"),
    "korch_pipeline": ("pipeline.passes", "korch_pipeline"),
    "stock_pipeline": ("pipeline.passes", "stock_pipeline"),
    "KorchConfig": ("config", "KorchConfig"),
    "CostingSession": ("costing.session", "CostingSession"),
    "PrimitiveLowering": ("lowering.fission", "PrimitiveLowering"),
    "parse_target": ("target_spec", "parse_target"),
    "user_log_root": ("costing.log_seeds", "user_log_root"),
}

__all__ = ["KorchError", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'korch_tvm' has no attribute {name!r}")
    import importlib

    module_name, attribute = _LAZY[name]
    value = getattr(importlib.import_module(f".{module_name}", __name__), attribute)
    globals()[name] = value
    return value
