"""match_check.py OUT.pkl MODEL...: the library spec of every candidate kernel of each zoo model
in both layouts, pickled by kernel key (run once per revision, then compare the two files), with
the seconds the matching took per layout."""
import pickle
import sys
import time

import onnx

from korch_tvm.config import KorchConfig
from korch_tvm.frontend.onnx_import import import_onnx
from korch_tvm.layout.activations import layout_variants
from korch_tvm.library.implementations import library_spec
from korch_tvm.pipeline.layout_plan import prepare_layout

specs = {}
for name in sys.argv[2:]:
    mod = import_onnx(onnx.load(f"bench/zoo/models/{name}.onnx"), None)
    for layout, variant in layout_variants(mod, "auto").items():
        found = prepare_layout(variant, KorchConfig(trials=0)).found
        started = time.perf_counter()
        matched = {key: library_spec(module) for key, module in found.kernels.modules.items()}
        print(name, layout, len(matched), "kernels", round(time.perf_counter() - started, 2), "s",
              sum(spec is not None for spec in matched.values()), "matched")
        specs.update({key: repr(spec) for key, spec in matched.items()})
with open(sys.argv[1], "wb") as handle:
    pickle.dump(specs, handle)
