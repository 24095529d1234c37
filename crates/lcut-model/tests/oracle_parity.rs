//! Parity with Hugging Face transformers on the reference cases in
//! `fixtures/oracle`: logits, every layer's residual stream, every layer's
//! attention, SPEED-policy logits, KV-cached decoding and greedy decoding.

mod common;

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use lcut_model::probes::{PhaseMassProbe, RecordingProbe};
use lcut_model::{DType, Decoder, Device, LogitRows, Tensor, argmax_rows};
use lcut_parity::{ReferenceCase, ReferencePolicy};
use lcut_policy::{Policy, TokenPhases};

const TOL: f32 = 1e-4;
/// Every reference case: the dense ones, those with experts and the newest
/// layouts (Gemma 4, Qwen3.5), bare and inside their multimodal wrappers.
fn cases() -> impl Iterator<Item = &'static str> {
    lcut_testkit::ORACLE_CASES
        .into_iter()
        .chain(lcut_testkit::MOE_CASES)
        .chain(lcut_testkit::LAYOUT_CASES)
        .chain(lcut_testkit::WRAPPED_CASES)
}

use lcut_testkit::oracle_case as case_dir;

struct Case {
    name: &'static str,
    model: Decoder,
    reference: HashMap<String, Tensor>,
    case: ReferenceCase,
    ids: Vec<u32>,
}

fn load(name: &'static str) -> Result<Case> {
    let case = ReferenceCase::load(&case_dir(name))?;
    Ok(Case {
        name,
        model: case.model(DType::F32, &Device::Cpu)?,
        reference: case.tensors.clone(),
        ids: case.ids.clone(),
        case,
    })
}

fn assert_close(case: &str, what: &str, ours: &Tensor, reference: &Tensor) -> Result<()> {
    let diff = common::max_abs_diff(ours, reference).with_context(|| format!("{case}: {what}"))?;
    ensure!(
        diff <= TOL,
        "{case}: {what} differs from transformers by {diff:e} (> {TOL:e})"
    );
    Ok(())
}

/// Logits, every layer's residual stream and attention, and the embeddings
/// (where unscaled) of a teacher-forced run against transformers'.
fn check_full_depth(c: &Case, label: &str) -> Result<()> {
    let (name, cfg, t) = (c.name, c.model.config(), c.ids.len());
    let mut probe = RecordingProbe::new(cfg.num_layers, cfg.num_heads, cfg.hidden_size, t);
    let logits = c.model.teacher_forced_logits(&c.ids, Some(&mut probe))?;
    assert_close(
        name,
        &format!("{label}logits"),
        &logits,
        &c.reference["logits"],
    )?;
    for l in 0..cfg.num_layers {
        // a linear-attention layer (Qwen3.5) has no attention rows: the
        // reference holds none, and lcut records none
        let linear = cfg
            .linear_attention
            .as_ref()
            .is_some_and(|la| la.is_linear(l));
        ensure!(
            linear != c.reference.contains_key(&format!("attn.{l}")),
            "{name}: layer {l}'s attention rows"
        );
        if linear {
            ensure!(
                probe.attention[l].iter().all(|&x| x == 0.0),
                "{name}: attention rows recorded at linear layer {l}"
            );
        }
        let recorded = [
            (
                format!("layer_out.{l}"),
                &probe.layer_out[l],
                vec![t, cfg.hidden_size],
            ),
            (
                format!("attn.{l}"),
                &probe.attention[l],
                vec![cfg.num_heads, t, t],
            ),
        ];
        for (key, values, shape) in recorded {
            if !c.reference.contains_key(&key) {
                continue;
            }
            let ours = Tensor::from_vec(values.clone(), shape, &Device::Cpu)?;
            assert_close(name, &format!("{label}{key}"), &ours, &c.reference[&key])?;
        }
    }
    // transformers' Gemma-2 reference holds the lookup unscaled; Gemma 3's
    // and Gemma 4's embed_tokens scale, as lcut's embeddings are
    let scaled_reference = matches!(
        cfg.arch,
        lcut_model::Arch::Gemma3 | lcut_model::Arch::Gemma4
    );
    if cfg.embedding_scale.is_none() || scaled_reference {
        let ours = Tensor::from_vec(probe.embeddings.clone(), (t, cfg.hidden_size), &Device::Cpu)?;
        assert_close(
            name,
            &format!("{label}embeddings"),
            &ours,
            &c.reference["embeddings"],
        )?;
    }
    Ok(())
}

/// Teacher-forced logits at full depth and under every reference policy.
fn check_teacher_forced_policies(c: &Case, label: &str) -> Result<()> {
    for pair in c.case.logit_pairs(&c.model)? {
        assert_close(
            c.name,
            &format!("{label}{}", pair.key),
            &pair.ours,
            &pair.reference,
        )?;
    }
    Ok(())
}

#[test]
fn full_depth_matches_transformers() -> Result<()> {
    for name in cases() {
        check_full_depth(&load(name)?, "")?;
    }
    Ok(())
}

