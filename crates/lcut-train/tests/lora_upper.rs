//! The LoRA trainer runs the model's own tensor path: on the rows that
//! exist above the cut, from the lower layers' residual stream, it gives
//! transformers' SPEED+BoS logits on every reference architecture (zero
//! adapter), also when the trained span starts below the cut (every token
//! there); Mistral's and Gemma 3's sliding windows are applied (a
//! window-blind trainer misses the reference); a trained step lowers the
//! loss; and an adapter trained below and above the cut, written and
//! applied by the engine under the same policy, gives the trainer's logits,
//! on Llama and on Gemma 3.
use anyhow::{Result, ensure};
use candle_core::{D, DType, Device, Tensor};
use lcut_model::lora::{LoraConfig, LoraMode, write_adapter};
use lcut_model::{Decoder, LogitRows};
use lcut_model::{ModelConfig, WeightFiles};
use lcut_parity::ReferenceCase;
use lcut_policy::{PolicySpec, TokenPhases};
use lcut_train::lora_train::{
    BelowCut, CheckpointState, LoraTrainOptions, LoraVars, TeacherTopK, TrainSeq, UpperModel,
    frozen_rows, topk_kl, train_lora,
};

const CUT: usize = 4;

/// The SPEED+BoS sequence at cut 4 of oracle case `name` for a model that
/// starts at layer `first` (at or below the cut: below it, every row runs
/// from the residual stream after layer `first - 1`, and the BoS and
/// decode rows go on past the cut), with transformers' SPEED+BoS logits.
/// `cfg` may be changed before the model is built.
fn oracle_seq(
    name: &str,
    first: usize,
    edit: impl FnOnce(&mut ModelConfig),
) -> Result<(UpperModel, TrainSeq, Tensor)> {
    oracle_seq_at(name, first, CUT, edit)
}

/// [`oracle_seq`] at the cut `cut` (a case has references at some cuts).
fn oracle_seq_at(
    name: &str,
    first: usize,
    cut: usize,
    edit: impl FnOnce(&mut ModelConfig),
) -> Result<(UpperModel, TrainSeq, Tensor)> {
    let dir = lcut_testkit::oracle_case(name);
    let case = ReferenceCase::load(&dir)?;
    let mut cfg = ModelConfig::from_folder(&dir)?;
    edit(&mut cfg);
    let model = UpperModel::load_span(&cfg, &WeightFiles::open(&dir)?, first, cut)?;
    // what the frozen layers give besides the residual stream: Gemma 4's
    // per-layer inputs and the K/V of frozen layers a trained one reads
    let frozen = Decoder::from_weights(cfg, &WeightFiles::open(&dir)?, DType::F32, &Device::Cpu)?;
    let frozen = frozen_rows(&frozen, &case.ids, first)?;
    let s = case.policies[0].decode_start;
    let t = case.ids.len();
    let positions: Vec<usize> = std::iter::once(0).chain(s..t).collect();
    let idx: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
    let n = positions.len();
    let visible = (0..n * n).map(|i| i % n <= i / n).collect();
    let loss_rows: Vec<u32> = (1..n as u32).collect();
    let targets = loss_rows
        .iter()
        .map(|&r| case.ids[(positions[r as usize] + 1).min(t - 1)])
        .collect();
    let (x, below) = match first < cut {
        false => {
            let x = case.tensors[&format!("layer_out.{}", cut - 1)]
                .index_select(&Tensor::new(idx.as_slice(), &Device::Cpu)?, 0)?;
            (x, None)
        }
        true => (
            case.tensors[&format!("layer_out.{}", first - 1)].clone(),
            Some(BelowCut {
                positions: (0..t).collect(),
                visible: (0..t * t).map(|i| i % t <= i / t).collect(),
                kept: idx,
            }),
        ),
    };
    let want = case.tensors[&format!("logits.speed.l{cut}.bos")].clone();
    let seq = TrainSeq {
        x,
        below,
        positions,
        visible,
        loss_rows,
        targets,
        teacher: None,
        layer_inputs: frozen.layer_inputs,
        source_kv: frozen.source_kv,
    };
    Ok((model, seq, want))
}

/// The llama-gqa case's sequence at the cut.
fn case() -> Result<(UpperModel, TrainSeq, Tensor)> {
    oracle_seq("llama-gqa", CUT, |_| {})
}

