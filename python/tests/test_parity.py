"""Session.forward against an outside reference and against lcut's command line.

- Hugging Face transformers' float32 runs of eleven dense reference cases
  (fixtures/oracle/*: reference.safetensors, case.json) and five with experts
  (fixtures/oracle/moe/*: Qwen3-MoE twice, Mixtral, gpt-oss twice: its folder's settings
  and the ones llama.cpp's GGUF files run with) and eight of the newest
  layouts (fixtures/oracle/layouts/*: Gemma 4 and Qwen3.5, dense and with experts, and the
  three as published, inside their multimodal wrappers): logits at full depth and under every SPEED / SelfOnly policy listed there,
  every layer's residual stream and the attention of every layer that has attention rows,
  within 1e-4; a mixture's routing of every token (router probabilities
  within 1e-5, the experts each token runs).
- ``lcut forward``'s safetensors file for the same ids and policy: the same
  logits bit for bit in float32 (and the same records at full depth).
"""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

import lcut
from conftest import BUNDLED, ORACLE, SMOLLM2, missing, run_cli

TOL = 1e-4
DENSE = sorted(p.parent.name for p in ORACLE.glob("*/case.json"))
EXPERTS = sorted(f"moe/{p.parent.name}" for p in (ORACLE / "moe").glob("*/case.json"))
LAYOUTS = sorted(f"layouts/{p.parent.name}" for p in (ORACLE / "layouts").glob("*/case.json"))
CASES = DENSE + EXPERTS + LAYOUTS


def policy_string(p: dict) -> str:
    """A case.json policy written as lcut reads policies."""
    kind = "selfonly" if p["self_only"] else "speed"
    anchors = {(): "", (0,): "+bos"}[tuple(p["anchors"])]
    return f"{kind}:{p['l_cut']}{anchors}"


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def test_all_twenty_five_reference_cases_are_here():
    assert (len(DENSE), len(EXPERTS), len(LAYOUTS)) == (11, 5, 9), CASES


@pytest.mark.parametrize("case", CASES)
def test_full_depth_matches_transformers(case):
    ref = load_file(str(ORACLE / case / "reference.safetensors"))
    session = lcut.load(ORACLE / case)
    ids = ref["input_ids"].tolist()
    out = session.forward(ids, decode_start=0)
    assert out.logits.dtype == np.float32
    assert max_abs(out.logits, ref["logits"]) <= TOL, case
    layers = session.config.layers
    assert out.layer_out.shape == (layers, len(ids), session.config.hidden)
    assert out.attention.shape == (layers, session.config.heads, len(ids), len(ids))
    for layer in range(layers):
        assert max_abs(out.layer_out[layer], ref[f"layer_out.{layer}"]) <= TOL, (case, layer)
        if f"attn.{layer}" not in ref:
            # a linear-attention layer (Qwen3.5) has no attention rows
            assert not out.attention[layer].any(), (case, layer)
            continue
        assert max_abs(out.attention[layer], ref[f"attn.{layer}"]) <= TOL, (case, layer)
    # transformers stores Gemma-2's unscaled lookup (Gemma 3's embed_tokens scales)
    if session.config.arch != "gemma2":
        assert max_abs(out.embeddings, ref["embeddings"]) <= TOL, case


@pytest.mark.parametrize("case", CASES)
def test_every_listed_policy_matches_transformers(case):
    spec = json.loads((ORACLE / case / "case.json").read_text())
    ref = load_file(str(ORACLE / case / "reference.safetensors"))
    session = lcut.load(ORACLE / case)
    ids = ref["input_ids"].tolist()
    assert len(spec["policies"]) >= 6
    for p in spec["policies"]:
        out = session.forward(
            ids, policy=policy_string(p), decode_start=p["decode_start"], attention=False
        )
        want = ref[p["key"]]
        assert out.logits.shape == want.shape == (len(ids) - p["decode_start"], want.shape[1])
        assert max_abs(out.logits, want) <= TOL, (case, p["key"])


