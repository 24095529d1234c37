//! The diagnostic pipeline: probe masses and curvature against the reference
//! attention and residual stream, shard merging, and a bounded trace for a
//! long prompt.

use anyhow::{Context, Result, ensure};
use lcut_engine::PreparedPrompt;
use lcut_engine::Session;
use lcut_engine::diagnose::{
    DiagnoseEvent, DiagnoseOptions, DiagnosticProbe, LabelledPrompt, SweepOptions,
    diagnose_prepared, shard_indices, sweep,
};
use lcut_model::{DType, Decoder, Device, LlamaShape, LogitRows};
use lcut_policy::TokenPhases;
use lcut_synth::RandomLlama;
use lcut_trace::Thresholds;
use ndarray::s;

use lcut_testkit::oracle_case as oracle;

#[test]
fn probe_masses_equal_those_of_the_reference_attention() -> Result<()> {
    let dir = oracle("llama-gqa");
    let model = Decoder::load(&dir, DType::F32, &Device::Cpu)?;
    let reference =
        candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let ids: Vec<u32> = reference["input_ids"].to_dtype(DType::U32)?.to_vec1()?;
    let (p, s) = (28, 20); // a prompt of 28 tokens whose decode phase starts at 20
    let phases = TokenPhases::new(p, s, 1)?;
    let cfg = model.config().clone();
    let mut probe = DiagnosticProbe::new(phases, p, cfg.num_layers);
    let mut seq = model.new_full_sequence();
    model.forward(&mut seq, &ids[..p], LogitRows::None, Some(&mut probe))?;
    for &tok in &ids[p..] {
        model.forward(&mut seq, &[tok], LogitRows::Last, Some(&mut probe))?;
    }
    ensure!(probe.records().len() == cfg.num_layers * (ids.len() - (p - 1)));
    for rec in probe.records() {
        let attn = reference[&format!("attn.{}", rec.layer)].to_vec3::<f32>()?;
        for (h, head) in attn.iter().enumerate() {
            let row = ndarray::Array1::from(head[rec.position][..=rec.position].to_vec());
            let m = lcut_diag::phase_masses(row.view(), rec.position, 1, s)?;
            let e = lcut_diag::prefill_entropy(row.view(), rec.position, 1, s)?;
            let pairs = [
                (rec.bos[h], m.bos),
                (rec.anchor[h], m.anchor),
                (rec.prefill[h], m.prefill),
                (rec.decode[h], m.decode),
                (rec.self_mass[h], m.self_mass),
                (rec.prefill_entropy[h], e.raw),
            ];
            for (ours, theirs) in pairs {
                ensure!(
                    (ours - theirs).abs() < 1e-4,
                    "layer {} pos {} head {h}: {ours} vs {theirs}",
                    rec.layer,
                    rec.position
                );
            }
        }
    }
    // attention onto prompt positions: summed over heads and steps
    let edges: Vec<usize> = (0..=p).collect();
    let bins = probe.prompt_bin_sums(&edges)?;
    for (l, row) in bins.iter().enumerate() {
        let attn = reference[&format!("attn.{l}")].to_vec3::<f32>()?;
        for (j, &ours) in row.iter().enumerate() {
            let theirs: f32 = (0..cfg.num_heads)
                .flat_map(|h| (p - 1..ids.len()).map(move |q| (h, q)))
                .map(|(h, q)| attn[h][q][j])
                .sum();
            ensure!(
                (ours - theirs).abs() < 1e-3,
                "layer {l} position {j}: {ours} vs {theirs}"
            );
        }
    }
    // curvature of the prompt span (BoS left out) and of the generated span,
    // reduced on the device, against the reference residual stream
    for (site, name) in std::iter::once("embeddings".to_string())
        .chain((0..cfg.num_layers).map(|l| format!("layer_out.{l}")))
        .enumerate()
    {
        let states = reference[&name].to_vec2::<f32>()?;
        let states =
            ndarray::Array2::from_shape_vec((states.len(), cfg.hidden_size), states.concat())?;
        let spans = [
            (&probe.curvature_prompt[site], s![1..p, ..]),
            (&probe.curvature_generated[site], s![p.., ..]),
        ];
        for (acc, span) in spans {
            let theirs = lcut_diag::curvature(states.slice(span)).context("reference curvature")?;
            let ours = acc.finish()?.0.context("probe curvature")?;
            ensure!(
                (ours - theirs).abs() < 1e-4,
                "{name}: curvature {ours} vs {theirs} from the reference states"
            );
        }
    }
    Ok(())
}

