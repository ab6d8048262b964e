import time, pickle, sys
import onnx
from korch_tvm.config import KorchConfig
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.layout.activations import layout_variants
from korch_tvm.pipeline.layout_plan import prepare_layout
from korch_tvm.library.implementations import library_spec
out = {}
for name in sys.argv[2:]:
    mod = import_onnx(onnx.load(f"/work/main/bench/zoo/models/{name}.onnx"), None)
    for layout, variant in layout_variants(mod, "auto").items():
        found = prepare_layout(variant, KorchConfig(trials=0)).found
        t = time.perf_counter()
        specs = {k: library_spec(m) for k, m in found.kernels.modules.items()}
        print(name, layout, len(specs), "kernels", round(time.perf_counter() - t, 2), "s", sum(s is not None for s in specs.values()), "matched")
        out.update({k: repr(s) for k, s in specs.items()})
pickle.dump(out, open(sys.argv[1], "wb"))
