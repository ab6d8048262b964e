"""Per attention model, the settled pass 3 (55256de) beside this subset (row reductions): Korch's
memory-bound kernels' time in the running model (the bench's kernel profile), Korch's median,
and Korch/stock, Korch/ORT, Korch/OpenVINO; geomeans of the ratios last."""
import glob
import json
import math
import os

OLD = "bench/results/zoo-intel-settled/zoo-0"
NEW = "bench/results/row-reductions/zoo-0"
ENGINES = ("stock", "onnxruntime", "openvino")


def ratio(d, engine):
    return d["ratios"][f"korch_vs_{engine}"]["ratio"]


print(f"{'model':20s} | memory ms   | Korch ms      | k/stock   | k/ort     | k/ov")
logs = {engine: [] for engine in ENGINES}
for path in sorted(glob.glob(NEW + "/*.json")):
    name = os.path.basename(path)[:-5]
    new, old = json.load(open(path)), json.load(open(f"{OLD}/{name}.json"))
    memory = [d["kind_profile_ms"]["korch"]["memory"] for d in (old, new)]
    median = [d["latency_ms"]["korch"]["median"] for d in (old, new)]
    cells = [f"{memory[0]:.2f} {memory[1]:.2f}", f"{median[0]:.2f} {median[1]:.2f}"]
    for engine in ENGINES:
        cells.append(f"{ratio(old, engine):.2f} {ratio(new, engine):.2f}")
        logs[engine].append((math.log(ratio(old, engine)), math.log(ratio(new, engine))))
    print(f"{name:20s} | " + " | ".join(f"{c:9s}" for c in cells))
for engine, pairs in logs.items():
    old, new = (math.exp(sum(p[i] for p in pairs) / len(pairs)) for i in (0, 1))
    print(f"geomean Korch/{engine}: {old:.3f} -> {new:.3f}")
