//! Projected prompt K/V (`swiftkv:C`, `pop:C`) against Hugging Face
//! transformers on the reference cases: `swiftkv.safetensors` in each
//! case folder holds the logits of rows s..T-1 that transformers gives when
//! the upper layers' prompt K/V are projected from the hidden state that
//! leaves layer C-1 (`fixtures/oracle/swiftkv_reference.py`). lcut must give
//! them in one chunk, in chunks that cross the decode start and one token at
//! a time, hold the full model's K/V, equal the full model at C = L, and
//! keep an adapter's K/V projections when it runs one on the fly.

use std::collections::HashMap;

mod common;

use anyhow::{Result, ensure};
use lcut_model::lora::LoraMode;
use lcut_model::{DType, Decoder, Device, LogitRows, Sequence, Tensor};
use lcut_policy::window::in_window;
use lcut_policy::{Policy, PolicySpec, TokenPhases};
use lcut_testkit::{ORACLE_CASES, oracle_case};

const TOL: f32 = 1e-4;
const CUTS: [usize; 2] = [2, 4];

/// One reference case: the model, its sequence, the decode start and
/// transformers' rows by key.
struct Case {
    name: &'static str,
    model: Decoder,
    ids: Vec<u32>,
    s: usize,
    reference: HashMap<String, Tensor>,
}

fn load(name: &'static str) -> Result<Case> {
    let dir = oracle_case(name);
    let reference = candle_core::safetensors::load(dir.join("swiftkv.safetensors"), &Device::Cpu)?;
    let ids: Vec<u32> = reference["input_ids"].to_dtype(DType::U32)?.to_vec1()?;
    let s = reference["decode_start"].to_vec1::<i64>()?[0] as usize;
    let full = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let full_ids: Vec<u32> = full["input_ids"].to_dtype(DType::U32)?.to_vec1()?;
    ensure!(ids == full_ids, "{name}: swiftkv.safetensors has other ids");
    Ok(Case {
        name,
        model: Decoder::load(&dir, DType::F32, &Device::Cpu)?,
        ids,
        s,
        reference,
    })
}

/// The written policy (both names, the anchor or none) and its reference key.
fn policies(cut: usize) -> [(String, String); 2] {
    [
        (
            format!("swiftkv:{cut}+bos"),
            format!("logits.swiftkv.c{cut}.bos"),
        ),
        (
            format!("pop:{cut}"),
            format!("logits.swiftkv.c{cut}.noanchor"),
        ),
    ]
}

fn resolve(c: &Case, text: &str) -> Result<(Policy, TokenPhases)> {
    let policy = text
        .parse::<PolicySpec>()?
        .resolve(c.model.config().num_layers)?;
    let anchors = policy.anchor_len(None, c.s)?;
    Ok((policy, TokenPhases::new(c.ids.len(), c.s, anchors)?))
}

/// Feed the sequence in `chunks` (ends of each chunk) and return the rows
/// of positions s..T-1, with the sequence.
fn decode_rows(c: &Case, text: &str, ends: &[usize]) -> Result<(Tensor, Sequence)> {
    let (policy, phases) = resolve(c, text)?;
    let mut seq = c.model.new_sequence(policy, phases)?;
    let mut rows = Vec::new();
    let mut start = 0;
    for &end in ends {
        let out = c
            .model
            .forward(&mut seq, &c.ids[start..end], LogitRows::All, None)?;
        if let Some(logits) = out.logits {
            for (i, &p) in out.positions.iter().enumerate() {
                if p >= c.s {
                    rows.push(logits.narrow(0, i, 1)?);
                }
            }
        }
        start = end;
    }
    ensure!(
        rows.len() == c.ids.len() - c.s,
        "{text}: {} rows",
        rows.len()
    );
    Ok((Tensor::cat(&rows, 0)?, seq))
}

/// One chunk; chunks whose ends fall before, across and after the decode
/// start (a chunk holding the anchor, prompt tokens and decode-phase tokens
/// appends them to the upper caches in position order); the prompt then one
/// token at a time.
fn schedules(c: &Case) -> Vec<(&'static str, Vec<usize>)> {
    let t = c.ids.len();
    vec![
        ("one chunk", vec![t]),
        ("chunked", vec![5, 17, c.s + 3, t]),
        ("incremental", (c.s..=t).collect()),
    ]
}

