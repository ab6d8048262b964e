"""Per attention model, the row-reductions subset (bc8e715) beside this one (the same code with
index-only prologues allowed): Korch/stock measured (with its p10-p90) and modelled, Korch/
OpenVINO, the candidates and the cold Korch compile seconds; geomeans of the measured ratios."""
import glob
import json
import math
import os

OLD = "bench/results/row-reductions/zoo-0"
NEW = "bench/results/index-prologue/zoo-0"


def ratio(d, engine):
    return d["ratios"][f"korch_vs_{engine}"]["ratio"]


def modelled(d):
    return d["korch_plan"]["stock_modelled_ms"] / d["korch_plan"]["modelled_ms"]


print(f"{'model':20s} | k/stock   | (p10-p90 new) | modelled k/stock | k/ov      | candidates"
      "  | compile s")
logs = []
for path in sorted(glob.glob(NEW + "/*.json")):
    name = os.path.basename(path)[:-5]
    if name.endswith(".failed"):
        failed = json.load(open(path))
        print(f"{name[:-7]:20s} | failed: {failed['reason'][:110]}")
        continue
    if os.path.exists(f"{NEW}/{name}.failed.json"):
        continue  # timed, then failed its verification: its row is the failure above
    new, old = json.load(open(path)), json.load(open(f"{OLD}/{name}.json"))
    spread = new["ratios"]["korch_vs_stock"]
    cells = [f"{ratio(old, 'stock'):.2f} {ratio(new, 'stock'):.2f}",
             f"{spread['p10']:.2f}-{spread['p90']:.2f}",
             f"{modelled(old):.3f} {modelled(new):.3f}",
             f"{ratio(old, 'openvino'):.2f} {ratio(new, 'openvino'):.2f}",
             f"{old['korch_plan']['candidates']} {new['korch_plan']['candidates']}",
             " ".join(f"{d['compile']['korch']['cold']['compile_seconds']:.0f}" for d in (old, new))]
    print(f"{name:20s} | " + " | ".join(cells))
    logs.append((math.log(ratio(old, "stock")), math.log(ratio(new, "stock"))))
old, new = (math.exp(sum(p[i] for p in logs) / len(logs)) for i in (0, 1))
print(f"geomean Korch/stock over the {len(logs)} verified: {old:.3f} -> {new:.3f}")
