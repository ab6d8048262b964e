"""A small builder of hand-written primitive programs for the substitution-rule tests."""

import numpy as np
from tvm import relax


def build_main(inputs: dict, steps: list, outputs: list):
    """`main` with float32 params `inputs` ({name: shape}), one dataflow binding per step
    ((name, values -> expr), `values` the dict of everything bound so far) and `outputs`
    returned as a tuple. Returns (main, values by name)."""
    params = [relax.Var(name, relax.TensorType(list(shape), "float32"))
              for name, shape in inputs.items()]
    values = {param.name: param for param in params}
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            for name, make in steps:
                emit = bb.emit_output if name in outputs else bb.emit
                values[name] = emit(make(values), name)
        bb.emit_func_output(relax.Tuple([values[name] for name in outputs]))
    return bb.get()["main"], values


def constant(shape, seed=0, fill=None):
    """A float32 Relax constant: random in [0.5, 1.5), or `fill` everywhere."""
    if fill is not None:
        return relax.const(np.full(shape, fill, "float32"), "float32")
    rng = np.random.default_rng(seed)
    return relax.const(rng.uniform(0.5, 1.5, size=shape).astype("float32"), "float32")


def names(variables):
    return tuple(var.name for var in variables)

