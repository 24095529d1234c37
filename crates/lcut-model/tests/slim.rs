//! SlimInfer in the decoder, on every reference architecture: special
//! cases that must equal SPEED and the full model, a pruned run against a
//! teacher-forced full run masked to the selection it made, the selection's
//! independence of chunk sizes, existence and bytes.

use std::collections::HashMap;

mod common;

use anyhow::{Result, ensure};
use lcut_model::probes::StatePositionsProbe;
use lcut_model::{DType, Device, LogitRows, Sequence, Tensor};
use lcut_parity::ReferenceCase;
use lcut_policy::window::in_window;
use lcut_policy::{Policy, PolicySpec, TokenPhases};
use lcut_testkit::oracle_case;

use common::{OracleModel as Case, oracle_models as cases};

fn policy(text: &str, layers: usize) -> Result<Policy> {
    Ok(text.parse::<PolicySpec>()?.resolve(layers)?)
}

/// The real incremental path: prompt tokens before the decode start in
/// chunks of `chunk`, then every later token one at a time; logits of the
/// rows from the decode start on [T - s, vocab].
fn incremental(c: &Case, policy: Policy, chunk: usize) -> Result<(Tensor, Sequence)> {
    let s = c.decode_start;
    let anchors = policy.anchor_len(None, s)?;
    let phases = TokenPhases::new(c.ids.len(), s, anchors)?;
    let mut seq = c.model.new_sequence(policy, phases)?;
    seq.reserve(c.ids.len());
    for start in (0..s).step_by(chunk) {
        let end = (start + chunk).min(s);
        c.model
            .forward(&mut seq, &c.ids[start..end], LogitRows::None, None)?;
    }
    let mut rows = Vec::new();
    for i in s..c.ids.len() {
        let out = c
            .model
            .forward(&mut seq, &c.ids[i..=i], LogitRows::Last, None)?;
        rows.push(out.logits.expect("a decode-phase row"));
    }
    Ok((Tensor::cat(&rows, 0)?, seq))
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

/// Two runs give the same logits (1e-5) and hold the same K/V bytes.
fn ensure_same_run(
    what: &str,
    (a, sa): &(Tensor, Sequence),
    (b, sb): &(Tensor, Sequence),
) -> Result<()> {
    let d = max_diff(a, b)?;
    ensure!(d <= 1e-5, "{what}: logits differ by {d:e}");
    ensure!(
        sa.kv_bytes_held() == sb.kv_bytes_held(),
        "{what}: {} bytes held against {}",
        sa.kv_bytes_held(),
        sb.kv_bytes_held()
    );
    Ok(())
}

#[test]
fn speed_is_the_special_case_of_one_kept_sink_and_nothing_else() -> Result<()> {
    for c in cases()? {
        let layers = c.model.config().num_layers;
        for cut in 1..layers {
            for (slim, speed) in [
                (
                    format!("slim:{cut}@1+block:1+unit:1"),
                    format!("speed:{cut}+bos"),
                ),
                (
                    format!("slim:{cut}@1+block:1+unit:1+swap:0"),
                    format!("speed:{cut}+bos"),
                ),
                (
                    format!("slim:{cut}@16+block:16+unit:4"),
                    format!("speed:{cut}+prefix:16"),
                ),
                (
                    format!("slim:{cut}@16+block:16+unit:4+swap:1"),
                    format!("speed:{cut}+prefix:16"),
                ),
            ] {
                let a = incremental(&c, policy(&slim, layers)?, 7)?;
                let b = incremental(&c, policy(&speed, layers)?, 7)?;
                ensure_same_run(&format!("{}: {slim} vs {speed}", c.name), &a, &b)?;
            }
        }
    }
    Ok(())
}

#[test]
fn budgets_that_cover_the_prompt_are_the_full_model() -> Result<()> {
    for c in cases()? {
        let layers = c.model.config().num_layers;
        let full = incremental(&c, Policy::full(layers), 5)?;
        for text in [
            "slim:1@100%+block:4+unit:2",
            "slim:paper",
            "slim:1/3@100%,2/3@100%+block:8",
            // a prompt shorter than the sink: all of it is the sink
            "slim:1@10%",
        ] {
            let run = incremental(&c, policy(text, layers)?, 5)?;
            ensure_same_run(&format!("{}: {text} vs full", c.name), &run, &full)?;
        }
    }
    Ok(())
}

/// The visibility a pruned run had, as a rule for a full-depth run: at a
/// layer at or above cut i, Prefill-phase keys only in the kept blocks
/// S_i, and for a decode step's query only in its active blocks A_t ∩ S_i.
fn selection_rule(seq: &Sequence) -> impl Fn(usize, usize, usize) -> bool + Send + Sync + 'static {
    let run = seq.slim().expect("a SlimInfer run");
    let params = *run.selection().params();
    let (s, sink) = (seq.phases().decode_start(), seq.phases().anchor_len());
    let kept = kept_sets(seq);
    let active: HashMap<usize, Vec<Vec<usize>>> = run
        .steps()
        .iter()
        .map(|st| {
            (
                st.position,
                st.cuts.iter().map(|t| t.active.clone()).collect(),
            )
        })
        .collect();
    move |layer, q, k| {
        let seg = params.segment(layer);
        if seg == 0 || k < sink || k >= s {
            return true;
        }
        let b = k / params.options.block;
        match active.get(&q) {
            Some(sets) => sets[seg - 1].contains(&b),
            None => kept[seg - 1].contains(&b),
        }
    }
}

