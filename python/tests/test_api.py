"""The API on the bundled model: shapes and meanings of what comes back,
agreement with the command line's files, and errors as Python exceptions."""

import json
import pathlib

import numpy as np
import pytest

import lcut
from conftest import BUNDLED, FIXTURES, ORACLE, REPO, run_cli

PROMPT = "copy : with by [ castle eagle horse cake ] by that are for as was by for on in"


def test_config_is_the_model_folders(bundled):
    cfg = json.loads((BUNDLED / "config.json").read_text())
    c = bundled.config
    assert (c.layers, c.heads, c.kv_heads) == (
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
    )
    assert (c.hidden, c.vocab, c.arch) == (cfg["hidden_size"], cfg["vocab_size"], cfg["model_type"])
    assert c["layers"] == c.layers and "vocab" in c
    assert c.chat_template is True
    assert c.to_dict()["bos_token_id"] == cfg["bos_token_id"]
    with pytest.raises(KeyError, match="not a config field"):
        c["depth"]


def test_tokenize_and_decode_round_trip(bundled):
    raw = bundled.tokenize(PROMPT)
    assert raw[0] == bundled.config.bos_token_id
    assert bundled.decode(raw[1:]).split() == PROMPT.split()
    chat = bundled.tokenize(PROMPT, chat=True)
    assert len(chat) > len(raw)
    p = bundled.prepare(PROMPT)
    assert p["ids"] == chat and 0 < p["decode_start"] < len(chat)
    assert bundled.prepare(raw)["decode_start"] == len(raw) - 1
    assert bundled.resolve_policy("speed:1/2+bos") == "speed:2+bos"


def test_trace_arrays_are_layers_heads_steps_and_masses_sum_to_one(bundled):
    t = bundled.trace(PROMPT, max_new_tokens=6, progress=False)
    L, H = bundled.config.layers, bundled.config.heads
    steps = t.num_steps
    assert 1 <= steps <= 6 and len(t.ids) == steps == len(t.generated)
    for name in ["bos_mass", "anchor_mass", "prefill_mass", "decode_mass", "self_mass", "entropy_heads"]:
        a = getattr(t, name)
        assert a.shape == (L, H, steps) and a.dtype == np.float32, name
    total = t.bos_mass + t.anchor_mass + t.prefill_mass + t.decode_mass + t.self_mass
    assert np.allclose(total, 1.0, atol=1e-5)
    assert t.entropy.shape == (L,) and t.curvature.shape == (L + 1,)
    assert t.tokens == bundled.token_strings(t.prompt_ids)
    assert t.query_positions == list(range(t.prompt_len - 1, t.prompt_len - 1 + steps))
    assert t.text == bundled.decode([i for i in t.ids if i not in bundled.config.eos_token_ids])


def test_a_hybrid_models_linear_layers_report_their_state_split():
    """Qwen3.5's linear-attention layers have no attention rows: their
    masses are the prompt's share of the layer's output, listed by layer;
    a model whose every layer attends lists none."""
    case = FIXTURES / "oracle" / "layouts" / "qwen35-hybrid"
    session = lcut.load(case)
    ids = list(range(3, 23))
    t = session.trace(ids, max_new_tokens=4, progress=False)
    assert t.state_split_layers == [0, 1, 2, 4, 5, 6]
    for layer in t.state_split_layers:
        share = t.prefill_mass[layer]
        assert np.all((share >= 0) & (share <= 1)) and share.max() > 0.01
        assert np.allclose(share + t.decode_mass[layer], 1.0, atol=1e-6)
        assert np.all(np.isnan(t.entropy_heads[layer]))


def test_an_attention_only_model_has_no_state_split_layers(bundled):
    assert bundled.trace(PROMPT, max_new_tokens=2, progress=False).state_split_layers == []
    report = bundled.diagnose([PROMPT], max_new_tokens=2, progress=False)
    assert report.state_split_layers == [] and report.traces[0].state_split_layers == []


