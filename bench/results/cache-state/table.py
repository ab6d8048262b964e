"""Per model, measured vs modelled latency and in-model/isolated time per kernel kind, for the
three cache states (run from the repository root: python bench/results/cache-state/table.py)."""
import json

runs = {"cold (b6c3313, zoo-intel-tap-sum)": "bench/results/zoo-intel-tap-sum/zoo-0",
        "warm (no step between calls)": "bench/results/cache-state/warm",
        "l3 (private caches evicted)": "bench/results/cache-state/l3-probe"}
models = ["mobilenet_v3_small","mobilenet_v2","shufflenet_v2_x1_0","levit_128s","resnet18","distilbert_2layer","densenet121","resnet50"]
print("| model | " + " | ".join(f"{r}: measured ms / modelled ms (ratio)" for r in runs) + " |")
print("|---|" + "---|"*len(runs))
for m in models:
    row=[m]
    for r, d in runs.items():
        try: j=json.load(open(f"{d}/{m}.json"))
        except FileNotFoundError: row.append("–"); continue
        meas=j["latency_ms"]["korch"]["median"]; mod=j["korch_plan"]["modelled_ms"]
        row.append(f"{meas:.2f} / {mod:.2f} ({mod/meas:.2f})")
    print("| " + " | ".join(row) + " |")
print()
print("In-model / isolated time per kernel kind (korch library, VM profile):")
print()
for r, d in runs.items():
    print(f"- {r}:")
    for m in models:
        try: j=json.load(open(f"{d}/{m}.json"))
        except FileNotFoundError: continue
        kinds=j["in_model"]["by_kind"]["korch"]
        tot_in=sum(v["in_model_ms"] for v in kinds.values()); tot_iso=sum(v["isolated_ms"] for v in kinds.values())
        print(f"  {m}: all kernels {tot_in/tot_iso:.2f} (" + ", ".join(f"{k} {v['ratio']:.2f}" for k,v in sorted(kinds.items(), key=lambda kv:-kv[1]['isolated_ms'])) + ")")