fn id_prompts(count: usize) -> Result<Vec<LabelledPrompt>> {
    (0..count)
        .map(|i| {
            let len = 12 + 5 * i;
            let ids: Vec<u32> = (0..len as u32)
                .map(|j| {
                    if j == 0 {
                        1
                    } else {
                        3 + (j * 31 + i as u32 * 7) % 300
                    }
                })
                .collect();
            Ok(LabelledPrompt {
                index: i,
                id: format!("p{i}"),
                prompt: PreparedPrompt::from_ids(ids, Some(len - 3))?,
            })
        })
        .collect()
}

#[test]
fn merged_shards_equal_the_unsharded_run() -> Result<()> {
    let session = Session::load(&oracle("qwen2-bias"), DType::F32, &Device::Cpu)?;
    let prompts = id_prompts(5)?;
    let opts = DiagnoseOptions {
        max_new_tokens: 4,
        ..DiagnoseOptions::default()
    };
    let whole = diagnose_prepared(&session, &prompts, &opts, &mut |_| true)?;
    let mut shards = Vec::new();
    for i in [1, 0, 2] {
        let shard = Some((i, 3));
        let mine: Vec<LabelledPrompt> = shard_indices(prompts.len(), shard)?
            .into_iter()
            .map(|k| prompts[k].clone())
            .collect();
        shards.push(diagnose_prepared(
            &session,
            &mine,
            &DiagnoseOptions {
                shard,
                ..opts.clone()
            },
            &mut |_| true,
        )?);
    }
    let merged = lcut_diag::merge(shards)?;
    ensure!(
        merged == whole,
        "merged shards differ from the unsharded report"
    );
    ensure!(whole.traces.len() == 5 && whole.traces.iter().all(|t| t.num_steps() == 4));
    // masses of every step sum to one
    for t in &whole.traces {
        let total = t.mass_totals();
        ensure!(
            total.iter().all(|&x| (x - 1.0).abs() < 1e-4),
            "masses do not sum to 1 in {}",
            t.id
        );
    }
    Ok(())
}

#[test]
fn the_probe_runs_under_a_policy_and_sees_the_prompt_only_below_its_cut() -> Result<()> {
    let session = Session::load(&oracle("qwen2-bias"), DType::F32, &Device::Cpu)?;
    let layers = session.model.config().num_layers;
    let cut = layers / 2;
    let prompts = id_prompts(3)?;
    let full_opts = DiagnoseOptions {
        max_new_tokens: 4,
        ..DiagnoseOptions::default()
    };
    let speed_opts = DiagnoseOptions {
        policy: Some(format!("speed:{cut}+bos").parse()?),
        ..full_opts.clone()
    };
    let full = diagnose_prepared(&session, &prompts, &full_opts, &mut |_| true)?;
    let speed = diagnose_prepared(&session, &prompts, &speed_opts, &mut |_| true)?;
    ensure!(full.settings.policy.is_none());
    ensure!(speed.settings.policy.as_deref() == Some(format!("speed:{cut}+bos").as_str()));
    for (f, t) in full.traces.iter().zip(&speed.traces) {
        let total = t.mass_totals();
        ensure!(total.iter().all(|&x| (x - 1.0).abs() < 1e-4), "{}", t.id);
        let (prefill, full_prefill) = (t.prefill.view(), f.prefill.view());
        // above the cut the prompt is gone: no mass on it at any step
        ensure!(
            prefill.slice(s![cut.., .., ..]).iter().all(|&m| m == 0.0),
            "{}: prefill mass above the cut",
            t.id
        );
        // below it the first step (the last prompt token) computes what
        // the full model computes, and reads the prompt
        let (a, b) = (
            prefill.slice(s![..cut, 0, ..]),
            full_prefill.slice(s![..cut, 0, ..]),
        );
        ensure!(
            a.iter().any(|&m| m > 0.01),
            "{}: no prefill mass below the cut",
            t.id
        );
        for (x, y) in a.iter().zip(b.iter()) {
            ensure!(
                (x - y).abs() < 1e-5,
                "{}: step 0 below the cut {x} vs {y}",
                t.id
            );
        }
    }
    // a cut out of range is refused by name
    let bad = DiagnoseOptions {
        policy: Some(format!("speed:{}+bos", layers + 1).parse()?),
        ..full_opts
    };
    let err = diagnose_prepared(&session, &prompts, &bad, &mut |_| true).unwrap_err();
    ensure!(err.to_string().contains(&(layers + 1).to_string()), "{err}");
    Ok(())
}