ROUTED = [c for c in CASES if "router.0.probs" in load_file(str(ORACLE / c / "reference.safetensors"))]


def test_every_routed_case_is_checked():
    assert len(ROUTED) == 8, ROUTED


@pytest.mark.parametrize("case", ROUTED)
def test_routing_matches_transformers(case):
    """A mixture's router probabilities, experts and weights for every token
    at full depth, and the decode tokens' under every listed policy."""
    spec = json.loads((ORACLE / case / "case.json").read_text())
    ref = load_file(str(ORACLE / case / "reference.safetensors"))
    session = lcut.load(ORACLE / case)
    ids = ref["input_ids"].tolist()
    out = session.forward(ids, decode_start=0, residuals=False, attention=False)
    assert out.sparse_layers and out.router_probs.shape[:2] == (len(out.sparse_layers), len(ids))
    for i, layer in enumerate(out.sparse_layers):
        assert max_abs(out.router_probs[i], ref[f"router.{layer}.probs"]) <= 1e-5, (case, layer)
        assert np.array_equal(out.experts[i], ref[f"router.{layer}.experts"]), (case, layer)
        assert max_abs(out.expert_weights[i], ref[f"router.{layer}.weights"]) <= 1e-5, (case, layer)
    for p in spec["policies"]:
        s = p["decode_start"]
        out = session.forward(ids, policy=policy_string(p), decode_start=s, residuals=False, attention=False)
        key = p["key"].removeprefix("logits.")
        for i, layer in enumerate(out.sparse_layers):
            want = ref[f"router.{key}.{layer}.probs"]
            assert max_abs(out.router_probs[i, s:], want) <= 1e-5, (case, key, layer)
            assert np.array_equal(out.experts[i, s:], ref[f"router.{key}.{layer}.experts"]), (case, key)
            # a prompt token kept out of the layer has no routing there
            kept_out = layer >= p["l_cut"]
            assert np.all((out.experts[i, 1:s] < 0) == kept_out), (case, key, layer)
            assert np.all(np.isnan(out.router_probs[i, 1:s]) == kept_out), (case, key, layer)


def test_a_dense_model_has_no_routing(bundled):
    out = bundled.forward([1, 5, 9, 12], residuals=False, attention=False)
    assert out.sparse_layers is None and out.router_probs is None and out.experts is None


def test_a_lora_adapter_gives_peft_logits():
    ref = load_file(str(ORACLE / "lora" / "reference.safetensors"))
    session = lcut.load(ORACLE / "llama-gqa", lora=ORACLE / "lora" / "adapter")
    assert session.adapter["policy"] == "speed:4+bos"
    assert session.adapter["mode"] == "merge"
    ids = ref["input_ids"].tolist()
    rows = ref["logits"].shape[0]
    out = session.forward(ids, decode_start=-rows, residuals=False, attention=False)
    assert max_abs(out.logits, ref["logits"]) <= TOL
    base = lcut.load(ORACLE / "llama-gqa").forward(ids, decode_start=len(ids) - rows)
    assert max_abs(base.logits, ref["logits"]) > 1e-2, "the adapter changed nothing"


def cli_forward(lcut_bin, tmp_path, model, ids, policy, decode_start, *extra):
    out = tmp_path / f"{policy.replace(':', '_').replace('/', '_')}.safetensors"
    run_cli(
        lcut_bin,
        "forward",
        "--model", model,
        "--ids", ",".join(map(str, ids)),
        "--policy", policy,
        "--decode-start", decode_start,
        "--out", out,
        *extra,
    )
    return load_file(str(out))