def test_the_lens_is_the_forward_lens_at_each_step(bundled):
    t = bundled.trace(PROMPT, max_new_tokens=5, progress=False, lens=True)
    L, steps = bundled.config.layers, t.num_steps
    for name in ["lens_prob", "lens_logprob", "lens_rank", "lens_top1", "lens_kl"]:
        a = getattr(t, name)
        assert a.shape == (L + 1, steps) and a.dtype == np.float32, name
    assert np.allclose(t.lens_prob, np.exp(t.lens_logprob))
    # the last hidden state is the model's own: the emitted token, first, KL 0
    assert [row[-1] for row in zip(*t.lens_top_ids)] == t.ids
    assert np.all(t.lens_rank[-1] == 1) and np.all(t.lens_kl[-1] == 0)
    assert len(t.lens_formation) == steps and max(t.lens_formation) <= L
    # teacher-forced over the prompt and the generated tokens, the same numbers
    f = bundled.forward(t.prompt_ids + t.ids, residuals=False, attention=False, lens=True)
    assert f.lens_logprob.shape == (L + 1, len(t.prompt_ids) + steps)
    at = np.array(t.query_positions)
    assert np.allclose(f.lens_logprob[:, at], t.lens_logprob, atol=1e-4)
    assert bundled.trace(PROMPT, max_new_tokens=2, progress=False).lens_prob is None
    table = t.layer_table()
    assert "lens_formed" in set(table.keys() if isinstance(table, dict) else table.columns)


def test_trace_is_the_diagnose_runs_trace_transposed(bundled, tmp_path):
    t = bundled.trace(PROMPT, max_new_tokens=5, progress=False)
    report = bundled.diagnose([PROMPT], max_new_tokens=5, progress=False)
    r = report.traces[0]
    assert r.ids == t.ids
    assert np.array_equal(r.prefill_mass, t.prefill_mass)
    assert np.array_equal(r.entropy, t.entropy, equal_nan=True)
    # lcut's file stores [layers, steps, heads]; the API gives [layers, heads, steps]
    stored = report.to_dict()["traces"][0]["prefill"]
    data = np.array([np.nan if x is None else x for x in stored["data"]], dtype=np.float32)
    as_stored = data.reshape(stored["shape"])
    assert tuple(stored["shape"]) == (t.num_layers, t.num_steps, t.num_heads)
    assert np.array_equal(as_stored.transpose(0, 2, 1), t.prefill_mass)


def test_attention_row_is_the_step_the_masses_were_read_from(bundled):
    t = bundled.trace(PROMPT, max_new_tokens=4, progress=False)
    for layer, step in [(0, 0), (bundled.config.layers - 1, t.num_steps - 1)]:
        row = t.attention(layer, step)
        q = t.query_positions[step]
        assert row.shape == (bundled.config.heads, q + 1)
        assert np.allclose(row.sum(1), 1.0, atol=1e-5)
        start = max(t.anchor_len, 1)
        assert np.allclose(row[:, 0], t.bos_mass[layer, :, step], atol=1e-6)
        assert np.allclose(row[:, start : t.decode_start].sum(1), t.prefill_mass[layer, :, step], atol=1e-5)
        assert np.allclose(row[:, q], t.self_mass[layer, :, step], atol=1e-6)
    # indices may count from the end, as numpy's do
    assert np.array_equal(t.attention(-1, -1), t.attention(bundled.config.layers - 1, t.num_steps - 1))
    with pytest.raises(ValueError, match="layer 99 is out of range"):
        t.attention(99, 0)
    with pytest.raises(ValueError, match="decode step -99 is out of range"):
        t.attention(0, -99)


def test_a_speed_trace_reads_no_prompt_above_the_cut(bundled):
    t = bundled.trace(PROMPT, max_new_tokens=4, policy="speed:2+bos", progress=False)
    assert t.policy == "speed:2+bos"
    assert (t.prefill_mass[2:] == 0).all()
    assert (t.prefill_mass[:2] > 0).any()
    assert (t.bos_mass[2:] > 0).any()
    row = t.attention(3, 0)
    assert (row[:, 1 : t.decode_start] == 0).all()


def test_generate_under_full_is_the_traced_continuation_and_agrees_with_itself(bundled):
    t = bundled.trace(PROMPT, max_new_tokens=8, progress=False)
    g = bundled.generate(PROMPT, policy="full", max_new_tokens=8, compare="full", progress=False)
    assert g.ids == t.ids and g.text == t.text
    assert g.compare.ids == g.ids
    assert g.agreement.dtype == np.bool_ and g.agreement.all() and g.agreement_rate == 1.0
    assert np.allclose(g.kl, 0.0, atol=1e-6)
    assert g.kv_bytes == g.kv_bytes_full and g.ttft_s > 0 and g.stop in ("stop_token", "max_tokens")