#[test]
fn kv_cached_decoding_equals_teacher_forcing() -> Result<()> {
    for name in cases() {
        let c = load(name)?;
        let full = c.model.teacher_forced_logits(&c.ids, None)?;
        let mut seq = c.model.new_full_sequence();
        // a prefill chunk, then token by token
        let s = 28;
        let out = c
            .model
            .forward(&mut seq, &c.ids[..s], LogitRows::All, None)?;
        let prefill = out.logits.context("prefill logits")?;
        assert_close(
            name,
            "chunked prefill logits",
            &prefill,
            &full.narrow(0, 0, s)?,
        )?;
        for (i, &tok) in c.ids.iter().enumerate().skip(s) {
            let out = c.model.forward(&mut seq, &[tok], LogitRows::Last, None)?;
            ensure!(out.positions == vec![i]);
            let row = out.logits.context("decode logits")?;
            assert_close(
                name,
                &format!("decode step at {i}"),
                &row,
                &full.narrow(0, i, 1)?,
            )?;
        }
    }
    Ok(())
}

#[test]
fn greedy_continuation_matches_transformers() -> Result<()> {
    for name in cases() {
        let c = load(name)?;
        let prompt_len = c.reference["greedy_full.prompt_len"].to_vec1::<i64>()?[0] as usize;
        let expected: Vec<u32> = c.reference["greedy_full.tokens"]
            .to_dtype(DType::U32)?
            .to_vec1()?;
        let mut seq = c.model.new_full_sequence();
        let mut next = c.ids[..prompt_len].to_vec();
        let mut produced = Vec::new();
        for _ in 0..expected.len() {
            let out = c.model.forward(&mut seq, &next, LogitRows::Last, None)?;
            let tok = argmax_rows(&out.logits.context("logits")?)?[0];
            produced.push(tok);
            next = vec![tok];
        }
        ensure!(
            produced == expected,
            "{name}: greedy {produced:?} != transformers {expected:?}"
        );
    }
    Ok(())
}

fn policy_of(c: &Case, entry: &ReferencePolicy) -> Result<(Policy, TokenPhases)> {
    Ok(c.case.resolve(entry, c.model.config().num_layers)?)
}

#[test]
fn speed_policies_match_transformers_teacher_forced_and_incremental() -> Result<()> {
    for name in cases() {
        let c = load(name)?;
        check_teacher_forced_policies(&c, "teacher-forced ")?;
        for entry in &c.case.policies {
            let key = entry.key.as_str();
            let (policy, phases) = policy_of(&c, entry)?;
            let s = phases.decode_start();
            let reference = &c.reference[key];

            // incremental: prefill 0..s-1, then s..T-1 one at a time
            let mut seq = c.model.new_sequence(policy, phases)?;
            c.model
                .forward(&mut seq, &c.ids[..s], LogitRows::None, None)?;
            for i in s..c.ids.len() {
                let out = c
                    .model
                    .forward(&mut seq, &c.ids[i..=i], LogitRows::Last, None)?;
                let row = out.logits.context("decode logits")?;
                assert_close(
                    c.name,
                    &format!("{key} incremental at {i}"),
                    &row,
                    &reference.narrow(0, i - s, 1)?,
                )?;
            }
        }
    }
    Ok(())
}

#[test]
fn speed_from_a_reused_full_prefill_matches_transformers() -> Result<()> {
    for name in cases() {
        check_reused_prefill(&load(name)?)?;
    }
    Ok(())
}

/// Every reference policy restricted from one full prefill of the first 28
/// tokens, its rows from there on against transformers'; no layer above a
/// cut keeps a prefill token.
fn check_reused_prefill(c: &Case) -> Result<()> {
    let name = c.name;
    let s = 28;
    let mut full = c.model.new_full_sequence();
    c.model
        .forward(&mut full, &c.ids[..s], LogitRows::None, None)?;
    for entry in &c.case.policies {
        let key = entry.key.as_str();
        let (policy, phases) = policy_of(c, entry)?;
        let mut seq = full.restricted(policy, phases)?;
        let out = c
            .model
            .forward(&mut seq, &c.ids[s..], LogitRows::All, None)?;
        let first = out
            .positions
            .iter()
            .position(|&p| p == s)
            .context("decode rows")?;
        let rows = out
            .logits
            .context("logits")?
            .narrow(0, first, c.ids.len() - s)?;
        assert_close(
            c.name,
            &format!("{key} from reused prefill"),
            &rows,
            &c.reference[key],
        )?;
        // upper layers hold no prefill token
        for (l, cache) in seq.caches().iter().enumerate() {
            let upper = !policy.is_full_depth() && l >= policy.l_cut();
            ensure!(
                !upper
                    || cache
                        .positions()
                        .iter()
                        .all(|&p| p < phases.anchor_len() || p >= s),
                "{name} {key}: layer {l} keeps a prefill token"
            );
        }
    }
    Ok(())
}

