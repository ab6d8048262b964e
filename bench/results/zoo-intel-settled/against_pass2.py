"""Per model, the cache-state pass 2 (9698473) beside this pass: modelled/measured, Korch/stock,
Korch/ORT, Korch/OpenVINO, Korch's kernels and its cold compile seconds."""
import glob
import json
import os

OLD = "bench/results/zoo-intel-cache-state/pass2/zoo-0"
NEW = "bench/results/zoo-intel-settled/zoo-0"


def modelled(d):
    return d["korch_plan"]["modelled_ms"] / d["latency_ms"]["korch"]["median"]


def ratio(d, engine):
    return d["ratios"][f"korch_vs_{engine}"]["ratio"]


print(f"{'model':24s} {'state':5s} | mod/meas    | k/stock     | k/ort       | k/ov        "
      "| kernels | compile s")
for path in sorted(glob.glob(NEW + "/*.json")):
    name = os.path.basename(path)[:-5]
    new, old = json.load(open(path)), json.load(open(f"{OLD}/{name}.json"))
    state = new["compile"]["korch"]["cold"]["cache_state"]["state"]
    cells = [f"{modelled(old):.2f} {modelled(new):.2f}"] + [
        f"{ratio(old, e):.2f} {ratio(new, e):.2f}" for e in ("stock", "onnxruntime", "openvino")]
    kernels = f"{old['korch_plan']['kernels_chosen']} {new['korch_plan']['kernels_chosen']}"
    seconds = " ".join(f"{d['compile']['korch']['cold']['compile_seconds']:.0f}"
                       for d in (old, new))
    print(f"{name:24s} {state:5s} | " + " | ".join(f"{c:11s}" for c in cells)
          + f" | {kernels:7s} | {seconds}")