def test_speed_holds_less_kv_than_full_for_the_same_tokens(bundled):
    g = bundled.generate(PROMPT, policy="speed:1+bos", max_new_tokens=6, compare="full", progress=False)
    assert g.policy == "speed:1+bos" and g.compare.policy == "full"
    assert len(g.agreement) == max(len(g.ids), len(g.compare.ids))
    assert g.kv_bytes < g.kv_bytes_full
    assert 0 < g.kv_ratio < 1
    assert not np.isnan(g.kl[0])  # step 0 reads the same prompt under both


def test_diagnose_report_layer_table_save_and_load(bundled, tmp_path):
    report = bundled.diagnose(max_new_tokens=4, out=tmp_path / "run", progress=False)
    L = bundled.config.layers
    assert 1 <= report.recommended_l_cut <= L == report.num_layers
    assert set(report.votes) == {"tail_mass", "selective_band", "curvature_plateau"}
    assert len(report.prompts) == len((FIXTURES / "prompts" / "copy.jsonl").read_text().splitlines())
    table = report.layer_table()
    assert list(table.columns) == ["layer", *lcut.LAYER_METRICS]
    assert len(table) == L
    curves = report.curves
    # per-layer series read the layer, per-cut series the cut at the layer,
    # per-hidden-state series the layer's output
    assert np.allclose(table["prefill"], curves["prefill"], equal_nan=True)
    assert np.allclose(table["tail_mass"], curves["tail_mass"][:L], equal_nan=True)
    assert np.allclose(table["curvature_prompt"], curves["curvature_prompt"][1:], equal_nan=True)
    saved = tmp_path / "run" / "report.json"
    assert saved.exists() and not list((tmp_path / "run").glob("*.tmp*"))
    for path in [saved, tmp_path / "run"]:
        again = lcut.Report.load(path)
        assert again.to_dict() == report.to_dict()
    again.save(tmp_path / "copy")
    assert json.loads((tmp_path / "copy" / "report.json").read_text()) == json.loads(saved.read_text())


def test_layer_table_without_pandas_is_a_dict_of_numpy_columns(bundled, monkeypatch):
    report = bundled.diagnose([PROMPT], max_new_tokens=3, progress=False)
    monkeypatch.setitem(__import__("sys").modules, "pandas", None)
    table = report.layer_table()
    assert isinstance(table, dict)
    assert list(table) == ["layer", *lcut.LAYER_METRICS]
    assert all(isinstance(v, np.ndarray) and len(v) == report.num_layers for v in table.values())


def test_the_command_lines_report_reads_and_recommends_the_same(bundled, lcut_bin, tmp_path):
    run_cli(lcut_bin, "diagnose", "--max-new-tokens", 4, "--out", tmp_path)
    cli = lcut.Report.load(tmp_path / "report.json")
    ours = bundled.diagnose(max_new_tokens=4, progress=False)
    assert cli.recommended_l_cut == ours.recommended_l_cut
    assert cli.votes == ours.votes
    assert np.allclose(cli.curves["prefill"], ours.curves["prefill"], atol=1e-6)


def test_a_sweep_adds_the_measured_cutoffs(bundled):
    report = bundled.diagnose([PROMPT], sweep=[1, 2, 4], max_new_tokens=4, progress=False)
    points = report.sweep["points"]
    assert sorted(p["l_cut"] for p in points) == [1, 2, 4]
    full = next(p for p in points if p["l_cut"] == 4)
    assert full["top1_agreement"] == 1.0