/// A chunk attended in blocks of a few query rows (what bounds the scores
/// of a long prompt's prefill) gives transformers' logits, residuals and
/// attention, and a probe that starts mid-block sees the same rows.
#[test]
fn attention_in_query_blocks_matches_transformers() -> Result<()> {
    for name in cases() {
        let mut c = load(name)?;
        let cfg = c.model.config().clone();
        let t = c.ids.len();
        // 5 query rows per block at full length: blocks end mid-chunk and
        // the last one is short.
        c.model.set_attention_block_elems(5 * cfg.num_heads * t);
        check_full_depth(&c, "blocked ")?;
        check_teacher_forced_policies(&c, "blocked ")?;

        // a probe asking from position 27 (inside the sixth block) gets the
        // same masses as from one unblocked chunk
        let phases = TokenPhases::new(t, 27, 1)?;
        let mut blocked = PhaseMassProbe::new(phases);
        c.model.teacher_forced_logits(&c.ids, Some(&mut blocked))?;
        c.model.set_attention_block_elems(usize::MAX);
        let mut whole = PhaseMassProbe::new(phases);
        c.model.teacher_forced_logits(&c.ids, Some(&mut whole))?;
        ensure!(blocked.records.len() == whole.records.len());
        for (a, b) in blocked.records.iter().zip(&whole.records) {
            ensure!((a.layer, a.position) == (b.layer, b.position));
            let diff = a
                .prefill
                .iter()
                .zip(&b.prefill)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            ensure!(
                diff <= 1e-6,
                "{name}: prefill mass at layer {} position {} moved by {diff:e}",
                a.layer,
                a.position
            );
        }
    }
    Ok(())
}

/// Records every routed token's router probabilities and chosen experts,
/// by layer and position.
#[derive(Default)]
struct RoutingRecorder {
    rows: HashMap<(usize, usize), (Vec<f32>, Vec<usize>)>,
}

impl lcut_model::Probe for RoutingRecorder {
    fn wants_routing(&self, _layer: usize) -> bool {
        true
    }

    fn on_routing(&mut self, view: lcut_model::RoutingView<'_>) -> lcut_model::Result<()> {
        let r = view.routing;
        for (row, &p) in view.positions.iter().enumerate() {
            let seen = (r.probs[row].clone(), r.experts[row].clone());
            self.rows.insert((view.layer, p), seen);
        }
        Ok(())
    }
}

/// `recorded`'s routing of positions `from..` at every sparse layer against
/// transformers' (`{prefix}{layer}.probs` and `.experts`, rows from `from`):
/// the router's probabilities within 1e-5 and the same experts, in order.
fn check_routing(
    name: &str,
    what: &str,
    c: &Case,
    recorded: &RoutingRecorder,
    prefix: &str,
    from: usize,
) -> Result<()> {
    let sparse = &c.model.config().sparse_layers;
    for (l, _) in sparse.iter().enumerate().filter(|(_, s)| **s) {
        let probs = c.reference[&format!("{prefix}{l}.probs")].to_vec2::<f32>()?;
        let experts = c.reference[&format!("{prefix}{l}.experts")].to_vec2::<i64>()?;
        for (i, (p_ref, e_ref)) in probs.iter().zip(&experts).enumerate() {
            let pos = from + i;
            let (p, e) = recorded.rows.get(&(l, pos)).with_context(|| {
                format!("{name} {what}: no routing at layer {l}, position {pos}")
            })?;
            let worst = p
                .iter()
                .zip(p_ref)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            ensure!(
                worst <= 1e-5,
                "{name} {what}: layer {l} position {pos}: router probabilities differ by {worst:e}"
            );
            let e_ref: Vec<usize> = e_ref.iter().map(|&x| x as usize).collect();
            ensure!(
                *e == e_ref,
                "{name} {what}: layer {l} position {pos}: experts {e:?}, transformers {e_ref:?}"
            );
        }
    }
    Ok(())
}

/// The router's probabilities and the experts each token runs, at every
/// sparse layer, against transformers': full depth in one chunk, and under
/// every SPEED/SelfOnly policy the decode tokens' routing, run one token at
/// a time after the prompt (what the routing diagnostics record).
#[test]
fn routing_matches_transformers_full_depth_and_under_policies() -> Result<()> {
    for name in lcut_testkit::ROUTED_CASES {
        let c = load(name)?;
        let mut full = RoutingRecorder::default();
        c.model.teacher_forced_logits(&c.ids, Some(&mut full))?;
        check_routing(name, "full depth", &c, &full, "router.", 0)?;
        for entry in &c.case.policies {
            let (policy, phases) = policy_of(&c, entry)?;
            let s = phases.decode_start();
            let mut seq = c.model.new_sequence(policy, phases)?;
            let mut rec = RoutingRecorder::default();
            c.model
                .forward(&mut seq, &c.ids[..s], LogitRows::None, Some(&mut rec))?;
            for i in s..c.ids.len() {
                c.model
                    .forward(&mut seq, &c.ids[i..=i], LogitRows::Last, Some(&mut rec))?;
            }
            let policy_key = entry.key.trim_start_matches("logits.");
            check_routing(
                name,
                &entry.key,
                &c,
                &rec,
                &format!("router.{policy_key}."),
                s,
            )?;
        }
    }
    Ok(())
}