#[test]
fn cancelling_stops_a_run() -> Result<()> {
    let session = Session::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    let prompts = id_prompts(3)?;
    let mut events = 0;
    let result = diagnose_prepared(&session, &prompts, &DiagnoseOptions::default(), &mut |_| {
        events += 1;
        events < 4
    });
    ensure!(
        matches!(result, Err(lcut_engine::EngineError::Cancelled)),
        "{result:?}"
    );
    Ok(())
}

/// A random 4-layer model and one 4K-token raw prompt (decode start at its
/// last token).
fn long_prompt_run() -> Result<(tempfile::TempDir, Session, Vec<LabelledPrompt>)> {
    let dir = tempfile::tempdir()?;
    RandomLlama {
        shape: LlamaShape {
            vocab_size: 512,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 8192,
            layout: lcut_model::Layout::Llama,
        },
        seed: 5,
    }
    .write(dir.path())?;
    let session = Session::load(dir.path(), DType::F32, &Device::Cpu)?;
    let ids: Vec<u32> = (0..4096u32)
        .map(|j| if j == 0 { 1 } else { 3 + (j * 7919) % 500 })
        .collect();
    let prompts = vec![LabelledPrompt {
        index: 0,
        id: "long".into(),
        prompt: PreparedPrompt::from_ids(ids, None)?,
    }];
    Ok((dir, session, prompts))
}

/// The sweep at full depth reproduces the full model (agreement 1, KL 0,
/// full KV), and a shallow cut keeps less K/V. Its shared prefix is filled
/// in chunks and forked per cutoff.
#[test]
fn the_sweep_prefills_each_prompt_once() -> Result<()> {
    let session = Session::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    let ids: Vec<u32> = (0..240u32).map(|j| 3 + (j * 13) % 300).collect();
    let prompts = vec![LabelledPrompt {
        index: 0,
        id: "three-chunks".into(),
        prompt: PreparedPrompt::from_ids(ids, Some(230))?,
    }];
    let opts = SweepOptions {
        cuts: Some(vec![2]),
        max_new_tokens: 3,
        prefill_chunk: 100,
        ..SweepOptions::default()
    };
    let mut chunks = Vec::new();
    sweep(
        &session,
        &prompts,
        &opts,
        &Thresholds::default(),
        &mut |e| {
            if let DiagnoseEvent::Prefill { done, total, .. } = e {
                chunks.push((*done, *total));
            }
            true
        },
    )?;
    // the prefix up to the decode start, chunk by chunk, once; the
    // decode-phase prompt tokens are the continuation's to run
    ensure!(chunks == [(100, 230), (200, 230), (230, 230)], "{chunks:?}");
    Ok(())
}

#[test]
fn the_sweep_at_full_depth_agrees_with_the_full_model() -> Result<()> {
    let session = Session::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    let mut prompts = id_prompts(3)?;
    // a prompt whose prefix takes three chunks
    let ids: Vec<u32> = (0..240u32)
        .map(|j| if j == 0 { 1 } else { 3 + (j * 13) % 300 })
        .collect();
    prompts.push(LabelledPrompt {
        index: 3,
        id: "three-chunks".into(),
        prompt: PreparedPrompt::from_ids(ids, Some(230))?,
    });
    let opts = SweepOptions {
        cuts: Some(vec![2, 6]),
        max_new_tokens: 6,
        prefill_chunk: 100,
        ..SweepOptions::default()
    };
    let result = sweep(
        &session,
        &prompts,
        &opts,
        &Thresholds::default(),
        &mut |_| true,
    )?;
    let at = |c: usize| {
        result
            .points
            .iter()
            .find(|p| p.policy.to_string() == format!("speed:{c}+bos"))
            .context("sweep point")
    };
    let (full, shallow) = (at(6)?, at(2)?);
    ensure!(
        full.top1_agreement == 1.0 && full.mean_kl.abs() < 1e-5 && full.kv_ratio == 1.0,
        "{full:?}"
    );
    ensure!(shallow.kv_ratio < 0.5, "{shallow:?}");
    Ok(())
}