def suite_file(tmp_path: pathlib.Path) -> pathlib.Path:
    items = [
        {"id": "copy-a", "kind": "copy", "length": "short", "prompt": PROMPT,
         "answer": "castle eagle horse cake", "scoring": "contains"},
        {"id": "copy-b", "kind": "copy", "length": "short",
         "prompt": "copy : the [ yellow needle tunnel ] in on", "answer": "yellow needle tunnel",
         "scoring": "contains"},
    ]
    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def test_eval_scores_a_suite_as_lcut_eval_does(bundled, lcut_bin, tmp_path):
    suite = suite_file(tmp_path)
    results = bundled.eval(suite, ["full", "speed:2+bos"], max_new_tokens=8, progress=False)
    assert [r["policy"] for r in results] == ["full", "speed:2+bos"]
    full, speed = results
    assert full["n"] == 2 and full["kept_of_full"] == full["full_correct"] == full["correct"]
    assert full["top1_agreement"] == 1.0 and speed["kv_ratio"] < 1.0
    assert 0.0 <= speed["accuracy"] <= 1.0 and len(speed["items"]) == 2
    single = bundled.eval(suite, "speed:2+bos", max_new_tokens=8, progress=False)
    assert isinstance(single, dict) and single["accuracy"] == speed["accuracy"]
    out = tmp_path / "eval.json"
    run_cli(lcut_bin, "eval", "--model", BUNDLED, "--suite", suite, "--policy", "speed:2+bos",
            "--max-new-tokens", 8, "--json", out)
    cli = json.loads(out.read_text())
    for key in ["policy", "dtype", "suite_items", "suite_hash", "max_new_tokens"]:
        assert cli[key] == single[key], key
    strip = lambda items: [{k: v for k, v in i.items() if k != "seconds"} for i in items]
    assert strip(cli["items"]) == strip(single["items"])


@pytest.mark.parametrize(
    "call,kind,message",
    [
        (lambda s: lcut.load(REPO / "no-such-model"), FileNotFoundError, "no-such-model` is not on disk"),
        (lambda s: lcut.load(BUNDLED, dtype="f8"), ValueError, "dtype \"f8\""),
        (lambda s: lcut.load(BUNDLED, device="tpu"), ValueError, "unknown device"),
        (lambda s: lcut.load(BUNDLED, lora=REPO / "no-such-adapter"), FileNotFoundError, "no-such-adapter"),
        (lambda s: s.forward([2, 5], policy="speed:x"), ValueError, "speed:x"),
        (lambda s: s.forward([2, 5], policy="speed:9+bos"), ValueError, "9"),
        (lambda s: s.forward([2, 5000]), ValueError, "token id 5000 at position 1"),
        (lambda s: s.forward([2, -1]), ValueError, "token id -1"),
        (lambda s: s.forward([]), ValueError, "empty"),
        (lambda s: s.forward([2, 5], decode_start=7), ValueError, "decode_start 7 is out of range"),
        (lambda s: s.trace(PROMPT, max_new_tokens=0), ValueError, "at least 1"),
        (lambda s: s.generate(PROMPT, max_new_tokens=0), ValueError, "at least 1"),
        (lambda s: s.trace("   ", progress=False), ValueError, "empty"),
        (lambda s: s.generate("hi " * 600, policy="full", progress=False), ValueError, "positions"),
        (lambda s: s.decode([92]), ValueError, "outside the vocabulary"),
        (lambda s: s.diagnose(REPO / "no-prompts.jsonl"), FileNotFoundError, "no-prompts.jsonl"),
        (lambda s: s.diagnose([{"id": "x"}]), ValueError, "no \"prompt\" key"),
        (lambda s: s.diagnose([PROMPT], sweep=[0]), ValueError, "cutoff 0"),
        (lambda s: s.eval(REPO / "no-suite.jsonl", "full"), FileNotFoundError, "no-suite.jsonl"),
        (lambda s: lcut.Report.load(REPO / "no-report"), FileNotFoundError, "no-report"),
    ],
)
def test_bad_input_raises_a_python_exception_naming_it(bundled, call, kind, message):
    with pytest.raises(kind, match=message) as err:
        call(bundled)
    assert isinstance(err.value, lcut.LcutError)