#[test]
fn a_pruned_run_equals_a_full_run_masked_to_its_selection() -> Result<()> {
    let (mut runs, mut changed, mut swaps) = (0, 0, 0);
    for c in cases()? {
        let layers = c.model.config().num_layers;
        let s = c.decode_start;
        for text in [
            "slim:1/3@50%,2/3@25%+block:4+unit:2",
            "slim:1/3@50%,2/3@25%+block:4+unit:2+swap:0",
            "slim:1/3@50%,2/3@25%+block:4+unit:2+swap:1+window:1",
            "slim:1/2@40%+block:4+unit:1+score:avg+swap:1",
            "slim:1/2@40%+block:4+unit:4+score:max+sink:0+swap:1",
        ] {
            let (rows, seq) = incremental(&c, policy(text, layers)?, 6)?;
            let run = seq.slim().expect("slim");
            ensure!(run.is_decided(), "{}: {text} never decided", c.name);
            let pruned = run.cut_records()[0].kept.len() < run.selection().prunable_blocks().len();
            ensure!(pruned, "{}: {text} pruned nothing", c.name);
            let reference = c
                .model
                .teacher_forced_masked(&c.ids, selection_rule(&seq))?;
            let reference = reference.narrow(0, s, c.ids.len() - s)?;
            let d = max_diff(&rows, &reference)?;
            ensure!(d <= 1e-4, "{}: {text}: pruned vs masked {d:e}", c.name);
            swaps += run
                .steps()
                .iter()
                .flat_map(|st| &st.cuts)
                .filter(|t| t.swapped)
                .count();
            let full = c.model.teacher_forced_logits(&c.ids, None)?;
            let full = full.narrow(0, s, c.ids.len() - s)?;
            changed += usize::from(max_diff(&rows, &full)? > 1e-3);
            runs += 1;
        }
    }
    // the check has teeth: pruning changed the logits, and decode steps swapped
    eprintln!("{runs} runs: {changed} changed the logits, {swaps} swaps");
    ensure!(
        changed == runs,
        "only {changed} of {runs} pruned runs differ from full"
    );
    ensure!(swaps > 0, "no decode step swapped blocks");
    Ok(())
}

/// The blocks the prefill kept at each cut.
fn kept_sets(seq: &Sequence) -> Vec<Vec<usize>> {
    let run = seq.slim().expect("a SlimInfer run");
    run.cut_records().iter().map(|r| r.kept.clone()).collect()
}

#[test]
fn the_selection_and_logits_do_not_depend_on_chunk_or_attention_block_sizes() -> Result<()> {
    let text = "slim:1/3@50%,2/3@25%+block:4+unit:2";
    for mut c in cases()? {
        let layers = c.model.config().num_layers;
        let (base, seq) = incremental(&c, policy(text, layers)?, c.decode_start)?;
        let kept = kept_sets(&seq);
        for (chunk, block_elems) in [(1, usize::MAX), (5, 64), (11, 1)] {
            c.model.set_attention_block_elems(block_elems);
            let (rows, seq) = incremental(&c, policy(text, layers)?, chunk)?;
            let other = kept_sets(&seq);
            ensure!(
                other == kept,
                "{}: chunk {chunk}: {other:?} vs {kept:?}",
                c.name
            );
            let d = max_diff(&rows, &base)?;
            ensure!(d <= 1e-5, "{}: chunk {chunk}: {d:e}", c.name);
        }
    }
    Ok(())
}

