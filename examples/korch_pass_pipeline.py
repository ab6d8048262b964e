"""KorchPass in a Relax pipeline, where FuseOps/FuseTIR would otherwise be."""

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

import korch_tvm

mod = from_onnx(onnx.load("models/bert_layer.onnx"), shape_dict={"hidden_states": [1, 64, 256]})
config = korch_tvm.KorchConfig(target="llvm", tuning_logs=korch_tvm.user_log_root(), trials=0)
target = korch_tvm.parse_target(config.target)  # this CPU: mcpu and core count filled in
pipeline = tvm.transform.Sequential([
    relax.transform.DecomposeOpsForInference(),
    relax.transform.FoldConstant(),
    korch_tvm.KorchPass(config),  # fission, candidates, costing, HiGHS, rewrite
])
with target:
    optimized = pipeline(mod)
executable = tvm.compile(optimized, target=target)

vm = relax.VirtualMachine(executable, tvm.cpu())
x = np.random.default_rng(0).standard_normal((1, 64, 256)).astype("float32")
print(vm["main"](tvm.runtime.tensor(x)).numpy().shape)
