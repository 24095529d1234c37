"""Writes report.ipynb: the notebook that redraws an lcut report's figures.

Kept as a script so the notebook's cells are reviewable as plain Python;
run `python3 notebooks/make_notebook.py` after editing a cell.
"""
import json
import pathlib

CELLS = [
    ("markdown", """# An lcut report, redrawn

Loads the `report.json` that `lcut diagnose --out DIR` writes (path from the
`LCUT_REPORT` environment variable, default `runs/latest/report.json`) and redraws
the main figures: per-layer phase masses, prompt entropy and curvature with the
recommended L_cut, the layer x decode-step heatmap of prefill mass, the layer x
prompt-position map, and the sweep's quality-vs-cost curve when there is one."""),
    ("code", """import json, os, pathlib
import numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

path = pathlib.Path(os.environ.get("LCUT_REPORT", "runs/latest/report.json"))
if not path.exists():
    path = pathlib.Path("..") / path
report = json.loads(path.read_text())
assert report["schema_version"] == 1, report["schema_version"]

def series(xs):
    return np.array([np.nan if x is None else x for x in xs], dtype=float)

def tensor(t):
    return np.array([np.nan if x is None else x for x in t["data"]], dtype=float).reshape(t["shape"])

curves, rec = report["curves"], report["recommendation"]
L = curves["num_layers"]
print(report["model"]["arch"], L, "layers;", len(report["traces"]), "prompts")
print(rec["explanation"])"""),
    ("code", """fig, axes = plt.subplots(1, 3, figsize=(15, 4))
layers = np.arange(L)
for name in ["bos", "prefill", "decode", "self_mass"]:
    axes[0].plot(layers, series(curves[name]), marker="o", label=name)
axes[0].set_title("attention mass by phase"); axes[0].set_xlabel("layer"); axes[0].legend()
axes[1].plot(layers, series(curves["entropy_head_mean"]), marker="o", label="head mean")
axes[1].plot(layers, series(curves["entropy_weighted"]), marker="s", label="prefill-mass weighted")
axes[1].set_title("normalised prompt entropy"); axes[1].set_xlabel("layer"); axes[1].legend()
axes[2].plot(np.arange(L + 1), series(curves["curvature_prompt"]), marker="o", label="prompt span")
axes[2].plot(np.arange(L + 1), series(curves["curvature_generated"]), marker="s", label="generated span")
axes[2].set_title("curvature (0 = embeddings)"); axes[2].set_xlabel("layer + 1"); axes[2].legend()
for ax in axes:
    ax.axvline(rec["l_cut"] - 0.5, color="red", linestyle="--", label="L_cut")
fig.tight_layout()"""),
    ("code", """by_step = tensor(curves["prefill_by_step"])
trace = max(report["traces"], key=lambda t: len(t["generated"]))
pa = tensor(trace["prompt_attention"])
fig, axes = plt.subplots(1, 2, figsize=(14, 4))
im = axes[0].imshow(by_step, aspect="auto", origin="lower", cmap="viridis")
axes[0].set_title("prefill mass, layer x decode step (mean over prompts)")
axes[0].set_xlabel("decode step"); axes[0].set_ylabel("layer"); fig.colorbar(im, ax=axes[0])
im = axes[1].imshow(pa[:, 1:], aspect="auto", origin="lower", cmap="magma")
axes[1].set_title(f"attention onto prompt positions (BoS apart), prompt {trace['id']}")
axes[1].set_xlabel("prompt bin"); axes[1].set_ylabel("layer"); fig.colorbar(im, ax=axes[1])
fig.tight_layout()
assert by_step.shape[0] == L and pa.shape[0] == L"""),
    ("code", """sweep = report.get("sweep")
if sweep:
    fig, ax = plt.subplots(figsize=(6, 4))
    for anchors in sorted({p["anchors"] for p in sweep["points"]}):
        pts = sorted((p for p in sweep["points"] if p["anchors"] == anchors), key=lambda p: p["l_cut"])
        ax.plot([p["kv_ratio"] for p in pts], [p["top1_agreement"] for p in pts], marker="o", label=anchors)
    ax.set_xlabel(f"KV ratio at {sweep['context_len']} tokens"); ax.set_ylabel("top-1 agreement")
    ax.set_title(f"sweep (knee at L_cut = {sweep['knee']})"); ax.legend()
else:
    print("no sweep in this report (run `lcut sweep --out DIR`)")"""),
]

nb = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                 "language_info": {"name": "python"}},
    "cells": [],
}
for i, (kind, src) in enumerate(CELLS):
    cell = {"cell_type": kind, "id": f"cell-{i}", "metadata": {}, "source": src}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    nb["cells"].append(cell)
out = pathlib.Path(__file__).with_name("report.ipynb")
out.write_text(json.dumps(nb, indent=1) + "\n")
print("wrote", out)