#[test]
fn projected_kv_matches_transformers_in_one_chunk_in_chunks_and_incrementally() -> Result<()> {
    let mut worst = 0f32;
    for name in ORACLE_CASES {
        let c = load(name)?;
        let t = c.ids.len();
        let (_, full_seq) = decode_rows(&c, "full", &[t])?;
        for cut in CUTS {
            for (text, key) in policies(cut) {
                let reference = &c.reference[&key];
                for (how, ends) in schedules(&c) {
                    let (ours, seq) = decode_rows(&c, &text, &ends)?;
                    let d = common::max_abs_diff(&ours, reference)?;
                    worst = worst.max(d);
                    ensure!(d <= TOL, "{name} {text} ({how}): {d:e} from transformers");
                    // every layer keeps every token's K/V (inside its
                    // window): what the full model holds
                    ensure!(
                        seq.kv_bytes_held() == full_seq.kv_bytes_held(),
                        "{name} {text} ({how}): {} bytes held, full {}",
                        seq.kv_bytes_held(),
                        full_seq.kv_bytes_held()
                    );
                    let windows = &c.model.config().sliding_window;
                    for (cache, w) in seq.caches().iter().zip(windows) {
                        let held = (0..t).filter(|&p| in_window(*w, t, p));
                        ensure!(cache.positions().iter().copied().eq(held), "{name} {text}");
                    }
                }
            }
        }
    }
    eprintln!("largest |logit difference| against transformers: {worst:e}");
    Ok(())
}

/// The check has teeth: the policy moves the logits away from the full
/// model and from SPEED at the same cut (which drops the prompt above it).
#[test]
fn projected_kv_is_neither_the_full_model_nor_speed() -> Result<()> {
    for name in ORACLE_CASES {
        let c = load(name)?;
        let t = c.ids.len();
        let (full, _) = decode_rows(&c, "full", &[t])?;
        for cut in CUTS {
            let (ours, _) = decode_rows(&c, &format!("swiftkv:{cut}+bos"), &[t])?;
            let (speed, _) = decode_rows(&c, &format!("speed:{cut}+bos"), &[t])?;
            let (to_full, to_speed) = (
                common::max_abs_diff(&ours, &full)?,
                common::max_abs_diff(&ours, &speed)?,
            );
            ensure!(to_full > 1e-3, "{name} cut {cut}: {to_full:e} from full");
            ensure!(to_speed > 1e-3, "{name} cut {cut}: {to_speed:e} from SPEED");
        }
    }
    Ok(())
}

#[test]
fn a_cut_at_depth_is_the_full_model_exactly() -> Result<()> {
    for name in ORACLE_CASES {
        let c = load(name)?;
        let (t, l) = (c.ids.len(), c.model.config().num_layers);
        let full = c
            .model
            .teacher_forced_logits(&c.ids, None)?
            .narrow(0, c.s, t - c.s)?;
        for text in [format!("swiftkv:{l}+bos"), format!("pop:{l}")] {
            for (how, ends) in schedules(&c) {
                let (ours, _) = decode_rows(&c, &text, &ends)?;
                let d = common::max_abs_diff(&ours, &full)?;
                // one chunk runs the very operations of the full model
                let tol = if how == "one chunk" { 0.0 } else { TOL };
                ensure!(d <= tol, "{name} {text} ({how}): {d:e} from full");
            }
        }
    }
    Ok(())
}

/// An adapter put in on the fly gives the projected K/V of its adapted
/// K/V projections: the same logits as the adapter merged into the
/// weights, and not the base model's. The peft adapter of
/// `fixtures/oracle/lora` adapts layers 1 and 4 of llama-gqa, so at C = 2
/// layer 4's projected prompt K/V go through its adapter.
#[test]
fn an_adapter_on_the_fly_projects_with_its_adapted_weights() -> Result<()> {
    let adapter = lcut_testkit::workspace_root().join("fixtures/oracle/lora/adapter");
    let base = load("llama-gqa")?;
    let with = |mode: LoraMode| -> Result<Case> {
        let model = base.model.clone().with_lora(&adapter, mode)?;
        Ok(Case {
            model,
            name: base.name,
            ids: base.ids.clone(),
            s: base.s,
            reference: HashMap::new(),
        })
    };
    let (fly, merged) = (with(LoraMode::OnTheFly)?, with(LoraMode::Merge)?);
    for (how, ends) in schedules(&base) {
        let (a, _) = decode_rows(&fly, "swiftkv:2", &ends)?;
        let (b, _) = decode_rows(&merged, "swiftkv:2", &ends)?;
        let (plain, _) = decode_rows(&base, "swiftkv:2", &ends)?;
        let d = common::max_abs_diff(&a, &b)?;
        ensure!(d <= TOL, "{how}: on the fly {d:e} from merged");
        let moved = common::max_abs_diff(&a, &plain)?;
        ensure!(
            moved > 1e-3,
            "{how}: the adapter changed nothing ({moved:e})"
        );
    }
    Ok(())
}