/// The sink's share of each head's attention, as the phase probe reports
/// it for decode-phase queries, is what transformers' attention rows leave
/// out (one less their sum): on gpt-oss the learned sinks' share, on every
/// other case nothing beyond rounding.
#[test]
fn the_sinks_share_matches_transformers() -> Result<()> {
    for name in cases() {
        let c = load(name)?;
        let s = c.case.policies[0].decode_start;
        let mut probe = PhaseMassProbe::new(TokenPhases::new(c.ids.len(), s, 1)?);
        c.model.teacher_forced_logits(&c.ids, Some(&mut probe))?;
        ensure!(!probe.records.is_empty(), "{name}: no records");
        let mut largest = 0f32;
        for r in &probe.records {
            // transformers' rows [heads, T, T] sum to one less the sink's share
            let rows = c.reference[&format!("attn.{}", r.layer)]
                .narrow(1, r.position, 1)?
                .squeeze(1)?
                .sum(1)?
                .to_vec1::<f32>()?;
            for (h, (ours, row)) in r.sink.iter().zip(&rows).enumerate() {
                let theirs = (1.0 - row).max(0.0);
                largest = largest.max(theirs);
                ensure!(
                    (ours - theirs).abs() <= 1e-5,
                    "{name}: layer {} position {} head {h}: sink share {ours}, transformers {theirs}",
                    r.layer,
                    r.position
                );
            }
        }
        if name == "moe/gptoss-sinks" {
            ensure!(largest > 0.05, "{name}: the sinks took at most {largest}");
        }
    }
    Ok(())
}

/// Gemma 4's shared layers (4 and 5 read layers 3 and 2) store no K/V: under
/// SPEED at 4 of 6 the sources, below the cut, keep the whole prompt for
/// their own queries, the readers above the cut hold nothing, and K/V held
/// is what the four storing layers hold. Policies whose meaning on shared
/// K/V is not defined are refused by name.
#[test]
fn gemma4_shared_layers_hold_no_kv_and_undefined_policies_are_refused() -> Result<()> {
    {
        let name = lcut_testkit::GEMMA4_CASE;
        let c = load(name)?;
        let sharing = c.model.kv_sharing();
        ensure!(
            (
                sharing.source(4),
                sharing.source(5),
                sharing.stored_layers()
            ) == (3, 2, 4),
            "{name}: {sharing:?}"
        );
        let entry = c
            .case
            .policies
            .iter()
            .find(|p| p.key == "logits.speed.l4.bos")
            .context("the cut-4 policy")?;
        let (policy, phases) = policy_of(&c, entry)?;
        let mut seq = c.model.new_sequence(policy, phases)?;
        let s = phases.decode_start();
        c.model
            .forward(&mut seq, &c.ids[..s + 4], LogitRows::Last, None)?;
        let caches = seq.caches();
        ensure!(
            caches[4].is_empty() && caches[5].is_empty(),
            "{name}: a shared layer holds K/V"
        );
        // layer 2 (full, below the cut) keeps every token for its own queries
        ensure!(
            caches[2].len() == s + 4,
            "{name}: layer 2 holds {}",
            caches[2].len()
        );
        let stored: u64 = (0..4).map(|l| caches[l].bytes_held() as u64).sum();
        ensure!(
            seq.kv_bytes_held() == stored && stored > 0,
            "{name}: K/V held"
        );
        for text in ["snapkv:0.5", "swiftkv:3", "slim:2@50%", "pop:3+bos"] {
            let p = text.parse::<lcut_policy::PolicySpec>()?.resolve(6)?;
            let phases = TokenPhases::new(c.ids.len(), s, p.anchor_len(None, s)?)?;
            let err = c.model.new_sequence(p, phases).err().context(text)?;
            ensure!(
                err.to_string().contains("share K/V"),
                "{name} {text}: {err}"
            );
        }
        // kept heads (SPEED's rule, which reuses a full prefill) are refused
        // restricted from a full run's prefix too, as the sweep and a K/V
        // budget's check take them, not only as a new sequence
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("heads.json");
        std::fs::write(&file, "[[4, 0]]")?;
        let spec: lcut_policy::PolicySpec =
            format!("speed:4+bos+heads:{}", file.display()).parse()?;
        let heads = spec.resolve(6)?;
        let mut full = c.model.new_full_sequence();
        c.model
            .forward(&mut full, &c.ids[..s], LogitRows::None, None)?;
        let phases = TokenPhases::new(c.ids.len(), s, 1)?;
        let err = full.restricted(heads, phases).err().context("restricted")?;
        ensure!(err.to_string().contains("share K/V"), "{name}: {err}");
        let err = c.model.check_kept_heads("--kv-budget").unwrap_err();
        ensure!(err.to_string().contains("--kv-budget"), "{name}: {err}");
    }
    Ok(())
}

/// The newest layouts in chunks: the prompt in chunks of 5 (so that Gemma
/// 4's sliding layers' window of 12 drops rows between chunks while the
/// shared layers read their sources' caches, and Qwen3.5's linear layers
/// carry their state and convolution inputs across chunks), then the decode
/// phase in chunks of 3, at full depth and under every reference policy,
/// against transformers.
#[test]
fn layouts_in_chunks_match_transformers() -> Result<()> {
    for name in lcut_testkit::LAYOUT_CASES {
        check_in_chunks(&load(name)?, "")?;
    }
    Ok(())
}