#[test]
fn pruned_tokens_have_no_state_and_no_kv_above_their_cut_and_bytes_follow_the_formula() -> Result<()>
{
    for c in cases()? {
        let cfg = c.model.config();
        let layers = cfg.num_layers;
        let text = "slim:1/3@50%,2/3@25%+block:4+unit:2+swap:0.5";
        let p = policy(text, layers)?;
        let s = c.decode_start;
        let phases = TokenPhases::new(c.ids.len(), s, p.anchor_len(None, s)?)?;
        let mut seq = c.model.new_sequence(p, phases)?;
        seq.reserve(c.ids.len());
        let mut seen = StatePositionsProbe::new(layers);
        c.model
            .forward(&mut seq, &c.ids[..s], LogitRows::None, Some(&mut seen))?;
        for i in s..c.ids.len() {
            c.model
                .forward(&mut seq, &c.ids[i..=i], LogitRows::Last, Some(&mut seen))?;
        }
        let run = seq.slim().unwrap();
        let sel = run.selection();
        let params = *sel.params();
        let b = cfg.kv_shape(DType::F32).bytes_per_token_layer();
        for l in 0..layers {
            let seg = params.segment(l);
            let expected: Vec<usize> = (0..c.ids.len())
                .filter(|&pos| {
                    seg == 0
                        || pos < phases.anchor_len()
                        || pos >= s
                        || sel
                            .kept_blocks(seg - 1)
                            .contains(&(pos / params.options.block))
                })
                .collect();
            // a windowed layer holds only its window's rows
            let window = cfg.sliding_window[l];
            let held: Vec<usize> = expected
                .iter()
                .copied()
                .filter(|&pos| in_window(window, c.ids.len(), pos))
                .collect();
            ensure!(
                seq.caches()[l].positions() == held.as_slice(),
                "{}: layer {l} caches {:?}",
                c.name,
                seq.caches()[l].positions()
            );
            let states = seen.sorted(l);
            ensure!(
                states == expected,
                "{}: layer {l} computed states at {states:?}",
                c.name
            );
            if seg > 0 {
                let whole_prompt = b * c.ids.len();
                ensure!(
                    seq.caches()[l].bytes_allocated() < whole_prompt,
                    "{}: layer {l} buffer sized for the prompt",
                    c.name
                );
            }
        }
        let decode = c.ids.len() - s;
        let kv = cfg.num_kv_heads;
        let rows =
            seq.visibility()
                .accounting()
                .held_head_rows_windowed(decode, kv, &cfg.sliding_window);
        ensure!(
            seq.kv_bytes_held() == (rows * b / kv) as u64,
            "{}: held bytes",
            c.name
        );
        if cfg.sliding_window.iter().all(Option::is_none) {
            ensure!(
                rows == sel.held_token_layers(decode) * kv,
                "{}: rows",
                c.name
            );
        }
        for step in run.steps() {
            ensure!(
                step.resident_token_layers <= step.held_token_layers,
                "{}: resident > held",
                c.name
            );
            ensure!(step.cuts.len() == params.cuts().len());
        }
        ensure!(
            run.steps().len() == decode - 1,
            "{}: {} steps recorded",
            c.name,
            run.steps().len()
        );
    }
    Ok(())
}

#[test]
fn a_zero_swap_threshold_never_moves_the_active_blocks() -> Result<()> {
    for c in cases()? {
        let layers = c.model.config().num_layers;
        let (_, seq) = incremental(
            &c,
            policy("slim:1/3@50%,2/3@25%+block:4+unit:2+swap:0", layers)?,
            4,
        )?;
        let run = seq.slim().unwrap();
        for step in run.steps() {
            ensure!(
                step.cuts
                    .iter()
                    .all(|t| !t.swapped && t.fetched_token_layers == 0)
            );
            ensure!(step.resident_token_layers == step.held_token_layers);
        }
    }
    Ok(())
}

/// Queries or keys of one token at one layer, recomputed by hand from the
/// residual stream entering the layer and the stored weights: RMSNorm,
/// the projection, half-split RoPE at the token's position.
fn project(
    weights: &HashMap<String, Tensor>,
    layer: usize,
    which: &str,
    x: &[f32],
    pos: usize,
    head_dim: usize,
) -> Result<Vec<f32>> {
    let norm: Vec<f32> =
        weights[&format!("model.layers.{layer}.input_layernorm.weight")].to_vec1()?;
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + 1e-6).sqrt();
    let xn: Vec<f32> = x.iter().zip(&norm).map(|(v, w)| v / rms * w).collect();
    let w: Vec<Vec<f32>> =
        weights[&format!("model.layers.{layer}.self_attn.{which}_proj.weight")].to_vec2()?;
    let mut out: Vec<f32> = w
        .iter()
        .map(|row| row.iter().zip(&xn).map(|(a, b)| a * b).sum())
        .collect();
    let half = head_dim / 2;
    for head in out.chunks_mut(head_dim) {
        let orig = head.to_vec();
        for i in 0..half {
            let angle = pos as f64 * 10000f64.powf(-(2.0 * i as f64) / head_dim as f64);
            let (sin, cos) = (angle.sin() as f32, angle.cos() as f32);
            head[i] = orig[i] * cos - orig[i + half] * sin;
            head[i + half] = orig[i + half] * cos + orig[i] * sin;
        }
    }
    Ok(out)
}

