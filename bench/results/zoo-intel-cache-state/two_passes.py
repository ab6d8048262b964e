"""Per model, both passes side by side: modelled/measured, Korch/ORT, Korch/OpenVINO, compile s."""
import json, glob, os, math, statistics
a = "bench/results/zoo-intel-cache-state/zoo-0"; b = "bench/results/zoo-intel-cache-state/pass2/zoo-0"
rows = []
print(f"{'model':24s} {'state':5s} | mod/meas p1 p2 | k/ort p1 p2 | k/ov p1 p2 | compile p1 p2")
for f in sorted(glob.glob(b + "/*.json")):
    m = os.path.basename(f)[:-5]
    x = json.load(open(f)); y = json.load(open(f"{a}/{m}.json"))
    def r(d): return d["korch_plan"]["modelled_ms"] / d["latency_ms"]["korch"]["median"]
    def k(d, e): return d["ratios"][f"korch_vs_{e}"]["ratio"]
    st = x["compile"]["korch"]["cold"]["cache_state"]["state"]
    print(f"{m:24s} {st:5s} | {r(y):.2f} {r(x):.2f} | {k(y,'onnxruntime'):.2f} {k(x,'onnxruntime'):.2f} | {k(y,'openvino'):.2f} {k(x,'openvino'):.2f} | {y['compile']['korch']['cold']['compile_seconds']:.0f} {x['compile']['korch']['cold']['compile_seconds']:.0f}")