/// The prompt in chunks of 5, then the decode phase in chunks of 3, at
/// full depth and under every reference policy, against transformers.
fn check_in_chunks(c: &Case, label: &str) -> Result<()> {
    for entry in &c.case.policies {
        let (policy, phases) = policy_of(c, entry)?;
        let s = phases.decode_start();
        let mut seq = c.model.new_sequence(policy, phases)?;
        for chunk in c.ids[..s].chunks(5) {
            c.model.forward(&mut seq, chunk, LogitRows::None, None)?;
        }
        let mut rows = Vec::new();
        for chunk in c.ids[s..].chunks(3) {
            let out = c.model.forward(&mut seq, chunk, LogitRows::All, None)?;
            rows.push(out.logits.context("decode rows")?);
        }
        let ours = Tensor::cat(&rows, 0)?;
        assert_close(
            c.name,
            &format!("{label}{} in chunks", entry.key),
            &ours,
            &c.reference[&entry.key],
        )?;
    }
    Ok(())
}

/// Qwen3.5's linear layers in transformers' chunked form (the default off
/// the CPU), in chunks of 4, 8 and 64 rows, so that the cases' prompts span
/// one chunk and several: logits, every layer's residual and every
/// reference policy against transformers, teacher-forced, in chunks and
/// restricted from a reused full prefill (whose linear layers keep the
/// first token's state, run by row, before the chunks); and the logits
/// within 1e-5 of the largest of the row-by-row form's.
#[test]
fn qwen35_linear_layers_in_chunked_form_match_transformers() -> Result<()> {
    let qwen35 = [
        lcut_testkit::QWEN35_CASE,
        lcut_testkit::QWEN35MOE_CASE,
        "layouts/qwen35-vision",
    ];
    for name in qwen35 {
        let by_row = load(name)?;
        let reference = by_row.model.teacher_forced_logits(&by_row.ids, None)?;
        let largest = reference.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        for chunk in [4, 8, 64] {
            let mut c = load(name)?;
            c.model.set_linear_chunk(Some(chunk));
            let label = format!("chunks of {chunk}: ");
            check_full_depth(&c, &label)?;
            check_teacher_forced_policies(&c, &label)?;
            check_in_chunks(&c, &label)?;
            check_reused_prefill(&c)?;
            let ours = c.model.teacher_forced_logits(&c.ids, None)?;
            let diff = common::max_abs_diff(&ours, &reference)? / largest;
            ensure!(
                diff <= 1e-5,
                "{name}: {label}logits differ from the row-by-row form's by {diff:e} of the largest"
            );
        }
    }
    Ok(())
}

/// Qwen3.5's linear layers hold no K/V but a state: under SPEED at 5 of 8
/// with BoS, the linear layers below the cut have run every token, those
/// above only BoS and the decode phase (no prompt token entered their
/// state), the full layers hold K/V as on any model. A full run restricted
/// to SPEED keeps BoS's state above the cut; anchors past BoS there are
/// refused by name, as are the policies whose meaning on a recurrence is
/// not defined.
#[test]
fn qwen35_linear_layers_keep_states_only_of_the_tokens_that_run_them() -> Result<()> {
    let c = load(lcut_testkit::QWEN35_CASE)?;
    let recurrent = c.model.recurrent_layers();
    let linear: Vec<usize> = (0..8).filter(|&l| recurrent.is_recurrent(l)).collect();
    ensure!(linear == vec![0, 1, 2, 4, 5, 6], "{linear:?}");
    let entry = c
        .case
        .policies
        .iter()
        .find(|p| p.key == "logits.speed.l5.bos")
        .context("the cut-5 policy")?;
    let (policy, phases) = policy_of(&c, entry)?;
    let s = phases.decode_start();
    let mut seq = c.model.new_sequence(policy, phases)?;
    c.model
        .forward(&mut seq, &c.ids[..s + 4], LogitRows::Last, None)?;
    for &l in &linear {
        let tokens = seq.recurrent_state(l).map(|st| st.tokens());
        let expected = if l < 5 { s + 4 } else { 1 + 4 };
        ensure!(tokens == Some(expected), "layer {l}: {tokens:?}");
        ensure!(seq.caches()[l].is_empty(), "layer {l} holds K/V");
    }
    let caches = seq.caches();
    ensure!(caches[3].len() == s + 4 && caches[7].len() == 1 + 4);
    let kv: u64 = [3, 7].iter().map(|&l| caches[l].bytes_held() as u64).sum();
    ensure!(seq.kv_bytes_held() == kv);
    let state = lcut_model::memory::recurrent_state_bytes(c.model.config());
    ensure!(seq.recurrent_bytes_held() == state && state > 0);
    // the policy's own count equals the cache's
    let layered = c.model.layered_kv_bytes(seq.visibility(), s + 4);
    ensure!(layered == Some(kv), "{layered:?} != {kv}");

    // a full run restricted: BoS's state above the cut; three anchors there
    // are not a state the full run kept
    let mut full = c.model.new_full_sequence();
    c.model
        .forward(&mut full, &c.ids[..s], LogitRows::None, None)?;
    let restricted = full.restricted(policy, phases)?;
    ensure!(restricted.recurrent_state(5).map(|st| st.tokens()) == Some(1));
    ensure!(restricted.recurrent_state(2).map(|st| st.tokens()) == Some(s));
    // the full run keeps each state's first-token copy, SPEED's branch none
    ensure!(full.recurrent_bytes_held() == 2 * state);
    ensure!(restricted.recurrent_bytes_held() == state);
    let prefix = "speed:5+prefix:3"
        .parse::<lcut_policy::PolicySpec>()?
        .resolve(8)?;
    let phases3 = TokenPhases::new(c.ids.len(), s, 3)?;
    let err = full.restricted(prefix, phases3).err().context("prefix:3")?;
    ensure!(
        matches!(err, lcut_model::ModelError::NotRestrictable { .. }),
        "{err}"
    );
    for text in ["snapkv:0.5", "swiftkv:3", "slim:2@50%"] {
        let p = text.parse::<lcut_policy::PolicySpec>()?.resolve(8)?;
        let phases = TokenPhases::new(c.ids.len(), s, p.anchor_len(None, s)?)?;
        let err = c.model.new_sequence(p, phases).err().context(text)?;
        ensure!(err.to_string().contains("recurrent"), "{text}: {err}");
        if p.reuses_full_prefill() {
            let err = full.restricted(p, phases).err().context(text)?;
            ensure!(err.to_string().contains("recurrent"), "{text}: {err}");
        }
    }
    Ok(())
}

