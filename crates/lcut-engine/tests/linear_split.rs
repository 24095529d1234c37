//! What `lcut diagnose` tells a user about a hybrid model's linear-attention
//! layers (Qwen3.5), on the tiny reference model in
//! `fixtures/oracle/layouts/qwen35-hybrid` (six linear layers, two full):
//! a linear layer has no attention rows, so its masses in the trace are its
//! state split, the prompt's share of the layer's output against the
//! decode-phase tokens' (the split itself is held to transformers' outputs
//! by lcut-model's oracle tests); the trace and the report say which layers
//! these are; above an anchor-free SPEED cut the prompt's share is 0 (no
//! prompt token entered the state), and the full layers keep their
//! attention masses. The model is random: the numbers test the mechanics.

mod common;

use anyhow::{Context, Result, ensure};
use candle_core::{DType, Device};
use lcut_engine::Session;
use lcut_engine::diagnose::{DiagnoseOptions, LabelledPrompt, diagnose_prepared};
use lcut_model::probes::pool_heads;
use lcut_model::{LinearSplit, LogitRows, Probe};
use lcut_testkit::{QWEN35_CASE, oracle_case, oracle_ids};
use lcut_trace::{PromptTrace, Report};

/// Two prompts cut from the case's token ids, the decode phase starting
/// three tokens before each prompt's end.
fn prompts() -> Result<Vec<LabelledPrompt>> {
    common::prompts_from(&oracle_ids(QWEN35_CASE)?, &[14, 24])
}

fn diagnose(s: &Session, policy: Option<&str>) -> Result<Report> {
    let opts = DiagnoseOptions {
        max_new_tokens: 6,
        policy: policy.map(str::parse).transpose()?,
        ..DiagnoseOptions::default()
    };
    Ok(diagnose_prepared(s, &prompts()?, &opts, &mut |_| true)?)
}

/// The split of every linear layer's rows from `from` on.
struct Splits {
    from: usize,
    rows: Vec<(usize, LinearSplit)>,
}

impl Probe for Splits {
    fn linear_split_from(&self, _layer: usize) -> Option<usize> {
        Some(self.from)
    }

    fn on_linear_split(&mut self, layer: usize, split: &LinearSplit) -> lcut_model::Result<()> {
        self.rows.push((layer, split.clone()));
        Ok(())
    }
}

/// The prompt's share at (layer, step, head) of the trace's generation run
/// again apart: the prompt in one chunk, then the generated tokens one at
/// a time, with a probe of its own asking for the split.
fn shares_apart(s: &Session, lp: &LabelledPrompt, t: &PromptTrace) -> Result<Vec<f32>> {
    let cfg = s.model.config();
    let (l, h, n) = (cfg.num_layers, cfg.num_heads, t.num_steps());
    let (ids, start) = (&lp.prompt.ids, lp.prompt.decode_start);
    let policy = "full".parse::<lcut_policy::PolicySpec>()?.resolve(l)?;
    let phases = lp.prompt.phases(&policy)?;
    let mut seq = s.model.new_sequence(policy, phases)?;
    let mut probe = Splits {
        from: start,
        rows: Vec::new(),
    };
    s.model
        .forward(&mut seq, ids, LogitRows::Last, Some(&mut probe))?;
    // the last step's token is the trace's last output, never an input
    for &token in &t.generated_ids[..n - 1] {
        s.model
            .forward(&mut seq, &[token], LogitRows::Last, Some(&mut probe))?;
    }
    let mut out = vec![f32::NAN; l * n * h];
    for (layer, split) in &probe.rows {
        let shares = split.prompt_shares();
        let v = split.value_heads;
        for (row, &p) in split.positions.iter().enumerate() {
            let Some(k) = p.checked_sub(ids.len() - 1).filter(|&k| k < n) else {
                continue;
            };
            let pooled = pool_heads(&shares[row * v..(row + 1) * v], h);
            out[(layer * n + k) * h..(layer * n + k + 1) * h].copy_from_slice(&pooled);
        }
    }
    Ok(out)
}