/// The llama-gqa case's sequence for a model starting at `first`.
fn case_from(first: usize) -> Result<(UpperModel, TrainSeq, Tensor)> {
    oracle_seq("llama-gqa", first, |_| {})
}

/// Projections every architecture has under these names (Phi-3 fuses q,
/// k and v into one).
fn attention_sites(name: &str) -> &'static [&'static str] {
    match name {
        "phi3-fused" => &["qkv_proj", "o_proj"],
        _ => &["q_proj", "v_proj"],
    }
}

/// Largest absolute difference of two tensors of one shape.
fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?
        .abs()?
        .flatten_all()?
        .max(D::Minus1)?
        .to_scalar::<f32>()?)
}

/// How far `model`'s logits on `s` with a fresh adapter (B = 0: the base
/// model) on `sites` of `layers` are from transformers' `want`.
fn zero_adapter_gap(
    model: &UpperModel,
    s: &TrainSeq,
    want: &Tensor,
    layers: &[usize],
    sites: &[&str],
) -> Result<f32> {
    let lora = model.init_lora(layers, sites, 4, 8.0, 3)?;
    max_diff(&model.logits(s, &lora)?, want)
}

/// 20 steps of one sequence at a constant learning rate.
fn options(checkpoint_every: usize, kd_weight: f64) -> LoraTrainOptions {
    LoraTrainOptions {
        steps: 20,
        batch: 1,
        lr: 1e-2,
        lr_end: 1e-2,
        weight_decay: 0.0,
        clip: 1.0,
        seed: 1,
        checkpoint_every,
        kd_weight,
    }
}

#[test]
fn zero_adapter_upper_layers_give_transformers_speed_logits() -> Result<()> {
    let (upper, s, want) = case()?;
    let d = zero_adapter_gap(&upper, &s, &want, &[4, 5], &["q_proj", "v_proj"])?;
    ensure!(
        d <= 1e-4,
        "upper layers differ from transformers' SPEED+BoS logits by {d:e}"
    );
    Ok(())
}

#[test]
fn zero_adapter_from_below_the_cut_gives_transformers_speed_logits() -> Result<()> {
    for first in [1, 2, 3] {
        let (model, s, want) = case_from(first)?;
        let d = zero_adapter_gap(&model, &s, &want, &[first, 5], &["q_proj", "v_proj"])?;
        ensure!(
            d <= 1e-4,
            "from layer {first}: differs from transformers' SPEED+BoS logits by {d:e}"
        );
    }
    Ok(())
}

/// The trainer is the model's own tensor path: on every reference
/// architecture (q/k norms, biases, fused projections, sandwich norms,
/// soft-caps, sliding windows, Gemma 3's two RoPE bases), from the cut and
/// from below it, a zero adapter gives transformers' SPEED+BoS logits.
#[test]
fn every_architecture_trains_on_transformers_logits() -> Result<()> {
    for name in lcut_testkit::ORACLE_CASES {
        for first in [2, CUT] {
            let (model, s, want) = oracle_seq(name, first, |_| {})?;
            let d = zero_adapter_gap(&model, &s, &want, &[first, 5], attention_sites(name))?;
            ensure!(
                d <= 1e-4,
                "{name} from layer {first}: differs from transformers' SPEED+BoS logits by {d:e}"
            );
        }
    }
    Ok(())
}

/// The sliding windows of 12 decide these cases: the same trainer with
/// every window widened past the sequence (a window-blind trainer; Gemma
/// 3's sliding layers keep their own RoPE) is far from transformers, so the
/// test above holds only because the trainer reads each layer's window.
#[test]
fn a_window_blind_trainer_misses_transformers_logits() -> Result<()> {
    for name in ["mistral-window", "gemma3-sliding"] {
        for first in [2, CUT] {
            let (model, s, want) = oracle_seq(name, first, |cfg| {
                for w in cfg.sliding_window.iter_mut().flatten() {
                    *w = 1 << 20;
                }
            })?;
            let d = zero_adapter_gap(&model, &s, &want, &[5], &["q_proj"])?;
            ensure!(
                d > 1e-2,
                "{name} from layer {first}: the windows change nothing here ({d:e})"
            );
        }
    }
    Ok(())
}

