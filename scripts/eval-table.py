#!/usr/bin/env python3
"""Markdown table of `lcut eval --suite --json` results, one row per file.

    python3 scripts/eval-table.py runs/eval/*.json

Columns: policy (with the adapter's folder name when there was one), accuracy
with its 95% Wilson interval, the full model's correct items the policy kept
(with the kept share and its 95% Wilson interval), correct/n per kind, top-1 agreement and KL against the full model (the base
model when an adapter was used), K/V held against full, and wall time.
"""

import json
import math
import sys
from pathlib import Path


def wilson(k, n, z=1.959964):
    """95% Wilson score interval of k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def kept_cell(kept, full):
    """`kept/full (share) [interval]` of the full model's correct items."""
    lo, hi = wilson(kept, full)
    share = kept / full if full else 0.0
    return f"{kept}/{full} ({share:.0%}) [{lo:.0%}, {hi:.0%}]"


def row(path):
    result = json.loads(Path(path).read_text())
    scores = {g["group"]: g for g in result["scores"]}
    every = scores["all"]
    kinds = [g for g in result["scores"] if g["group"] != "all" and " " not in g["group"]]
    adapter = result.get("adapter")
    name = result["policy"]
    if adapter:
        name += f" + LoRA `{Path(adapter['path']).name}`"
    lo, hi = every["ci95"]
    cells = [
        name,
        f"{every['accuracy']:.3f} [{lo:.2f}, {hi:.2f}]",
        kept_cell(every["kept_of_full"], every["full_correct"]),
    ]
    cells += [f"{g['correct']}/{g['n']}" for g in kinds]
    cells += [
        f"{every['top1_agreement']:.3f}",
        f"{every['mean_kl']:.3f}",
        f"{every['kv_ratio']:.3f}",
        f"{result['seconds'] / 60:.1f} min",
    ]
    return [g["group"] for g in kinds], cells


def main(paths):
    if not paths:
        sys.exit("usage: eval-table.py RESULT.json...")
    rows = [row(p) for p in paths]
    kinds = rows[0][0]
    head = ["policy", "accuracy [95% CI]", "kept of full's correct"] + kinds
    head += ["top-1 vs full", "KL (nats)", "K/V held vs full", "wall"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for k, cells in rows:
        if k != kinds:
            sys.exit(f"the results group items differently: {k} vs {kinds}")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