/// Largest |logit difference| allowed against transformers on SmolLM2 (30
/// layers; both dequantize the same Q4_1 weights to f32): a tenth of what
/// its full and SPEED logits are held to; 7e-5 measured.
const REAL_TOL: f32 = 1e-3;
/// Where transformers' top-2 margin is above this, the argmax must agree.
const REAL_MARGIN: f32 = 0.05;

/// SmolLM2-135M-Instruct (when fetched; CI fetches it): the 128 largest
/// logits transformers gives each decode-phase row of the four chat cases
/// of `fixtures/real/smollm2` under `swiftkv:C[+bos]` at C = 15 and 22, the
/// prompt in one chunk and (for one case) one token at a time.
#[test]
fn smollm2_matches_transformers_under_projected_kv() -> Result<()> {
    let Some(path) = lcut_testkit::real_model() else {
        return Ok(());
    };
    let dir = lcut_testkit::real_reference();
    let model = Decoder::load(&path, DType::F32, &Device::Cpu)?;
    let ids = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let reference = candle_core::safetensors::load(dir.join("swiftkv.safetensors"), &Device::Cpu)?;
    let mut worst = 0f32;
    for (k, name) in ["factual", "retrieval", "copy", "reasoning"]
        .iter()
        .enumerate()
    {
        let c = Case {
            name,
            model: model.clone(),
            ids: ids[&format!("{name}.input_ids")]
                .to_dtype(DType::U32)?
                .to_vec1()?,
            s: reference[&format!("{name}.decode_start")].to_vec1::<i64>()?[0] as usize,
            reference: HashMap::new(),
        };
        for cut in [15, 22] {
            for (text, tag) in [
                (format!("swiftkv:{cut}+bos"), "bos"),
                (format!("pop:{cut}"), "noanchor"),
            ] {
                let key = format!("{name}.swiftkv.c{cut}.{tag}");
                let idx = reference[&format!("{key}.top_idx")].to_dtype(DType::U32)?;
                let val = &reference[&format!("{key}.top_val")];
                let mut runs = vec![("one chunk", vec![c.ids.len()])];
                if k == 0 {
                    runs.push(("incremental", (c.s..=c.ids.len()).collect()));
                }
                for (how, ends) in runs {
                    let (ours, _) = decode_rows(&c, &text, &ends)?;
                    let what = format!("{key} ({how})");
                    let d =
                        common::check_top_logits(&what, &ours, &idx, val, REAL_TOL, REAL_MARGIN)?;
                    worst = worst.max(d);
                }
            }
        }
    }
    eprintln!("largest |logit difference| against transformers on SmolLM2: {worst:e}");
    Ok(())
}

/// With the K/V cache stored in f16 (what `--dtype q` keeps by default),
/// projected K/V enter the upper caches in the cache's dtype on every
/// schedule (a chunk whose tokens all left the model included) and the
/// rows stay within f16 rounding of transformers'.
#[test]
fn projected_kv_runs_with_a_half_precision_cache() -> Result<()> {
    for name in ORACLE_CASES {
        let mut c = load(name)?;
        c.model.set_kv_dtype(DType::F16)?;
        for (text, key) in policies(2) {
            let reference = &c.reference[&key];
            for (how, ends) in schedules(&c) {
                let (ours, _) = decode_rows(&c, &text, &ends)?;
                let d = common::max_abs_diff(&ours, reference)?;
                ensure!(
                    d <= 5e-2,
                    "{name} {text} ({how}), f16 cache: {d:e} from transformers"
                );
            }
        }
    }
    Ok(())
}