/// Train an adapter on `sites` of layers 2..6 of oracle case `name` (two
/// below the cut of 4) for speed:4+bos, write it in the PEFT layout, apply
/// it in the engine on the fly under that policy, and require the engine's
/// logits to be the trainer's (what is trained is what runs) and training
/// to have lowered the loss and moved the logits. Returns the pairs.
fn trained_runs_in_the_engine_as_trained(name: &str, sites: &[&str]) -> Result<LoraVars> {
    let (model, s, base) = oracle_seq(name, 2, |_| {})?;
    let layers = [2, 3, 4, 5];
    let lora = model.init_lora(&layers, sites, 4, 8.0, 3)?;
    let tmp = tempfile::tempdir()?;
    let mut config = LoraConfig::new(4, 8.0, sites);
    config.layers = Some(layers.to_vec());
    config.policy = Some("speed:4+bos".into());
    let state = train_lora(
        &model,
        &lora,
        std::slice::from_ref(&s),
        &options(0, 0.0),
        (&tmp.path().join("ckpt"), &config),
        |_, _| {},
    )?;
    ensure!(
        state.losses[19] < state.losses[0] * 0.9,
        "{name}: loss {:?}",
        state.losses
    );
    let trained = model.logits(&s, &lora)?;
    ensure!(
        max_diff(&trained, &base)? > 1e-2,
        "{name}: training changed nothing"
    );
    let adapter = tmp.path().join("adapter");
    write_adapter(&adapter, &config, &lora.pairs())?;
    let dir = lcut_testkit::oracle_case(name);
    let engine = Decoder::load(&dir, candle_core::DType::F32, &Device::Cpu)?
        .with_lora(&adapter, LoraMode::OnTheFly)?;
    let case = ReferenceCase::load(&dir)?;
    let (ids, start) = (case.ids, case.policies[0].decode_start);
    let policy = "speed:4+bos".parse::<PolicySpec>()?.resolve(6)?;
    let mut seq = engine.new_sequence(policy, TokenPhases::new(ids.len(), start, 1)?)?;
    engine.forward(&mut seq, &ids[..start], LogitRows::None, None)?;
    let out = engine.forward(&mut seq, &ids[start..], LogitRows::All, None)?;
    let got = out.logits.ok_or_else(|| anyhow::anyhow!("no logits"))?;
    let d = max_diff(&got, &trained)?;
    ensure!(d <= 1e-4, "{name}: engine vs trainer: {d:e}");
    Ok(lora)
}

/// An adapter trained on Gemma 3's layout (sliding and global layers, q/k
/// norms, four norms a layer, GELU-tanh) below and above the cut, on every
/// projection, runs in the engine as trained, windows included.
#[test]
fn gemma3_trains_with_its_windows_and_runs_as_trained() -> Result<()> {
    trained_runs_in_the_engine_as_trained("gemma3-sliding", &ALL_SITES)?;
    Ok(())
}

/// A projection the model does not have, or a layer outside the trained
/// ones, is refused by name.
#[test]
fn a_projection_the_model_lacks_is_refused_by_name() -> Result<()> {
    let (phi3, _, _) = oracle_seq("phi3-fused", CUT, |_| {})?;
    let err = match phi3.init_lora(&[4], &["q_proj"], 4, 8.0, 3) {
        Ok(_) => anyhow::bail!("q_proj on a fused model was accepted"),
        Err(e) => e.to_string(),
    };
    ensure!(err.contains("q_proj") && err.contains("qkv_proj"), "{err}");
    let (upper, _, _) = case()?;
    let err = match upper.init_lora(&[1], &["q_proj"], 4, 8.0, 3) {
        Ok(_) => anyhow::bail!("a layer below the trained span was accepted"),
        Err(e) => e.to_string(),
    };
    ensure!(err.contains("layer 1"), "{err}");
    Ok(())
}

#[test]
fn a_sequence_prepared_for_another_span_is_refused() -> Result<()> {
    let (upper, at_cut, _) = case()?;
    let (below_model, below_seq, _) = case_from(2)?;
    let lora = upper.init_lora(&[4], &["q_proj"], 4, 8.0, 3)?;
    for (model, seq) in [(&upper, &below_seq), (&below_model, &at_cut)] {
        let err = match model.logits(seq, &lora) {
            Ok(_) => anyhow::bail!("a sequence prepared for another span ran"),
            Err(e) => e.to_string(),
        };
        ensure!(err.contains("prepared"), "{err}");
    }
    Ok(())
}