#[test]
fn a_linear_layers_masses_are_its_state_split_and_the_report_says_so() -> Result<()> {
    let s = Session::load(&oracle_case(QWEN35_CASE), DType::F32, &Device::Cpu)?;
    let cfg = s.model.config().clone();
    let la = cfg.linear_attention.clone().context("a hybrid case")?;
    let linear: Vec<usize> = (0..cfg.num_layers).filter(|&l| la.is_linear(l)).collect();
    ensure!(linear == [0, 1, 2, 4, 5, 6], "{linear:?}");
    let r = diagnose(&s, None)?;
    ensure!(r.curves.state_split_layers == linear);
    for (t, lp) in r.traces.iter().zip(prompts()?) {
        ensure!(t.state_split_layers == linear, "{:?}", t.state_split_layers);
        let apart = shares_apart(&s, &lp, t)?;
        let (n, h) = (t.num_steps(), t.num_heads);
        ensure!(n > 1);
        for l in 0..cfg.num_layers {
            for k in 0..n {
                for head in 0..h {
                    let at = [l, k, head];
                    let get = |x: &lcut_trace::Tensor3| x.view()[at];
                    let (prefill, decode) = (get(&t.prefill), get(&t.decode));
                    let others = [get(&t.bos), get(&t.anchor), get(&t.self_mass)];
                    let entropy = get(&t.prefill_entropy);
                    if linear.contains(&l) {
                        let want = apart[(l * n + k) * h + head];
                        ensure!(
                            (prefill - want).abs() <= 1e-5,
                            "layer {l} step {k} head {head}: {prefill} against {want} apart"
                        );
                        ensure!((prefill + decode - 1.0).abs() <= 1e-6);
                        ensure!(others == [0.0; 3] && entropy.is_nan());
                    } else {
                        // an attention layer's five masses are its whole softmax
                        let total = prefill + decode + others.iter().sum::<f32>();
                        ensure!((total - 1.0).abs() <= 1e-4, "layer {l}: {total}");
                    }
                }
            }
        }
        // the prompt is read by every linear layer of a full-depth run
        for &l in &linear {
            let mean: f32 = (0..n).map(|k| t.prefill.view()[[l, k, 0]]).sum::<f32>() / n as f32;
            ensure!(mean > 0.01, "layer {l}: prompt share {mean}");
        }
    }
    // the curves read both measures, and the recommendation says so
    for &l in &linear {
        ensure!(r.curves.prefill[l] > 0.01 && r.curves.entropy_head_mean[l].is_nan());
    }
    ensure!(
        r.recommendation
            .explanation
            .contains("6 of 8 layers have no attention rows"),
        "{}",
        r.recommendation.explanation
    );
    // only the two full layers store K/V, so the cuts between them hold
    // the same prompt K/V, and the recommendation names them
    let stores = r.model.stores_kv();
    ensure!(stores == (0..8).map(|l| l == 3 || l == 7).collect::<Vec<_>>());
    let (lo, hi) = lcut_diag::same_kv_cuts(&stores, r.recommendation.l_cut);
    let line = "2 of 8 layers store K/V of their own";
    ensure!(
        r.recommendation.explanation.contains(line) == (lo < hi)
            && (lo < hi) == (r.recommendation.l_cut < 8),
        "cut {} ({lo} to {hi}):\n{}",
        r.recommendation.l_cut,
        r.recommendation.explanation
    );
    let back: Report = serde_json::from_str(&serde_json::to_string(&r)?)?;
    ensure!(back.curves.state_split_layers == linear);
    ensure!(back.traces[0].state_split_layers == linear);
    Ok(())
}

#[test]
fn above_an_anchor_free_cut_a_linear_layer_reads_no_prompt() -> Result<()> {
    let s = Session::load(&oracle_case(QWEN35_CASE), DType::F32, &Device::Cpu)?;
    let r = diagnose(&s, Some("speed:2"))?;
    for t in &r.traces {
        ensure!(t.state_split_layers == [0, 1, 2, 4, 5, 6]);
        for &l in &t.state_split_layers {
            let shares: Vec<f32> = (0..t.num_steps())
                .flat_map(|k| (0..t.num_heads).map(move |h| (k, h)))
                .map(|(k, h)| t.prefill.view()[[l, k, h]])
                .collect();
            // above the cut only the decode phase's tokens entered the
            // state: the state at the decode start is empty
            match l >= 2 {
                true => ensure!(shares.iter().all(|&x| x == 0.0), "layer {l}: {shares:?}"),
                false => ensure!(shares.iter().any(|&x| x > 0.01), "layer {l}: {shares:?}"),
            }
        }
    }
    Ok(())
}

/// llama.cpp's file of the same model holds the value heads in another
/// order (tiled); its report shows each head's share where the folder's
/// does, so that the two read alike.
#[test]
fn the_gguf_file_reports_the_folders_shares_head_by_head() -> Result<()> {
    let folder = Session::load(&oracle_case(QWEN35_CASE), DType::F32, &Device::Cpu)?;
    let gguf = Session::load(
        &oracle_case(QWEN35_CASE).join("model.f32.gguf"),
        DType::F32,
        &Device::Cpu,
    )?;
    let (a, b) = (diagnose(&folder, None)?, diagnose(&gguf, None)?);
    ensure!(b.curves.state_split_layers == a.curves.state_split_layers);
    for (x, y) in a.traces.iter().zip(&b.traces) {
        ensure!(x.generated_ids == y.generated_ids);
        let worst = x
            .prefill
            .data()
            .iter()
            .zip(y.prefill.data())
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max);
        ensure!(worst <= 1e-4, "{}: shares differ by {worst}", x.id);
    }
    Ok(())
}
