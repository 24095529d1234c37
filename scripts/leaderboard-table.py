#!/usr/bin/env python3
"""Markdown tables of an `lcut eval --ratios` run from its leaderboard.csv.

Usage: scripts/leaderboard-table.py DIR/leaderboard.csv

Prints two tables: the mean over tasks (kvpress's `all`) with each method's
score at each ratio, its 95% interval and the share of the prompt's K/V it
removed (measured); then each task's score per method and ratio. Where the
run's folder holds leaderboard-pairs.csv (the paired comparisons), a third:
at each ratio, the methods each method beats (paired tests, Holm at 95%).
The numbers are the CSVs' own, only laid out for docs/leaderboard.md.
"""

import csv
import os
import sys
from collections import defaultdict


def beats_table(path: str, methods: list[str]) -> None:
    """The methods each method beats at each ratio, from leaderboard-pairs.csv."""
    with open(path, newline="") as f:
        pairs = list(csv.DictReader(f))
    if not pairs:
        return
    groups: list[str] = []
    for p in pairs:
        if p["ratio"] not in groups:
            groups.append(p["ratio"])
    beats = defaultdict(list)
    items = defaultdict(set)
    tests = defaultdict(set)
    for p in pairs:
        g = p["ratio"]
        items[g].add(p["n"])
        tests[g].add(p["test"])
        if p["winner"]:
            loser = p["method_b"] if p["winner"] == p["method_a"] else p["method_a"]
            beats[(g, p["winner"])].append(loser)
    print("\nWhich methods beat which (each pair at a ratio compared on the same items: the "
          "exact McNemar test for right-or-wrong items, a paired bootstrap of the mean score "
          "difference where scores are partial; Holm's correction across the ratio's pairs, "
          "95%). A cell names the methods the row's method beats at that ratio; two methods "
          "neither of which names the other are tied:\n")
    label = lambda g: g if g == "own knob" else f"ratio {g}"
    print("| method | " + " | ".join(label(g) for g in groups) + " |")
    print("|---|" + "---|" * len(groups))
    for m in methods:
        cells = []
        for g in groups:
            in_group = any(p["ratio"] == g and m in (p["method_a"], p["method_b"]) for p in pairs)
            cells.append(", ".join(beats[(g, m)]) or "-" if in_group else "")
        if any(cells):
            print(f"| {m} | " + " | ".join(cells) + " |")
    for g in groups:
        n = "/".join(sorted(items[g], key=int))
        print(f"\n{label(g)}: {n} items a pair; {', '.join(sorted(tests[g]))}.", end="")
    print()


def main(path: str) -> None:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{path}: no rows")
    ratios = sorted({r["compression_ratio"] for r in rows if r["method"] != "no_press"})
    methods: list[str] = []
    for r in rows:
        if r["method"] not in methods:
            methods.append(r["method"])
    cell = {(r["task"], r["method"], r["compression_ratio"]): r for r in rows}
    tasks: list[str] = []
    for r in rows:
        if r["task"] != "all" and r["task"] not in tasks:
            tasks.append(r["task"])

    full = cell[("all", "no_press", "0.000")]
    n = full["n"]
    print(f"Mean over {len(tasks)} tasks ({n} items); full model (`no_press`): "
          f"{float(full['score']):.1f} "
          f"[{100 * float(full['score_ci_low']):.0f}, {100 * float(full['score_ci_high']):.0f}]\n")
    print("| method | " + " | ".join(f"ratio {r}" for r in ratios) + " |")
    print("|---|" + "---|" * len(ratios))
    for m in methods:
        if m == "no_press":
            continue
        parts = []
        for r in ratios:
            c = cell.get(("all", m, r))
            if c is None:
                parts.append("-")
                continue
            parts.append(
                f"{float(c['score']):.1f} [{100 * float(c['score_ci_low']):.0f}, "
                f"{100 * float(c['score_ci_high']):.0f}], removed {float(c['prompt_kv_removed']):.3f}"
            )
        print(f"| {m} | " + " | ".join(parts) + " |")

    print("\nPer task (score 0 to 100; each cell one method at the ratios "
          + " / ".join(ratios) + "):\n")
    print("| method | " + " | ".join(tasks) + " |")
    print("|---|" + "---|" * len(tasks))
    by_method = defaultdict(list)
    for t in tasks:
        f0 = cell.get((t, "no_press", "0.000"))
        by_method["full"].append(f"{float(f0['score']):.0f}" if f0 else "-")
        for m in methods:
            if m == "no_press":
                continue
            scores = []
            for r in ratios:
                c = cell.get((t, m, r))
                scores.append(f"{float(c['score']):.0f}" if c else "-")
            by_method[m].append("/".join(scores))
    for m, parts in by_method.items():
        print(f"| {m} | " + " | ".join(parts) + " |")

    pairs = os.path.join(os.path.dirname(path), "leaderboard-pairs.csv")
    if os.path.exists(pairs):
        beats_table(pairs, methods)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
