"""Does the form that won on one kernel of an anchor run the others as well as their best?

    python3 transfer.py VARIANTS.json   (variant_wins.py's output)
"""
import json
import statistics
import sys
from collections import Counter, defaultdict

rows = json.load(open(sys.argv[1]))
groups = defaultdict(list)
for row in rows:
    groups[row["anchor"]].append(row)
print(f"kernels {len(rows)}, anchors {len(groups)}, kernels per anchor "
      f"{sorted(Counter(len(g) for g in groups.values()).items())}")
print("fastest form:", dict(Counter(min(r["times"], key=r["times"].get) for r in rows)))
first_winner, best = [], []
for group in groups.values():
    winner = min(group[0]["times"], key=group[0]["times"].get)
    for row in group[1:]:
        packed = row["times"]["packed"]
        first_winner.append(min(packed, row["times"].get(winner, packed)) / packed)
        best.append(min(row["times"].values()) / packed)
print(f"on the {len(best)} other kernels of an anchor, time / packed form's: the first kernel's "
      f"winner and packed, the faster: mean {statistics.mean(first_winner):.3f}; "
      f"the best of all forms: mean {statistics.mean(best):.3f}")
all_best = [min(r["times"].values()) / r["times"]["packed"] for r in rows]
print(f"every kernel, best of all forms / packed: mean {statistics.mean(all_best):.3f}, "
      f"median {statistics.median(all_best):.3f}")