def test_load_finds_a_model_by_its_hugging_face_cache_name(tmp_path, monkeypatch):
    import shutil

    repo = tmp_path / "hub" / "models--lcut-test--copy-model"
    snapshot = repo / "snapshots" / "0123abcd"
    shutil.copytree(BUNDLED, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    by_name = lcut.load("lcut-test/copy-model")
    by_path = lcut.load(BUNDLED)
    ids = [2, 5, 9, 11]
    assert np.array_equal(by_name.forward(ids).logits, by_path.forward(ids).logits)
    with pytest.raises(FileNotFoundError, match="lcut-test/other"):
        lcut.load("lcut-test/other")


def test_unreadable_files_raise_lcut_errors_naming_the_file(tmp_path):
    bad_model = tmp_path / "model"
    bad_model.mkdir()
    (bad_model / "config.json").write_text('{"model_type": "llama", "hidden_size": "wide"}')
    with pytest.raises(lcut.LcutError, match="config.json") as err:
        lcut.load(bad_model)
    assert not isinstance(err.value, FileNotFoundError)
    bad_report = tmp_path / "report.json"
    bad_report.write_text('{"schema_version": 999}')
    with pytest.raises(lcut.LcutError, match="report.json"):
        lcut.Report.load(bad_report)


def test_a_report_trace_has_no_attention_rows(bundled):
    t = bundled.diagnose([PROMPT], max_new_tokens=2, progress=False).traces[0]
    with pytest.raises(lcut.LcutError, match="Session.trace"):
        t.attention(0, 0)


def test_a_mixture_of_experts_trace_shows_each_steps_routing():
    """Qwen3-MoE (8 experts, 3 a token, every layer sparse): the routing of
    every decode step at every sparse layer, its entropy and each expert's
    load; under SPEED, how far the policy's routing departs from the full
    model's; the same routing in a diagnostic report's trace."""
    case = ORACLE / "moe" / "qwen3moe-sparse"
    cfg = json.loads((case / "config.json").read_text())
    E, k, L = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["num_hidden_layers"]
    session = lcut.load(case / "model.f32.gguf")  # the folder's model, with a tokenizer
    text = "hello world the cat sat on the mat"
    t = session.trace(text, max_new_tokens=5, chat=False, progress=False)
    r = t.routing
    assert isinstance(r, lcut.Routing) and t.sink_mass is None
    assert (r.num_experts, r.top_k, r.layers, r.num_steps) == (E, k, list(range(L)), t.num_steps)
    steps = t.num_steps
    assert r.experts.shape == (L, steps, k) and r.experts.dtype == np.uint32
    assert r.experts.max() < E
    # a step's k experts are distinct
    assert all(len(set(r.experts[l, s])) == k for l in range(L) for s in range(steps))
    assert r.entropy.shape == (L, steps) and np.all((r.entropy >= 0) & (r.entropy <= 1))
    assert r.load.shape == (L, E) and np.allclose(r.load.sum(axis=1), 1.0, atol=1e-6)
    counts = np.stack([np.bincount(r.experts[l].ravel(), minlength=E) for l in range(L)])
    assert np.allclose(r.load, counts / (steps * k), atol=1e-6)
    assert r.overlap is None and r.policy is None
    # under SPEED the policy's routing is set beside the full model's
    cut = session.trace(text, max_new_tokens=5, chat=False, progress=False, policy="speed:2+bos")
    o = cut.routing.overlap
    assert cut.routing.policy == "speed:2+bos"
    assert o.shape == (L, cut.num_steps) and np.all((o >= 0) & (o <= 1))
    # below the cut a decode token reads what the full model's does: the same experts
    assert np.all(o[:2] == 1.0)
    # a diagnostic report's traces hold the same routing, and its summary the load
    report = session.diagnose([text], max_new_tokens=5, chat=False, progress=False)
    assert np.array_equal(report.traces[0].routing.experts, r.experts)
    summary = report.routing
    assert (summary["num_experts"], summary["top_k"], summary["sparse_layers"]) == (E, k, list(range(L)))
    assert summary["tokens"] == steps and np.allclose(summary["load"], r.load, atol=1e-6)
    assert summary["entropy"].shape == (L,) and summary["overlap"] is None


def test_learned_sinks_take_their_share_beside_the_masses():
    """gpt-oss: each head's softmax holds a learned sink (no key); its share
    and the five masses sum to 1 at every layer, head and step."""
    case = ORACLE / "moe" / "gptoss-sinks"
    session = lcut.load(case)
    t = session.trace(list(range(3, 23)), max_new_tokens=4, progress=False)
    L, H = session.config.layers, session.config.heads
    sink = t.sink_mass
    assert sink.shape == (L, H, t.num_steps) and np.all((sink > 0) & (sink < 1))
    total = t.bos_mass + t.anchor_mass + t.prefill_mass + t.decode_mass + t.self_mass + sink
    assert np.allclose(total, 1.0, atol=1e-5)
    assert t.routing is not None and t.routing.num_experts == 4


def test_a_dense_model_has_no_routing_and_no_sinks(bundled):
    t = bundled.trace(PROMPT, max_new_tokens=2, progress=False)
    assert t.routing is None and t.sink_mass is None
    assert bundled.diagnose([PROMPT], max_new_tokens=2, progress=False).routing is None
