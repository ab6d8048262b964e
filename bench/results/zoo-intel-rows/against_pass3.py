"""Per model, the settled pass 3 (55256de) beside this pass (row reductions, 1e3fd6e): Korch's
memory-bound kernels in the running model, modelled/measured, Korch/stock, Korch/ORT,
Korch/OpenVINO, and each engine's own median (the machine's drift shows there)."""
import glob
import json
import os

OLD = "bench/results/zoo-intel-settled/zoo-0"
NEW = "bench/results/zoo-intel-rows/zoo-0"


def modelled(d):
    return d["korch_plan"]["modelled_ms"] / d["latency_ms"]["korch"]["median"]


def ratio(d, engine):
    return d["ratios"][f"korch_vs_{engine}"]["ratio"]


print(f"{'model':24s} | memory ms   | mod/meas  | k/stock   | k/ort     | k/ov      "
      "| korch ms      | ort ms        | ov ms")
for path in sorted(glob.glob(NEW + "/*.json")):
    name = os.path.basename(path)[:-5]
    new, old = json.load(open(path)), json.load(open(f"{OLD}/{name}.json"))
    cells = [" ".join(f"{d['kind_profile_ms']['korch']['memory']:.2f}" for d in (old, new)),
             f"{modelled(old):.2f} {modelled(new):.2f}"]
    cells += [f"{ratio(old, e):.2f} {ratio(new, e):.2f}"
              for e in ("stock", "onnxruntime", "openvino")]
    cells += [" ".join(f"{d['latency_ms'][e]['median']:.2f}" for d in (old, new))
              for e in ("korch", "onnxruntime", "openvino")]
    print(f"{name:24s} | " + " | ".join(f"{c:9s}" for c in cells))