/// Knockout bands on Qwen3.5's layers against transformers
/// (`fixtures/oracle/band_reference.py`): the prompt runs a band's linear
/// layers for its own rows, and the decode phase reads there the state of
/// BoS and of itself alone. Teacher-forced in one pass, one token at a time
/// after the prompt (the fused step), restricted from a full prefill (as
/// `diagnose --knockout` runs them) and in the chunked form, with and
/// without experts; and the state a band's linear layer holds after the
/// decode start is BoS's and the decode phase's.
#[test]
fn knockout_bands_on_linear_layers_match_transformers() -> Result<()> {
    for name in [lcut_testkit::QWEN35_CASE, lcut_testkit::QWEN35MOE_CASE] {
        let bands =
            candle_core::safetensors::load(case_dir(name).join("bands.safetensors"), &Device::Cpu)?;
        ensure!(bands.len() == 5, "{name}: {} bands", bands.len());
        for chunk in [None, Some(4)] {
            let mut c = load(name)?;
            c.model.set_linear_chunk(chunk);
            let (t, s) = (c.ids.len(), 28);
            let mut full = c.model.new_full_sequence();
            c.model
                .forward(&mut full, &c.ids[..s], LogitRows::None, None)?;
            for (key, reference) in &bands {
                let mut layers = key.trim_start_matches("logits.band.").split('.');
                let mut layer =
                    || -> Result<usize> { Ok(layers.next().context("layer")?.parse()?) };
                let (first, last) = (layer()?, layer()?);
                let text = match first == last {
                    true => format!("knockout:{first}"),
                    false => format!("band:{first}..{last}"),
                };
                let label = format!("{text} (linear chunk {chunk:?})");
                let policy = text.parse::<lcut_policy::PolicySpec>()?.resolve(8)?;
                let phases = TokenPhases::new(t, s, 1)?;
                let decode_rows = |out: lcut_model::ChunkOutput| -> Result<Tensor> {
                    let at = out.positions.iter().position(|&p| p == s).context("rows")?;
                    Ok(out.logits.context("logits")?.narrow(0, at, t - s)?)
                };

                // teacher-forced in one pass
                let mut seq = c.model.new_sequence(policy, phases)?;
                let out = c.model.forward(&mut seq, &c.ids, LogitRows::All, None)?;
                assert_close(name, &label, &decode_rows(out)?, reference)?;

                // the prompt, then one token at a time
                let mut seq = c.model.new_sequence(policy, phases)?;
                c.model
                    .forward(&mut seq, &c.ids[..s], LogitRows::None, None)?;
                for i in s..t {
                    let out = c
                        .model
                        .forward(&mut seq, &c.ids[i..=i], LogitRows::Last, None)?;
                    let row = out.logits.context("decode logits")?;
                    let at = format!("{label} incremental at {i}");
                    assert_close(name, &at, &row, &reference.narrow(0, i - s, 1)?)?;
                }
                // a band's linear layer holds BoS and the decode phase
                for l in (first..=last).filter(|&l| c.model.recurrent_layers().is_recurrent(l)) {
                    let tokens = seq.recurrent_state(l).map(|st| st.tokens());
                    ensure!(
                        tokens == Some(1 + t - s),
                        "{label}: layer {l} holds {tokens:?}"
                    );
                }

                // restricted from the full prefill
                let mut seq = full.restricted(policy, phases)?;
                let out = c
                    .model
                    .forward(&mut seq, &c.ids[s..], LogitRows::All, None)?;
                let label = format!("{label} from a reused prefill");
                assert_close(name, &label, &decode_rows(out)?, reference)?;
            }
        }
    }
    Ok(())
}

/// Records each linear layer's split outputs from the decode start.
struct SplitProbe {
    from: usize,
    splits: Vec<(usize, lcut_model::LinearSplit)>,
}

impl lcut_model::Probe for SplitProbe {
    fn linear_split_from(&self, _layer: usize) -> Option<usize> {
        Some(self.from)
    }