@pytest.mark.parametrize(
    "model,policy",
    [
        (BUNDLED, "full"),
        (BUNDLED, "speed:2+bos"),
        (BUNDLED, "selfonly:3+bos"),
        (ORACLE / "qwen3-qknorm", "full"),
        (ORACLE / "gemma2-softcap", "speed:4"),
        (ORACLE / "mistral-window", "speed:1/2+bos"),
        (ORACLE / "moe" / "qwen3moe-sparse", "full"),
        (ORACLE / "moe" / "gptoss-sinks", "speed:3+bos"),
    ],
)
def test_logits_equal_lcut_forward_bit_for_bit(lcut_bin, tmp_path, model, policy):
    session = lcut.load(model)
    vocab = session.config.vocab
    ids = [1] + [(7 * i + 3) % vocab for i in range(30)]
    s = 20
    file = cli_forward(lcut_bin, tmp_path, model, ids, policy, s)
    ours = session.forward(ids, policy=policy, decode_start=s)
    assert file["input_ids"].tolist() == ids
    # the file holds every row at full depth, the decode rows under a policy
    want = file["logits"][s:] if policy == "full" else file["logits"]
    assert ours.logits.dtype == want.dtype == np.float32
    assert ours.logits.shape == want.shape == (len(ids) - s, vocab)
    assert np.array_equal(ours.logits, want), f"max diff {max_abs(ours.logits, want):e}"
    if policy == "full":
        assert np.array_equal(ours.embeddings, file["embeddings"])
        for layer in range(session.config.layers):
            assert np.array_equal(ours.layer_out[layer], file[f"layer_out.{layer}"])
            assert np.array_equal(ours.attention[layer], file[f"attn.{layer}"])
    else:
        assert int(file["decode_start"][0]) == s == ours.decode_start
    # a mixture's routing of the rows the logits hold, as transformers' files name it
    first = 0 if policy == "full" else s
    for i, layer in enumerate(ours.sparse_layers or []):
        assert np.array_equal(file[f"router.{layer}.probs"], ours.router_probs[i, first:], equal_nan=True)
        assert np.array_equal(file[f"router.{layer}.experts"], ours.experts[i, first:])
        assert np.array_equal(file[f"router.{layer}.weights"], ours.expert_weights[i, first:], equal_nan=True)
    assert any(k.startswith("router.") for k in file) == (ours.sparse_layers is not None)


def test_smollm2_quantized_logits_equal_lcut_forward(lcut_bin, tmp_path, smollm2):
    ids = smollm2.tokenize("The access code is 5783. What is the access code?", chat=True)
    s = len(ids) - 6
    for policy in ["full", "speed:22+bos"]:
        file = cli_forward(lcut_bin, tmp_path, SMOLLM2, ids, policy, s, "--dtype", "q", "--no-attention")
        ours = smollm2.forward(ids, policy=policy, decode_start=s, attention=False)
        want = file["logits"][s:] if policy == "full" else file["logits"]
        assert np.array_equal(ours.logits, want), policy
    # the speed rows really are another model's than full's
    full = smollm2.forward(ids, decode_start=s, residuals=False, attention=False)
    assert not np.array_equal(full.logits, ours.logits)


def test_records_under_a_policy_mark_tokens_absent_above_the_cut(bundled):
    ids = [2] + list(range(10, 30))
    s = 15
    out = bundled.forward(ids, policy="speed:2+bos", decode_start=s)
    layers = bundled.config.layers
    # below the cut every token has a hidden state; above it the prefill
    # tokens (not BoS, not decode-phase) have none
    assert np.isfinite(out.layer_out[:2]).all()
    for layer in range(2, layers):
        assert np.isnan(out.layer_out[layer, 1:s]).all()
        assert np.isfinite(out.layer_out[layer, [0, *range(s, len(ids))]]).all()
        # a decode query above the cut reads nothing of the prefill tokens
        assert (out.attention[layer][:, s:, 1:s] == 0).all()
        rows = out.attention[layer][:, s:, :].sum(-1)
        assert np.allclose(rows, 1.0, atol=1e-5)