#[test]
fn recorded_block_scores_equal_a_recomputation_from_the_weights() -> Result<()> {
    // llama-gqa: 4 query heads of 16 share 2 KV heads; cut at layer 3, so the
    // decision is read at layer 2 from the residual entering it
    let dir = oracle_case("llama-gqa");
    let case = ReferenceCase::load(&dir)?;
    let c = Case {
        name: "llama-gqa",
        model: case.model(DType::F32, &Device::Cpu)?,
        decode_start: case.policies[0].decode_start,
        ids: case.ids.clone(),
    };
    let weights = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)?;
    let (heads, hd) = (4, 16);
    let mut probe = lcut_model::probes::RecordingProbe::new(6, 0, 64, c.ids.len());
    c.model.teacher_forced_logits(&c.ids, Some(&mut probe))?;
    let x = |pos: usize| probe.layer_out[1][pos * 64..(pos + 1) * 64].to_vec();
    for (text, window, mode) in [
        ("slim:3@50%+block:4+unit:2+window:1", 1, "unit"),
        ("slim:3@50%+block:4+unit:2+window:3", 3, "unit"),
        ("slim:3@50%+block:4+unit:2+window:2+score:avg", 2, "avg"),
    ] {
        let (_, seq) = incremental(&c, policy(text, 6)?, 9)?;
        let record = &seq.slim().unwrap().cut_records()[0];
        let s = c.decode_start;
        // the decision is taken when the decode start arrives: the window is
        // the decode-start token and the tokens before it
        let mut q = vec![0f32; heads * hd];
        for pos in s + 1 - window..=s {
            for (a, v) in q
                .iter_mut()
                .zip(project(&weights, 2, "q", &x(pos), pos, hd)?)
            {
                *a += v / window as f32;
            }
        }
        let keys: Vec<Vec<f32>> = (0..s)
            .map(|pos| project(&weights, 2, "k", &x(pos), pos, hd))
            .collect::<Result<_>>()?;
        for &(block, score) in &record.scores {
            let positions: Vec<usize> = (block * 4..(block * 4 + 4).min(s)).collect();
            let groups: Vec<Vec<usize>> = match mode {
                "unit" => positions.chunks(2).map(<[usize]>::to_vec).collect(),
                _ => vec![positions.clone()],
            };
            let expected = groups
                .iter()
                .map(|g| {
                    (0..heads)
                        .map(|h| {
                            let kv = h / 2;
                            (0..hd)
                                .map(|d| {
                                    let k: f32 =
                                        g.iter().map(|&p| keys[p][kv * hd + d]).sum::<f32>()
                                            / g.len() as f32;
                                    q[h * hd + d] * k
                                })
                                .sum::<f32>()
                                .abs()
                        })
                        .sum::<f32>()
                        / heads as f32
                })
                .fold(f32::NEG_INFINITY, f32::max);
            ensure!(
                (score - expected).abs() <= 1e-4 * expected.abs().max(1.0),
                "{text}: block {block} scored {score}, recomputed {expected}"
            );
        }
        ensure!(
            record.scores.len() == (s - 4).div_ceil(4),
            "{text}: every prunable block scored"
        );
    }
    Ok(())
}

#[test]
fn only_a_full_depth_prefill_is_reused_under_another_policy() -> Result<()> {
    let c = cases()?.remove(0);
    let layers = c.model.config().num_layers;
    let s = c.decode_start;
    let speed = policy("speed:2+bos", layers)?;
    let phases = TokenPhases::new(c.ids.len(), s, 1)?;
    let mut seq = c.model.new_sequence(speed, phases)?;
    c.model
        .forward(&mut seq, &c.ids[..s], LogitRows::None, None)?;
    let err = seq
        .restricted(policy("speed:3+bos", layers)?, phases)
        .unwrap_err();
    ensure!(
        matches!(err, lcut_model::ModelError::NotFullDepthPrefix { .. }),
        "{err}"
    );
    ensure!(err.to_string().contains("speed:2+bos"), "{err}");
    let mut full = c.model.new_full_sequence();
    c.model
        .forward(&mut full, &c.ids[..s], LogitRows::None, None)?;
    let slim = policy("slim:2@50%+block:4", layers)?;
    let err = full.restricted(slim, phases).unwrap_err();
    ensure!(
        matches!(err, lcut_model::ModelError::NotRestrictable { .. }),
        "{err}"
    );
    ensure!(full.restricted(speed, phases).is_ok());
    Ok(())
}