/// An adapter trained on Llama's attention projections below and above
/// the cut runs in the engine as trained, and the layers below the cut
/// learnt too.
#[test]
fn adapter_trained_below_the_cut_runs_in_the_engine_as_trained() -> Result<()> {
    let lora = trained_runs_in_the_engine_as_trained("llama-gqa", &SITES)?;
    // the layers below the cut learnt too (their pairs are not at B = 0)
    for l in [2, 3] {
        let (_, b) = &lora.vars[&(l, "self_attn.v_proj".to_string())];
        let norm = b.as_tensor().sqr()?.sum_all()?.to_scalar::<f32>()?;
        ensure!(norm > 1e-6, "layer {l} below the cut did not train");
    }
    Ok(())
}

/// The four attention projections every training test adapts.
const SITES: [&str; 4] = ["q_proj", "k_proj", "v_proj", "o_proj"];

/// Every projection of a dense layer with separate q, k, v and gate, up.
const ALL_SITES: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// A fresh rank-4 adapter on layers 4 and 5, always from the same seed.
fn fresh_adapter(upper: &UpperModel) -> Result<LoraVars> {
    Ok(upper.init_lora(&[4, 5], &SITES, 4, 8.0, 3)?)
}

/// Train `lora` on `data` with `opts`, checkpointing into `dir`.
fn train(
    upper: &UpperModel,
    lora: &LoraVars,
    data: &[TrainSeq],
    opts: &LoraTrainOptions,
    dir: &std::path::Path,
) -> Result<CheckpointState> {
    let config = lcut_model::lora::LoraConfig::new(4, 8.0, &SITES);
    Ok(train_lora(
        upper,
        lora,
        data,
        opts,
        (dir, &config),
        |_, _| {},
    )?)
}

#[test]
fn training_lowers_the_loss_and_resumes() -> Result<()> {
    let (upper, s, _) = case()?;
    let mut opts = options(10, 0.0);
    let dir = tempfile::tempdir()?;
    let data = [s];
    let state = train(&upper, &fresh_adapter(&upper)?, &data, &opts, dir.path())?;
    let (first, last) = (state.losses[0], state.losses[19]);
    ensure!(last < first * 0.9, "loss {first} -> {last}");
    // resume: a fresh adapter picks up the checkpoint at step 20 and goes on
    opts.steps = 25;
    let state = train(&upper, &fresh_adapter(&upper)?, &data, &opts, dir.path())?;
    ensure!(
        state.losses.len() == 25 && state.losses[20] <= first,
        "resumed: {:?}",
        state.losses
    );
    Ok(())
}

/// The teacher's top k of `logits` [rows, vocab], renormalised, from plain
/// Rust (sorting each row), as a `TeacherTopK`.
fn top_k(logits: &Tensor, k: usize) -> Result<TeacherTopK> {
    let rows: Vec<Vec<f32>> = logits.to_vec2()?;
    let (mut ids, mut probs) = (vec![], vec![]);
    for row in &rows {
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let kept: Vec<f64> = order[..k]
            .iter()
            .map(|&i| f64::from(row[i] - max).exp())
            .collect();
        let sum: f64 = kept.iter().sum();
        ids.extend(order[..k].iter().map(|&i| i as u32));
        probs.extend(kept.iter().map(|p| (p / sum) as f32));
    }
    let dev = Device::Cpu;
    Ok(TeacherTopK {
        ids: Tensor::from_vec(ids, (rows.len(), k), &dev)?,
        probs: Tensor::from_vec(probs, (rows.len(), k), &dev)?,
    })
}

/// KL(p || q) per row by hand, in f64, p over the teacher's kept tokens.
fn kl_by_hand(teacher: &TeacherTopK, student_logits: &Tensor) -> Result<f64> {
    let ids: Vec<Vec<u32>> = teacher.ids.to_vec2()?;
    let probs: Vec<Vec<f32>> = teacher.probs.to_vec2()?;
    let logits: Vec<Vec<f32>> = student_logits.to_vec2()?;
    let mut total = 0.0;
    for ((ids, probs), row) in ids.iter().zip(&probs).zip(&logits) {
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        let log_z = row
            .iter()
            .map(|&x| f64::from(x - max).exp())
            .sum::<f64>()
            .ln();
        for (&i, &p) in ids.iter().zip(probs) {
            let log_q = f64::from(row[i as usize] - max) - log_z;
            total += f64::from(p) * (f64::from(p).ln() - log_q);
        }
    }
    Ok(total / ids.len() as f64)
}

