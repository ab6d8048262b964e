import json, statistics
rows = json.load(open("/tmp/bo/wins.json"))
small = [(f, t) for f, t in rows if f < 2e7 and t.get("packed") and t.get("plain")]
big = [(f, t) for f, t in rows if f >= 2e7 and t.get("packed") and t.get("plain")]
for name, group in (("small", small), ("big", big)):
    r = sorted(t["plain"] / t["packed"] for f, t in group)
    print(name, len(group), "plain/packed quantiles", [round(r[int(q * (len(r) - 1))], 3) for q in (0, .1, .25, .5, .75, .9, 1)])
    tot_pk = sum(t["packed"] for f, t in group); tot_best = sum(min(t["packed"], t["plain"]) for f, t in group)
    print("  sum packed %.2f ms, sum best-of-two %.2f ms" % (tot_pk * 1e3, tot_best * 1e3))
    # by flop class
for lo, hi in ((0, 1e5), (1e5, 1e6), (1e6, 5e6), (5e6, 2e7)):
    g = [t for f, t in small if lo <= f < hi]
    if g:
        r = sorted(t["plain"] / t["packed"] for t in g)
        print(f"  flops {lo:.0e}-{hi:.0e}: n={len(g)} median {r[len(r)//2]:.3f} p10 {r[len(r)//10]:.3f} p90 {r[9*len(r)//10]:.3f}; sum packed {sum(t['packed'] for t in g)*1e3:.2f} best {sum(min(t['packed'],t['plain']) for t in g)*1e3:.2f} ms")
