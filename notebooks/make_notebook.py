"""Writes the notebooks: report.ipynb (an lcut report's figures, redrawn from
report.json) and smollm2.ipynb (SmolLM2 traced, diagnosed and run under SPEED
from Python with `import lcut`).

Kept as a script so the notebooks' cells are reviewable as plain Python;
run `python3 notebooks/make_notebook.py` after editing a cell.
"""
import json
import pathlib

REPORT_CELLS = [
    ("markdown", """# An lcut report, redrawn

Reads the `report.json` that `lcut diagnose --out DIR` (or `Report.save(DIR)` from
Python) writes, through `lcut.Report.load` (path from the `LCUT_REPORT` environment
variable, default `runs/latest/report.json`), and redraws the main figures: per-layer
phase masses, prompt entropy and curvature with the recommended L_cut, the layer x
decode-step heatmap of prefill mass, the layer x prompt-position map, and the sweep's
quality-vs-cost curve when there is one. Needs the `lcut` package (`pip install ./python`)."""),
    ("code", """import os, pathlib
import numpy as np
import matplotlib.pyplot as plt
import lcut

path = pathlib.Path(os.environ.get("LCUT_REPORT", "runs/latest/report.json"))
if not path.exists():
    path = pathlib.Path("..") / path
report = lcut.Report.load(path)
curves, L = report.curves, report.num_layers
print(report.model["arch"], L, "layers;", len(report.prompts), "prompts")
print(report.explanation)
print("recommended L_cut =", report.recommended_l_cut, "votes:", report.votes)
report.layer_table()"""),
    ("code", """fig, axes = plt.subplots(1, 3, figsize=(15, 4))
layers = np.arange(L)
for name in ["bos", "prefill", "decode", "self"]:
    axes[0].plot(layers, curves[name], marker="o", label=name)
axes[0].set_title("attention mass by phase"); axes[0].set_xlabel("layer"); axes[0].legend()
axes[1].plot(layers, curves["entropy_head_mean"], marker="o", label="head mean")
axes[1].plot(layers, curves["entropy_weighted"], marker="s", label="prefill-mass weighted")
axes[1].set_title("normalised prompt entropy"); axes[1].set_xlabel("layer"); axes[1].legend()
axes[2].plot(np.arange(L + 1), curves["curvature_prompt"], marker="o", label="prompt span")
axes[2].plot(np.arange(L + 1), curves["curvature_generated"], marker="s", label="generated span")
axes[2].set_title("curvature (0 = embeddings)"); axes[2].set_xlabel("layer + 1"); axes[2].legend()
for ax in axes:
    ax.axvline(report.recommended_l_cut - 0.5, color="red", linestyle="--", label="L_cut")
fig.tight_layout()"""),
    ("code", """by_step = report.prefill_by_step
trace = max(report.traces, key=lambda t: t.num_steps)
pa = trace.prompt_attention
fig, axes = plt.subplots(1, 2, figsize=(14, 4))
im = axes[0].imshow(by_step, aspect="auto", origin="lower", cmap="viridis")
axes[0].set_title("prefill mass, layer x decode step (mean over prompts)")
axes[0].set_xlabel("decode step"); axes[0].set_ylabel("layer"); fig.colorbar(im, ax=axes[0])
im = axes[1].imshow(pa[:, 1:], aspect="auto", origin="lower", cmap="magma")
axes[1].set_title(f"attention onto prompt positions (BoS apart), prompt {trace.id}")
axes[1].set_xlabel("prompt bin"); axes[1].set_ylabel("layer"); fig.colorbar(im, ax=axes[1])
fig.tight_layout()
assert by_step.shape[0] == L and pa.shape[0] == L"""),
    ("code", """sweep = report.sweep
if sweep:
    fig, ax = plt.subplots(figsize=(6, 4))
    for anchors in sorted({p["anchors"] for p in sweep["points"]}):
        pts = sorted((p for p in sweep["points"] if p["anchors"] == anchors), key=lambda p: p["l_cut"])
        ax.plot([p["kv_ratio"] for p in pts], [p["top1_agreement"] for p in pts], marker="o", label=anchors)
    ax.set_xlabel(f"KV ratio at {sweep['context_len']} tokens"); ax.set_ylabel("top-1 agreement")
    ax.set_title(f"sweep (knee at L_cut = {report.knee})"); ax.legend()
else:
    print("no sweep in this report (run `lcut sweep --out DIR`, or diagnose(sweep=True))")"""),
]