/// Cancelling during a long prompt's prefill stops it there, not after the
/// whole prompt.
#[test]
fn a_long_prefill_can_be_cancelled_between_chunks() -> Result<()> {
    let (_dir, session, prompts) = long_prompt_run()?;
    let mut chunks = 0;
    let result = diagnose_prepared(&session, &prompts, &DiagnoseOptions::default(), &mut |e| {
        if matches!(e, DiagnoseEvent::Prefill { .. }) {
            chunks += 1;
            return chunks < 2;
        }
        true
    });
    ensure!(
        matches!(result, Err(lcut_engine::EngineError::Cancelled)),
        "{result:?}"
    );
    ensure!(chunks == 2, "{chunks} chunks ran before the cancel took");
    Ok(())
}

/// Bound on a trace of a 4K-token prompt: the serialized trace stays under
/// `PromptTrace::size_bound()`, which depends on layers, heads, steps and
/// bins but not on the prompt length (the prompt's token strings aside).
/// The prefill reports each chunk as it goes.
#[test]
fn a_4k_prompt_gives_a_bounded_trace() -> Result<()> {
    let (_dir, session, prompts) = long_prompt_run()?;
    let p = 4096;
    let opts = DiagnoseOptions {
        max_new_tokens: 8,
        max_prompt_bins: 64,
        ..DiagnoseOptions::default()
    };
    let mut prefill = Vec::new();
    let report = diagnose_prepared(&session, &prompts, &opts, &mut |e| {
        if let DiagnoseEvent::Prefill { done, total, .. } = e {
            prefill.push((*done, *total));
        }
        true
    })?;
    // chunks of 512 up to the decode start (the last token), then that token
    let mut expected: Vec<(usize, usize)> = (1..=7).map(|c| (512 * c, p)).collect();
    expected.extend([(p - 1, p), (p, p)]);
    ensure!(prefill == expected, "prefill events {prefill:?}");
    let trace = report.traces.first().context("trace")?;
    ensure!(
        trace.prompt_attention.shape() == [4, 64],
        "{:?}",
        trace.prompt_attention.shape()
    );
    let bytes = serde_json::to_vec(trace)?.len();
    let bound = trace.size_bound();
    ensure!(
        bytes <= bound,
        "trace of {bytes} bytes over its bound {bound}"
    );
    // in memory, the trace holds no more than its formula says, and not
    // far less (the formula is what `lcut diagnose` sizes a run with)
    let held = trace.held_bytes();
    let memory_bound = trace.memory_bound();
    ensure!(
        held <= memory_bound && memory_bound <= 2 * held,
        "trace holds {held} bytes, its memory bound is {memory_bound}"
    );
    // without the prompt's token strings, the bound does not grow with P
    let strings: usize = trace.prompt_tokens.iter().map(String::len).sum::<usize>() * 6 + 3 * p;
    ensure!(
        bound - strings < 64 * 1024,
        "bound {bound} grows with the prompt"
    );
    // the binned map still sums the attention decode queries pay to the prompt
    let row_sums = trace.prompt_attention.view().sum_axis(ndarray::Axis(1));
    let prompt_mass = trace
        .bos
        .view()
        .slice(s![.., .., ..])
        .mean_axis(ndarray::Axis(2))
        .context("mean")?;
    for l in 0..4 {
        let expected = (prompt_mass.row(l).mean().context("mean")?)
            + trace
                .prefill
                .view()
                .slice(s![l, .., ..])
                .mean()
                .context("mean")?
            + trace
                .anchor
                .view()
                .slice(s![l, .., ..])
                .mean()
                .context("mean")?;
        ensure!(
            (row_sums[l] - expected).abs() < 1e-3,
            "layer {l}: map sums to {} but prompt mass is {expected}",
            row_sums[l]
        );
    }
    Ok(())
}