    fn on_linear_split(
        &mut self,
        layer: usize,
        split: &lcut_model::LinearSplit,
    ) -> lcut_model::Result<()> {
        self.splits.push((layer, split.clone()));
        Ok(())
    }
}

/// The decode phase's outputs of a linear layer split into what the
/// prompt's state contributes and what the decode-phase tokens do: the two
/// sum back to the output within 1e-5, in one chunk and token by token
/// alike; the prompt contributes at full depth, and nothing above an
/// anchor-free SPEED cut (no prompt token entered the state there, and that
/// run is held to transformers by the policy tests).
#[test]
fn qwen35_decode_outputs_split_into_prompt_and_decode_parts() -> Result<()> {
    let c = load(lcut_testkit::QWEN35_CASE)?;
    let s = 28;
    let run =
        |policy: &str, one_at_a_time: bool| -> Result<Vec<(usize, lcut_model::LinearSplit)>> {
            let p = policy.parse::<lcut_policy::PolicySpec>()?.resolve(8)?;
            let phases = TokenPhases::new(c.ids.len(), s, p.anchor_len(None, s)?)?;
            let mut seq = c.model.new_sequence(p, phases)?;
            c.model
                .forward(&mut seq, &c.ids[..s], LogitRows::None, None)?;
            let mut probe = SplitProbe {
                from: s,
                splits: Vec::new(),
            };
            let chunks: Vec<&[u32]> = match one_at_a_time {
                true => c.ids[s..].chunks(1).collect(),
                false => vec![&c.ids[s..]],
            };
            for chunk in chunks {
                c.model
                    .forward(&mut seq, chunk, LogitRows::Last, Some(&mut probe))?;
            }
            Ok(probe.splits)
        };
    let whole = run("full", false)?;
    ensure!(whole.len() == 6, "{} splits", whole.len());
    for (layer, split) in &whole {
        ensure!(split.positions == (s..c.ids.len()).collect::<Vec<_>>());
        for ((p, d), o) in split.prompt.iter().zip(&split.decode).zip(&split.output) {
            ensure!((p + d - o).abs() <= 1e-5, "layer {layer}: {p} + {d} != {o}");
        }
        let shares = split.prompt_shares();
        ensure!(shares.iter().all(|x| (0.0..=1.0).contains(x)));
        ensure!(
            shares.iter().any(|&x| x > 0.01),
            "layer {layer}: {shares:?}"
        );
    }
    // one token at a time: the same parts
    let stepped = run("full", true)?;
    for layer in [0, 1, 2, 4, 5, 6] {
        let parts = |splits: &[(usize, lcut_model::LinearSplit)]| -> (Vec<f32>, Vec<f32>) {
            let (mut p, mut d) = (Vec::new(), Vec::new());
            for (_, x) in splits.iter().filter(|(l, _)| *l == layer) {
                p.extend_from_slice(&x.prompt);
                d.extend_from_slice(&x.decode);
            }
            (p, d)
        };
        let (a, b) = (parts(&whole), parts(&stepped));
        let diff =
            a.0.iter()
                .zip(&b.0)
                .chain(a.1.iter().zip(&b.1))
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
        ensure!(
            a.0.len() == b.0.len() && diff <= 1e-5,
            "layer {layer}: {diff}"
        );
    }
    // above an anchor-free cut at 2 the prompt's state is empty
    for (layer, split) in run("speed:2", false)? {
        let largest = split.prompt.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        match layer >= 2 {
            true => ensure!(largest == 0.0, "layer {layer}: {largest}"),
            false => ensure!(largest > 0.0, "layer {layer}"),
        }
    }
    Ok(())
}

/// The training passes (every row at once under a mask, the linear layers'
/// recurrence in tensor ops) match transformers on Qwen3.5, dense and with
/// experts: every layer's residual under the causal mask, from
/// transformers' embeddings, and each reference policy's decode-phase
/// logits with each layer's rows under the policy's training matrix (above
/// a cut a linear layer's state holds only the rows a later row reads);
/// row by row and in the chunked form (which the rows take where every row
/// enters the state).
#[test]
fn training_passes_match_transformers_on_qwen35() -> Result<()> {
    let chunks = [None, Some(4), Some(64)];
    let cases = [lcut_testkit::QWEN35_CASE, lcut_testkit::QWEN35MOE_CASE];
    for (name, chunk) in cases.into_iter().flat_map(|n| chunks.map(|c| (n, c))) {
        let mut c = load(name)?;
        c.model.set_linear_chunk(chunk);
        let name = format!("{name} (chunks of {chunk:?})");
        let name = name.as_str();
        let (cfg, n) = (c.model.config(), c.ids.len());
        let positions: Vec<usize> = (0..n).collect();
        let causal: Vec<bool> = (0..n * n).map(|i| i % n <= i / n).collect();
        let mut hidden = c.reference["embeddings"].clone();
        for l in 0..cfg.num_layers {
            hidden = c
                .model
                .train_rows(l..l + 1, hidden, None, &positions, &causal)?;
            let key = format!("layer_out.{l}");
            assert_close(
                name,
                &format!("training {key}"),
                &hidden,
                &c.reference[&key],
            )?;
        }
        ensure!(!c.case.policies.is_empty(), "{name}: no reference policies");
        for entry in &c.case.policies {
            let (policy, phases) = policy_of(&c, entry)?;
            let rule = policy.visibility(phases);
            let mut hidden = c.reference["embeddings"].clone();
            for l in 0..cfg.num_layers {
                let visible = lcut_policy::training_matrix(rule.as_ref(), l, None, &positions);
                hidden = c
                    .model
                    .train_rows(l..l + 1, hidden, None, &positions, &visible)?;
            }
            let s = phases.decode_start();
            let logits = c.model.head_logits(&hidden.narrow(0, s, n - s)?)?;
            let key = entry.key.as_str();
            assert_close(name, &format!("training {key}"), &logits, &c.reference[key])?;
        }
    }
    Ok(())
}

