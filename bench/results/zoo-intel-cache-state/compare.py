"""Per model: cache state, footprint, measured and modelled Korch latency of this pass and of
b6c3313 (zoo-intel-tap-sum), Korch/ORT and compile seconds (run from the repository root)."""
import json, glob, os, sys
new = sys.argv[1] if len(sys.argv) > 1 else "bench/results/zoo-intel-cache-state/zoo-0"
old = "bench/results/zoo-intel-tap-sum/zoo-0"
print(f"{'model':24s} {'state':5s} {'MiB':>5s} | {'meas':>6s} {'mod':>6s} {'ratio':>5s} | old {'meas':>6s} {'mod':>6s} {'ratio':>5s} | k/ort new old | compile new old")
for f in sorted(glob.glob(f"{new}/*.json")):
    m = os.path.basename(f)[:-5]
    d = json.load(open(f))
    try: o = json.load(open(f"{old}/{m}.json"))
    except FileNotFoundError: o = None
    c = d["compile"]["korch"]["cold"]
    cs = c.get("cache_state") or {}
    lat = d["latency_ms"]; pl = d["korch_plan"]
    r = pl["modelled_ms"]/lat["korch"]["median"]
    line = f"{m:24s} {cs.get('state','?'):5s} {(cs.get('footprint_bytes') or 0)/2**20:5.0f} | {lat['korch']['median']:6.2f} {pl['modelled_ms']:6.2f} {r:5.2f} |"
    if o:
        ol = o["latency_ms"]; op = o["korch_plan"]
        line += f"     {ol['korch']['median']:6.2f} {op['modelled_ms']:6.2f} {op['modelled_ms']/ol['korch']['median']:5.2f} |"
        line += f" {lat['onnxruntime']['median']/lat['korch']['median']:.2f} {ol['onnxruntime']['median']/ol['korch']['median']:.2f} |"
        line += f" {c['compile_seconds']:.0f} {o['compile']['korch']['cold']['compile_seconds']:.0f}"
    print(line)