/// One full-depth prompt run serves SlimInfer: below its first cut the
/// policy runs the prompt as the full model does, so `Decoder::staged_from`
/// takes those layers' K/V, the states waiting at the cut and the queries
/// the first stage reads from the full run's record. The selection, the
/// decode-phase logits and the K/V held are the policy's own run's, bit
/// for bit, from a prompt run in one chunk and in chunks. A model whose
/// layers below the cut slide is refused by name (the full run dropped
/// keys there that the first stage decides from).
#[test]
fn a_full_prefill_serves_slim_as_its_own_prefill_does() -> Result<()> {
    for c in cases()? {
        let layers = c.model.config().num_layers;
        let s = c.decode_start;
        for text in [
            "slim:1/3@50%,2/3@25%+block:4+unit:2",
            "slim:2@50%+block:4+window:3",
        ] {
            let policy = policy(text, layers)?;
            let params = policy.slim().expect("a SlimInfer policy");
            let first = params.cuts()[0];
            let phases = TokenPhases::new(c.ids.len(), s, policy.anchor_len(None, s)?)?;
            for chunk in [s, 5] {
                let record = lcut_model::probes::PromptRecord::entering([first])
                    .and_queries([(first - 1, params.options.window + 2)]);
                let mut record = record;
                let mut full = c.model.new_full_sequence();
                for start in (0..s).step_by(chunk) {
                    let end = (start + chunk).min(s);
                    c.model.forward(
                        &mut full,
                        &c.ids[start..end],
                        LogitRows::None,
                        Some(&mut record),
                    )?;
                }
                if c.model.slides_below(first) {
                    let err = c
                        .model
                        .staged_from(&full, policy, phases, &record)
                        .unwrap_err();
                    ensure!(
                        matches!(err, lcut_model::ModelError::NotRestrictable { .. }),
                        "{}: {err}",
                        c.name
                    );
                    continue;
                }
                let mut seq = c.model.staged_from(&full, policy, phases, &record)?;
                let mut rows = Vec::new();
                for i in s..c.ids.len() {
                    let out = c
                        .model
                        .forward(&mut seq, &c.ids[i..=i], LogitRows::Last, None)?;
                    rows.push(out.logits.expect("a decode-phase row"));
                }
                let rows = Tensor::cat(&rows, 0)?;
                let (own, own_seq) = incremental(&c, policy, chunk)?;
                let what = format!("{} {text} (chunks of {chunk})", c.name);
                ensure!(
                    kept_sets(&seq) == kept_sets(&own_seq),
                    "{what}: another selection"
                );
                let d = max_diff(&rows, &own)?;
                ensure!(d == 0.0, "{what}: logits {d:e} from its own run");
                ensure!(
                    seq.kv_bytes_held() == own_seq.kv_bytes_held(),
                    "{what}: {} bytes held against {}",
                    seq.kv_bytes_held(),
                    own_seq.kv_bytes_held()
                );
            }
        }
    }
    Ok(())
}

/// SlimInfer's first stage reads the latest queries below its cut: a
/// record without them, or without the states entering the cut, is
/// refused by name.
#[test]
fn a_record_without_what_slim_reads_is_refused() -> Result<()> {
    let c = cases()?.remove(0);
    let layers = c.model.config().num_layers;
    let s = c.decode_start;
    let policy = policy("slim:2@50%+block:4", layers)?;
    let phases = TokenPhases::new(c.ids.len(), s, policy.anchor_len(None, s)?)?;
    for record in [
        lcut_model::probes::PromptRecord::entering([2]),
        lcut_model::probes::PromptRecord::entering([3]).and_queries([(1, 64)]),
    ] {
        let mut record = record;
        let mut full = c.model.new_full_sequence();
        c.model
            .forward(&mut full, &c.ids[..s], LogitRows::None, Some(&mut record))?;
        let err = c
            .model
            .staged_from(&full, policy, phases, &record)
            .unwrap_err();
        ensure!(
            matches!(err, lcut_model::ModelError::UnrecordedPrompt { .. }),
            "{err}"
        );
    }
    Ok(())
}
