import json, collections, math
rows = json.load(open("/tmp/bo/wins.json"))
win = collections.Counter(); n = collections.Counter(); loss = collections.defaultdict(list)
matched = 0
for flops, t in rows:
    t = {k: v for k, v in t.items() if v}
    if len(t) < 2: continue
    matched += 1
    best = min(t, key=t.get); win[best] += 1
    for k in t: n[k] += 1
    # what dropping each variant would cost: best of the others / best
    for k in t:
        others = [v for kk, v in t.items() if kk != k]
        loss[k].append(min(others) / t[best])
    # loss when only packed (+plain) measured
    base = [v for kk, v in t.items() if kk in ("packed", "plain")]
    if base: loss["only_rule"].append(min(base) / t[best])
print("kernels matched", matched, "wins", dict(win), "present", dict(n))
for k, v in loss.items():
    v = sorted(v); print(k, "mean loss %.3f" % (sum(v)/len(v)), "p90 %.3f" % v[int(.9*len(v))], "max %.3f" % v[-1], ">5%%: %d" % sum(x > 1.05 for x in v))