#[test]
fn top_k_kl_is_the_kl_by_hand_and_zero_against_itself() -> Result<()> {
    let (upper, s, want) = case()?;
    let lora = upper.init_lora(&[4], &["q_proj"], 4, 8.0, 3)?;
    let got = upper.logits(&s, &lora)?;
    let vocab = got.dim(1)?;
    // the teacher: transformers' full-depth logits of the same rows would do;
    // the SPEED logits perturbed give a teacher that differs from the model
    let teacher_logits = (&want * 1.3)?;
    for k in [5, vocab] {
        let teacher = top_k(&teacher_logits, k)?;
        let log_probs = candle_nn::ops::log_softmax(&got, D::Minus1)?;
        let kl = f64::from(topk_kl(&log_probs, &teacher)?.to_scalar::<f32>()?);
        let hand = kl_by_hand(&teacher, &got)?;
        ensure!(
            (kl - hand).abs() <= 1e-4 * hand.abs().max(1.0) && hand > 1e-3,
            "top-{k} KL {kl} vs by hand {hand}"
        );
        // against its own full distribution the KL is zero
        let own = top_k(&got, vocab)?;
        let zero = f64::from(topk_kl(&log_probs, &own)?.to_scalar::<f32>()?);
        ensure!(zero.abs() <= 1e-5, "KL against itself {zero}");
    }
    Ok(())
}

#[test]
fn training_with_the_kl_term_ends_nearer_the_teacher() -> Result<()> {
    let (upper, mut s, want) = case()?;
    let teacher_logits = (&want * 1.3)?;
    s.teacher = Some(top_k(&teacher_logits, 16)?);
    // the tokens are the teacher's own choices, as in self-distillation
    s.targets = teacher_logits.argmax(D::Minus1)?.to_vec1()?;
    let data = [s];
    // the same start trained on cross-entropy alone and with the KL term
    let train_kl = |kd_weight: f64| -> Result<f64> {
        let lora = fresh_adapter(&upper)?;
        let dir = tempfile::tempdir()?;
        train(&upper, &lora, &data, &options(0, kd_weight), dir.path())?;
        let s = &data[0];
        let got = upper.logits(s, &lora)?;
        let teacher = s
            .teacher
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("no teacher"))?;
        kl_by_hand(teacher, &got)
    };
    let (ce_only, with_kl) = (train_kl(0.0)?, train_kl(1.0)?);
    ensure!(
        with_kl < ce_only * 0.8,
        "KL to the teacher after training: cross-entropy alone {ce_only}, with the KL term {with_kl}"
    );
    Ok(())
}

/// The six-layer Gemma 4 reference cases: per-layer inputs and wider full
/// layers whose keys are their values; in the first the last two layers
/// read layers 3's and 2's K/V (sliding and full), the second adds experts
/// and shares none. (The wide case has four layers: a cut of 4 is its full
/// depth.)
const GEMMA4_CASES: [&str; 2] = [lcut_testkit::GEMMA4_CASE, lcut_testkit::GEMMA4MOE_CASE];

/// Gemma 4 trains as it runs: from every first layer up to the cut, a zero
/// adapter gives transformers' SPEED+BoS logits, with the per-layer inputs
/// carried and the shared layers above the cut reading their sources' K/V
/// (computed by the trained layers below the cut, or by the frozen ones
/// beneath the first trained layer), and the frozen layers' residual stream
/// is transformers' too.
#[test]
fn gemma4_trains_on_transformers_logits() -> Result<()> {
    for name in GEMMA4_CASES {
        let case = ReferenceCase::load(&lcut_testkit::oracle_case(name))?;
        for first in 1..=CUT {
            let (model, mut s, want) = oracle_seq(name, first, |_| {})?;
            let d = zero_adapter_gap(&model, &s, &want, &[first, 5], &["q_proj", "o_proj"])?;
            ensure!(
                d <= 1e-4,
                "{name} from layer {first}: differs from transformers' SPEED+BoS logits by {d:e}"
            );
            // the frozen layers the shared ones read: 2 and 3 from the cut,
            // 2 from layer 3, none below
            let sources: Vec<usize> = s.source_kv.keys().copied().collect();
            let shares = name == lcut_testkit::GEMMA4_CASE;
            let expected: &[usize] = match (shares, first) {
                (true, 4) => &[2, 3],
                (true, 3) => &[2],
                _ => &[],
            };
            ensure!(
                sources == expected,
                "{name} from {first}: sources {sources:?}"
            );
            // lcut's own frozen pass is transformers' residual stream
            let dir = lcut_testkit::oracle_case(name);
            let dec = Decoder::load(&dir, DType::F32, &Device::Cpu)?;
            let hidden = frozen_rows(&dec, &case.ids, first)?.hidden;
            let d = max_diff(&hidden, &case.tensors[&format!("layer_out.{}", first - 1)])?;
            ensure!(
                d <= 1e-4,
                "{name}: the frozen layers' stream differs by {d:e}"
            );
            // without the sources' K/V a shared layer has nothing to read
            if shares && first == CUT {
                s.source_kv.clear();
                let lora = model.init_lora(&[first], &["q_proj"], 4, 8.0, 3)?;
                let err = match model.logits(&s, &lora) {
                    Ok(_) => anyhow::bail!("{name}: a shared layer ran without its source's K/V"),
                    Err(e) => e.to_string(),
                };
                ensure!(err.contains("reads layer"), "{name}: {err}");
            }
        }
    }
    Ok(())
}