SMOLLM2_CELLS = [
    ("markdown", """# SmolLM2 from Python: where do generated tokens read the prompt?

Loads SmolLM2-135M-Instruct (GGUF, Q4_1; `scripts/fetch-model.sh` fetches it into
`models/`, or set `LCUT_MODEL`) with `lcut.load`, traces one retrieval prompt, plots the
decode-to-prefill attention mass per layer (the quantity SPEED's cut drops above L_cut)
and one layer's head x position attention at the first decode step, runs the cutoff
recommendation, and compares SPEED at that cutoff with the full model on three prompts.
When the model file is absent every cell says so and does nothing."""),
    ("code", """import os, pathlib
import numpy as np
import matplotlib.pyplot as plt
import lcut

model = pathlib.Path(os.environ.get("LCUT_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
if not model.exists() and (pathlib.Path("..") / model).exists():
    model = pathlib.Path("..") / model
if model.exists():
    session = lcut.load(model, dtype="q")
    print(session)
    print(session.config)
else:
    session = None
    print(f"SKIPPED: {model} is not here; fetch it with scripts/fetch-model.sh (the cells below do nothing)")"""),
    ("code", """FILLER = (
    "The river changes its character many times on its way to the sea. Near its source it is a narrow "
    "stream that tumbles over rocks between steep banks of fern. Lower down it widens and slows, and "
    "willows lean over the water where herons wait for fish. Farmers have used its water for centuries, "
    "and the old mill still stands beside the bridge, though its wheel no longer turns. "
)
RETRIEVAL = ("Read the following text carefully, then answer the question at the end.\\n\\n"
             "The access code for the storeroom door is 5783.\\n\\n" + FILLER * 3 +
             "\\n\\nQuestion: What is the access code for the storeroom door?")
if session is not None:
    trace = session.trace(RETRIEVAL, max_new_tokens=12)
    print(repr(trace.text))
    print("prompt tokens:", trace.prompt_len, "decode start:", trace.decode_start, "steps:", trace.num_steps)
    # masses are [layers, heads, steps]; the five phases sum to 1
    assert trace.prefill_mass.shape == (session.config.layers, session.config.heads, trace.num_steps)
    total = trace.bos_mass + trace.anchor_mass + trace.prefill_mass + trace.decode_mass + trace.self_mass
    assert np.allclose(total, 1, atol=1e-4)"""),
    ("code", """if session is not None:
    L = session.config.layers
    layers = np.arange(L)
    fig, ax = plt.subplots(figsize=(8, 4))
    for name in ["bos_mass", "prefill_mass", "decode_mass", "self_mass"]:
        ax.plot(layers, getattr(trace, name).mean(axis=(1, 2)), marker="o", label=name.replace("_mass", ""))
    ax.set_xlabel("layer"); ax.set_ylabel("attention mass (mean over heads and steps)")
    ax.set_title("where decode tokens read: prefill mass per layer")
    ax.legend(); fig.tight_layout()
    per_layer = trace.prefill_mass.mean(axis=(1, 2))
    print("decode->prefill mass, first / last third of the layers:",
          per_layer[: L // 3].mean().round(3), per_layer[-L // 3 :].mean().round(3))"""),
    ("code", """if session is not None:
    # the decode step that outputs the code's first digit, at the upper
    # layer that reads the prompt most at that step
    step = next((k for k, g in enumerate(trace.generated) if g.strip().isdigit()), 0)
    layer = L // 2 + int(np.argmax(trace.prefill_mass[L // 2 :, :, step].mean(axis=1)))
    row = trace.attention(layer, step)  # [heads, positions 0 .. query]
    code = [i for i, t in enumerate(trace.tokens) if t.strip().isdigit()]
    fig, ax = plt.subplots(figsize=(12, 3.5))
    im = ax.imshow(row[:, 1:], aspect="auto", cmap="magma", interpolation="nearest",
                   extent=(0.5, row.shape[1] - 0.5, row.shape[0] - 0.5, -0.5))
    ax.plot(code, [-0.75] * len(code), "v", color="tab:cyan", clip_on=False)
    ax.set_xlabel("key position (BoS left out; triangles: the code's digits)"); ax.set_ylabel("head")
    ax.set_title(f"layer {layer}, decode step {step} (outputs {trace.generated[step]!r}): attention by head")
    fig.colorbar(im, ax=ax)
    print(f"layer {layer}, step {step}: share of each head's attention on the code's digits:",
          row[:, code].sum(axis=1).round(2))"""),
    ("code", """PROMPTS = [
    RETRIEVAL,
    "What is the capital of France?",
    "Write one sentence about the moon.",
]
if session is not None:
    report = session.diagnose(PROMPTS, max_new_tokens=12)
    print(report.explanation)
    print("recommended L_cut =", report.recommended_l_cut, "of", report.num_layers, "- votes:", report.votes)
    assert 1 <= report.recommended_l_cut <= L
    table = report.layer_table()
    print(table[["layer", "prefill", "entropy_weighted", "tail_mass"]].round(3).to_string(index=False))"""),
    ("code", """if session is not None:
    cut = report.recommended_l_cut
    rows = []
    for p in PROMPTS:
        g = session.generate(p, policy=f"speed:{cut}+bos", compare="full", max_new_tokens=24)
        rows.append({
            "prompt": p[-50:].replace("\\n", " "),
            "full": g.compare.text,
            f"speed:{cut}+bos": g.text,
            "agreement": round(g.agreement_rate, 2),
            "kv_ratio": round(g.kv_bytes / g.compare.kv_bytes, 3),
            "ttft_ratio": round(g.ttft_s / g.compare.ttft_s, 2),
        })
    try:
        import pandas as pd
        display(pd.DataFrame(rows))
    except ImportError:
        for r in rows:
            print(r)"""),
]


def write(name: str, cells) -> None:
    nb = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                     "language_info": {"name": "python"}},
        "cells": [],
    }
    for i, (kind, src) in enumerate(cells):
        cell = {"cell_type": kind, "id": f"cell-{i}", "metadata": {}, "source": src}
        if kind == "code":
            cell.update(outputs=[], execution_count=None)
        nb["cells"].append(cell)
    out = pathlib.Path(__file__).with_name(name)
    out.write_text(json.dumps(nb, indent=1) + "\n")
    print("wrote", out)


write("report.ipynb", REPORT_CELLS)
write("smollm2.ipynb", SMOLLM2_CELLS)