/// One full-depth prompt run serves a projected policy: its lower layers'
/// K/V are the full run's and its upper K/V are projected from the hidden
/// states the run recorded entering the cut (`Decoder::projected_from`).
/// The decode-phase rows and, after them, the state are the policy's own
/// run's bit for bit (same positions and K/V at every layer), and the rows
/// match transformers, from a prompt run in one chunk and in chunks.
#[test]
fn a_full_prefill_serves_projected_kv_as_its_own_prefill_does() -> Result<()> {
    for name in ORACLE_CASES {
        let c = load(name)?;
        let t = c.ids.len();
        for cut in CUTS {
            for (text, key) in policies(cut) {
                let (policy, phases) = resolve(&c, &text)?;
                for ends in [vec![c.s], vec![5, 17, c.s]] {
                    let mut full = c.model.new_full_sequence();
                    let mut entering = lcut_model::probes::PromptRecord::entering([cut]);
                    let mut own = c.model.new_sequence(policy, phases)?;
                    let mut start = 0;
                    for &end in &ends {
                        let chunk = &c.ids[start..end];
                        c.model
                            .forward(&mut full, chunk, LogitRows::None, Some(&mut entering))?;
                        c.model.forward(&mut own, chunk, LogitRows::None, None)?;
                        start = end;
                    }
                    let mut seq = c.model.projected_from(&full, policy, phases, &entering)?;
                    let out = c
                        .model
                        .forward(&mut seq, &c.ids[c.s..], LogitRows::All, None)?;
                    let rows = out.logits.expect("logits");
                    ensure!(rows.dim(0)? == t - c.s, "{name} {text}: decode rows");
                    let own_rows = c
                        .model
                        .forward(&mut own, &c.ids[c.s..], LogitRows::All, None)?
                        .logits
                        .expect("logits");
                    let d = common::max_abs_diff(&rows, &own_rows)?;
                    ensure!(d == 0.0, "{name} {text}: rows {d:e} from its own run");
                    for (l, (a, b)) in seq.caches().iter().zip(own.caches()).enumerate() {
                        ensure!(
                            a.positions() == b.positions(),
                            "{name} {text}: layer {l} holds other positions"
                        );
                        let ((ka, va), (kb, vb)) =
                            (a.kv()?.expect("prompt rows"), b.kv()?.expect("prompt rows"));
                        let d =
                            common::max_abs_diff(&ka, &kb)?.max(common::max_abs_diff(&va, &vb)?);
                        ensure!(d == 0.0, "{name} {text}: layer {l} K/V {d:e} from its own");
                    }
                    let d = common::max_abs_diff(&rows, &c.reference[&key])?;
                    ensure!(d <= TOL, "{name} {text} from a full prefill: {d:e}");
                }
            }
        }
    }
    Ok(())
}

/// A projected policy is served only by a full-depth prompt run that
/// recorded the states entering its cut; anything else is refused by name.
#[test]
fn a_prefill_that_cannot_serve_projected_kv_is_refused() -> Result<()> {
    let c = load("llama-gqa")?;
    let (policy, phases) = resolve(&c, "swiftkv:2+bos")?;
    let mut full = c.model.new_full_sequence();
    let mut at_three = lcut_model::probes::PromptRecord::entering([3]);
    c.model.forward(
        &mut full,
        &c.ids[..c.s],
        LogitRows::None,
        Some(&mut at_three),
    )?;
    let err = c
        .model
        .projected_from(&full, policy, phases, &at_three)
        .unwrap_err();
    ensure!(
        matches!(
            err,
            lcut_model::ModelError::UnrecordedPrompt { layer: 2, .. }
        ),
        "{err}"
    );
    let (speed, speed_phases) = resolve(&c, "speed:2+bos")?;
    let err = c
        .model
        .projected_from(&full, speed, speed_phases, &at_three)
        .unwrap_err();
    ensure!(
        matches!(err, lcut_model::ModelError::NotRestrictable { .. }),
        "{err}"
    );
    let mut cut = c.model.new_sequence(speed, speed_phases)?;
    c.model
        .forward(&mut cut, &c.ids[..c.s], LogitRows::None, None)?;
    let err = c
        .model
        .projected_from(&cut, policy, phases, &at_three)
        .unwrap_err();
    ensure!(
        matches!(err, lcut_model::ModelError::NotFullDepthPrefix { .. }),
        "{err}"
    );
    Ok(())
}