/// The sweep on Gemma 4 (layers 4 and 5 read the K/V of layers 3 and 2):
/// the cost columns count each stored tensor once, so a cut at 4 holds all
/// the K/V the full model holds (the layers above it store none) and a cut
/// at 2 far less; at full depth the sweep agrees with the full model.
#[test]
fn the_sweep_on_gemma4_counts_shared_layers_as_holding_nothing() -> Result<()> {
    let session = Session::load(&oracle("layouts/gemma4-shared"), DType::F32, &Device::Cpu)?;
    let opts = SweepOptions {
        cuts: Some(vec![2, 4, 6]),
        max_new_tokens: 4,
        ..SweepOptions::default()
    };
    let result = sweep(
        &session,
        &id_prompts(2)?,
        &opts,
        &Thresholds::default(),
        &mut |_| true,
    )?;
    let at = |c: usize| {
        result
            .points
            .iter()
            .find(|p| p.policy.to_string() == format!("speed:{c}+bos"))
            .context("sweep point")
    };
    let (full, four, two) = (at(6)?, at(4)?, at(2)?);
    ensure!(
        full.top1_agreement == 1.0 && full.kv_ratio == 1.0,
        "{full:?}"
    );
    ensure!(four.kv_ratio == 1.0, "{four:?}");
    ensure!(two.kv_ratio < 0.01, "{two:?}");
    Ok(())
}

/// The sweep on Qwen3.5 (layers 3 and 7 full, the others linear attention):
/// each cut branches from one full-depth prompt run (the linear layers above
/// the cut start from BoS's state), and its K/V columns count the full
/// layers only: at the 128K reference length a cut at 5 holds half the
/// full model's K/V (layer 7 keeps no prompt), a cut at 2 almost none; at
/// full depth the sweep agrees with the full model.
#[test]
fn the_sweep_on_qwen35_branches_from_one_run_and_counts_full_layers_only() -> Result<()> {
    let session = Session::load(&oracle("layouts/qwen35-hybrid"), DType::F32, &Device::Cpu)?;
    let opts = SweepOptions {
        cuts: Some(vec![2, 5, 8]),
        max_new_tokens: 4,
        ..SweepOptions::default()
    };
    let result = sweep(
        &session,
        &id_prompts(2)?,
        &opts,
        &Thresholds::default(),
        &mut |_| true,
    )?;
    let at = |c: usize| {
        result
            .points
            .iter()
            .find(|p| p.policy.to_string() == format!("speed:{c}+bos"))
            .context("sweep point")
    };
    let (full, five, two) = (at(8)?, at(5)?, at(2)?);
    ensure!(
        full.top1_agreement == 1.0 && full.kv_ratio == 1.0,
        "{full:?}"
    );
    ensure!((five.kv_ratio - 0.5).abs() < 0.01, "{five:?}");
    ensure!(two.kv_ratio < 0.01, "{two:?}");
    Ok(())
}

/// A report's model carries its layers' own FLOP coefficients where they
/// differ (Qwen3.5's linear and full layers, a mixture's experts), so that
/// a saved report predicts costs as the live run does, and none for a
/// model of uniform layers (whose reports stay as they were).
#[test]
fn a_report_keeps_the_layers_own_flops_where_they_differ() -> Result<()> {
    let uniform = Session::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    ensure!(
        lcut_engine::diagnose::model_identity(&uniform)?
            .layer_flops
            .is_empty()
    );
    for case in [lcut_testkit::QWEN35_CASE, "moe/mixtral-top2"] {
        let session = Session::load(&oracle(case), DType::F32, &Device::Cpu)?;
        let model = lcut_engine::diagnose::model_identity(&session)?;
        let want = lcut_model::memory::layer_flops(session.model.config());
        ensure!(model.layer_flops == want, "{case}: {:?}", model.layer_flops);
        ensure!(want.len() == model.num_layers, "{case}");
    }
    Ok(())
}