/// An adapter trained on Gemma 4's layout below and above the cut runs in
/// the engine as trained; keys and values are adapted only on the layers
/// that have them (not the shared layers, not a full layer's values), and
/// a projection none of the chosen layers has is refused by name.
#[test]
fn gemma4_adapter_runs_as_trained_and_missing_projections_are_named() -> Result<()> {
    trained_runs_in_the_engine_as_trained(lcut_testkit::GEMMA4_CASE, &ALL_SITES)?;
    let (model, _, _) = oracle_seq(lcut_testkit::GEMMA4_CASE, 2, |_| {})?;
    // as PEFT does, k and v are adapted where a layer has them
    let lora = model.init_lora(&[2, 3, 4, 5], &["k_proj", "v_proj"], 4, 8.0, 3)?;
    let sites: Vec<(usize, &str)> = lora.vars.keys().map(|(l, m)| (*l, m.as_str())).collect();
    let want = [
        (2, "self_attn.k_proj"),
        (3, "self_attn.k_proj"),
        (3, "self_attn.v_proj"),
    ];
    ensure!(sites == want, "adapted {sites:?}");
    let absent = lora.absent(&[2, 3, 4, 5], &["k_proj", "v_proj"]);
    let expected = vec![
        ("k_proj".to_string(), vec![4, 5]),
        ("v_proj".to_string(), vec![2, 4, 5]),
    ];
    ensure!(absent == expected, "said absent: {absent:?}");
    // a projection none of the layers has is refused by name
    for (layers, module) in [(&[4, 5][..], "k_proj"), (&[2, 5][..], "v_proj")] {
        let err = match model.init_lora(layers, &[module], 4, 8.0, 3) {
            Ok(_) => anyhow::bail!("{module} on layers {layers:?} was accepted"),
            Err(e) => e.to_string(),
        };
        ensure!(
            err.contains(&format!(
                "no projection {module} to adapt in layers {layers:?}"
            )),
            "{err}"
        );
    }
    Ok(())
}

/// The mixtures (Qwen3-MoE, Mixtral, gpt-oss's sinks: an adapter on their
/// attention) and Qwen3.5's hybrid layers (linear-attention layers below
/// and above the cut, the one above running over the anchors and decode
/// rows alone) train as they run: a zero adapter gives transformers'
/// SPEED+BoS logits from the cut and from below it.
#[test]
fn mixtures_and_hybrid_layers_train_on_transformers_logits() -> Result<()> {
    let mut cases: Vec<(&str, usize, usize)> = lcut_testkit::MOE_CASES
        .iter()
        .map(|&name| (name, CUT, 5))
        .collect();
    // Qwen3.5's references cut at 5; layers 3 and 7 are its full layers
    cases.push((lcut_testkit::QWEN35_CASE, 5, 7));
    cases.push((lcut_testkit::QWEN35MOE_CASE, 5, 7));
    for (name, cut, top) in cases {
        for first in [2, cut] {
            let (model, s, want) = oracle_seq_at(name, first, cut, |_| {})?;
            let d = zero_adapter_gap(&model, &s, &want, &[first, top], &["q_proj", "o_proj"])?;
            ensure!(
                d <= 1e-4,
                "{name} from layer {first}: differs from transformers' SPEED+BoS logits by {d:e}"
            );
        }
    }
    Ok(())
}
