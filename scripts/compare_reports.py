"""Compare two lcut report.json files of the same run on different devices.

usage: python3 compare_reports.py A/report.json B/report.json [TOLERANCE]

Every number in the traces and curves is compared (NaN equals NaN); the
generated tokens and the recommended cutoff must be equal. Prints the
largest difference per field and exits 1 when one is above TOLERANCE
(default 1e-3) or anything else differs.
"""
import json
import math
import sys


def leaves(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(x, list):
        for v in x:
            yield from leaves(v, path)
    else:
        yield path, x


def main():
    a, b = (json.load(open(p)) for p in sys.argv[1:3])
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-3
    worst, problems = {}, []
    for part in ("traces", "curves"):
        la, lb = list(leaves(a[part], part)), list(leaves(b[part], part))
        if [p for p, _ in la] != [p for p, _ in lb]:
            problems.append(f"{part}: different shapes")
            continue
        for (path, x), (_, y) in zip(la, lb):
            key = path.split(".", 1)[1] if part == "traces" else path
            if isinstance(x, (int, float)) and isinstance(y, (int, float)) and \
                    not isinstance(x, bool):
                if math.isnan(x) and math.isnan(y):
                    continue
                worst[key] = max(worst.get(key, 0.0), abs(x - y))
            elif x != y:
                problems.append(f"{path}: {x!r} != {y!r}")
    ra, rb = a["recommendation"], b["recommendation"]
    if ra.get("l_cut") != rb.get("l_cut"):
        problems.append(f"recommended L_cut {ra.get('l_cut')} != {rb.get('l_cut')}")
    for key, d in sorted(worst.items()):
        print(f"{key:40s} max |difference| {d:.3e}{'  > tolerance' if d > tol else ''}")
    for p in problems[:20]:
        print("differs:", p)
    bad = problems or any(d > tol for d in worst.values())
    print("reports agree" if not bad else "reports DIFFER")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