/// The training passes match transformers on Gemma 4 (shared K/V, keys as
/// values, per-layer inputs; with experts beside the MLPs; with wider MLPs
/// in the shared layers): the residual after every layer under the causal
/// mask (layers 0..=l in one call, so that a shared layer reads what its
/// source computed in it), from transformers' embeddings and the per-layer
/// inputs lcut makes of them, and each reference policy's decode-phase
/// logits from the batched pass, each layer under the policy's training
/// matrix. A range that starts above a shared layer's source is refused by
/// name, and so are rows without their per-layer inputs.
#[test]
fn training_passes_match_transformers_on_gemma4() -> Result<()> {
    let gemma4 = lcut_testkit::LAYOUT_CASES
        .into_iter()
        .filter(|name| name.contains("gemma4"));
    for name in gemma4 {
        let c = load(name)?;
        let (cfg, n) = (c.model.config(), c.ids.len());
        let positions: Vec<usize> = (0..n).collect();
        let causal: Vec<bool> = (0..n * n).map(|i| i % n <= i / n).collect();
        let embedded = c.reference["embeddings"].clone();
        // the variants without per-layer inputs have none
        let inputs = c.model.train_layer_inputs(&c.ids, &embedded)?;
        let run = |layers: std::ops::Range<usize>, visible: &[bool]| {
            c.model.train_rows(
                layers,
                embedded.clone(),
                inputs.as_ref(),
                &positions,
                visible,
            )
        };
        for l in 0..cfg.num_layers {
            let key = format!("layer_out.{l}");
            assert_close(
                name,
                &format!("training {key}"),
                &run(0..l + 1, &causal)?,
                &c.reference[&key],
            )?;
        }
        ensure!(!c.case.policies.is_empty(), "{name}: no reference policies");
        for entry in &c.case.policies {
            let (policy, phases) = policy_of(&c, entry)?;
            let rule = policy.visibility(phases);
            // the batched pass takes each layer's mask (its window in it), so
            // a shared layer above a cut reads its source's K/V below it in
            // the same call
            let masks = LayerMasks(
                (0..cfg.num_layers)
                    .map(|l| {
                        let window = cfg.sliding_window[l];
                        lcut_policy::training_matrix(rule.as_ref(), l, window, &positions)
                    })
                    .collect(),
            );
            let ids = Tensor::new(c.ids.as_slice(), &Device::Cpu)?.unsqueeze(0)?;
            let hidden = c.model.train_batch(0..cfg.num_layers, &ids, &masks)?;
            let s = phases.decode_start();
            let logits = c.model.head_logits(&hidden.narrow(0, s, n - s)?)?;
            let key = entry.key.as_str();
            assert_close(name, &format!("training {key}"), &logits, &c.reference[key])?;
        }
        let hidden = Tensor::zeros((n, cfg.hidden_size), DType::F32, &Device::Cpu)?;
        if inputs.is_some() {
            let err = c
                .model
                .train_rows(0..1, hidden.clone(), None, &positions, &causal)
                .expect_err("rows without their per-layer inputs");
            ensure!(
                err.to_string().contains("per-layer inputs"),
                "{name}: {err}"
            );
        }
        if let Some(shared) = (0..cfg.num_layers).find(|&l| c.model.kv_sharing().source(l) != l) {
            let err = c
                .model
                .train_rows(
                    shared..shared + 1,
                    hidden,
                    inputs.as_ref(),
                    &positions,
                    &causal,
                )
                .expect_err("a shared layer without its source");
            ensure!(err.to_string().contains("did not run"), "{name}: {err}");
        }
    }
    Ok(())
}

/// One sequence's masks per layer for the batched training pass: softmax
/// over the keys each layer's matrix shows a query.
struct LayerMasks(Vec<Vec<bool>>);

impl lcut_model::BatchSoftmax for LayerMasks {
    fn softmax(&self, layer: usize, scores: &Tensor) -> lcut_model::Result<Tensor> {
        let t = scores.dim(4)?;
        let additive: Vec<f32> = (self.0[layer].iter())
            .map(|&v| if v { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        let mask = Tensor::from_vec(additive, (1, 1, 1, t, t), scores.device())?;
        Ok(candle_nn::ops::softmax_last_dim(
            &scores.broadcast_add(&mask)?,
        )?)
    }

    fn visibility(&self, layer: usize) -> &[bool] {
        &self.0[layer]
    }
}
