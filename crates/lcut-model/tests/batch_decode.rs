//! Decoding sequences together (`Decoder::forward_batch`) against decoding
//! each alone: on every reference architecture (f32) and on
//! SmolLM2-135M's Q4_1 GGUF with `--dtype q` and its f16 cache, sequences
//! of different prompt lengths under different policies (full, SPEED with
//! and without BoS, SelfOnly, SlimInfer) give bit for bit the logits of
//! one-at-a-time steps, more sequences than one pass takes included.
//! (One-at-a-time steps are held to the tensor path by `fused_step.rs`
//! and it to transformers by the reference cases.)

use anyhow::{Context, Result, ensure};
use lcut_model::{DType, Decoder, Device, LogitRows, Sequence, Tensor, WeightMode, argmax_rows};
use lcut_parity::ReferenceCase;
use lcut_policy::{PolicySpec, TokenPhases};
use lcut_testkit::{ORACLE_CASES, oracle_case, real_model};

/// Decode steps checked per sequence.
const STEPS: usize = 5;

/// A sequence prefilled to `start` under `policy`.
fn prefilled(model: &Decoder, ids: &[u32], start: usize, policy: &str) -> Result<Sequence> {
    let layers = model.config().num_layers;
    let policy = policy.parse::<PolicySpec>()?.resolve(layers)?;
    let total = start + STEPS;
    let phases = TokenPhases::new(total, start, policy.anchor_len(None, start)?)?;
    let mut seq = model.new_sequence(policy, phases)?;
    seq.reserve(total);
    model.forward(&mut seq, &ids[..start], LogitRows::None, None)?;
    Ok(seq)
}

/// The token fed at step `j` of a sequence prefilled to `start`: the
/// prompt's own while it lasts, then the last step's top-1.
fn next_token(ids: &[u32], start: usize, j: usize, last: Option<&Tensor>) -> Result<u32> {
    match ids.get(start + j) {
        Some(&id) => Ok(id),
        None => Ok(argmax_rows(last.context("a step's logits")?)?[0]),
    }
}

/// `(start, policy)` sequences decoded together and alone for `STEPS`
/// steps: the same logits bit for bit at every step.
fn check(name: &str, model: &Decoder, ids: &[u32], runs: &[(usize, String)]) -> Result<()> {
    let mut together = runs
        .iter()
        .map(|(s, p)| prefilled(model, ids, *s, p))
        .collect::<Result<Vec<_>>>()?;
    let mut alone = runs
        .iter()
        .map(|(s, p)| prefilled(model, ids, *s, p))
        .collect::<Result<Vec<_>>>()?;
    let mut last: Vec<Option<Tensor>> = vec![None; runs.len()];
    for j in 0..STEPS {
        let tokens = runs
            .iter()
            .zip(&last)
            .map(|((s, _), l)| next_token(ids, *s, j, l.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let mut seqs: Vec<&mut Sequence> = together.iter_mut().collect();
        let batched = model.forward_batch(&mut seqs, &tokens)?;
        for (i, ((seq, &token), got)) in alone.iter_mut().zip(&tokens).zip(batched).enumerate() {
            let want = model
                .forward(seq, &[token], LogitRows::Last, None)?
                .logits
                .context("a decode row")?;
            let diff: f32 = (&want - &got)?.abs()?.flatten_all()?.max(0)?.to_scalar()?;
            let (start, policy) = &runs[i];
            ensure!(
                diff == 0.0,
                "{name}, {policy} from {start}, step {j}: decoded together the logits differ by {diff}"
            );
            last[i] = Some(want);
        }
    }
    for (a, b) in together.iter().zip(&alone) {
        ensure!(
            a.kv_bytes_held() == b.kv_bytes_held(),
            "{name}: K/V held differ"
        );
    }
    Ok(())
}

/// Nine sequences (more than one pass takes): each policy from two
/// prompt lengths.
fn runs(layers: usize, start: usize) -> Vec<(usize, String)> {
    let cut = (layers / 2).max(1);
    let policies = [
        "full".to_string(),
        format!("speed:{cut}+bos"),
        format!("speed:{cut}"),
        format!("selfonly:{cut}+bos"),
        format!("slim:{cut}@50%+block:2+unit:1+swap:1"),
    ];
    policies
        .iter()
        .flat_map(|p| [(start, p.clone()), (start - 3, p.clone())])
        .take(9)
        .collect()
}

#[test]
fn sequences_decoded_together_equal_each_decoded_alone() -> Result<()> {
    decode_cases(&ORACLE_CASES, None)
}

/// Each case of `names`, whose decoder takes the fused step unless
/// `unfused` says why not, decoded together and alone.
fn decode_cases(names: &[&str], unfused: Option<lcut_model::Unfused>) -> Result<()> {
    for &name in names {
        let case = ReferenceCase::load(&oracle_case(name))?;
        let model = case.model(DType::F32, &Device::Cpu)?;
        let reason = model.unfused_reason()?;
        ensure!(
            reason == unfused,
            "{name}: {reason:?}, expected {unfused:?}"
        );
        let start = case.policies[0].decode_start;
        check(
            name,
            &model,
            &case.ids,
            &runs(model.config().num_layers, start),
        )?;
    }
    Ok(())
}

/// Gemma 4's sequences (layers of two shapes, shared K/V, per-layer
/// inputs) and Qwen3.5's (each lane continuing its own linear layers'
/// states) batched on the fused step: each sequence gets the logits it gets
/// alone, under every policy that runs on the layout (SlimInfer is refused
/// on both).
#[test]
fn layout_sequences_decoded_together_equal_each_decoded_alone() -> Result<()> {
    for name in lcut_testkit::LAYOUT_CASES {
        let case = ReferenceCase::load(&oracle_case(name))?;
        let model = case.model(DType::F32, &Device::Cpu)?;
        let reason = model.unfused_reason()?;
        ensure!(reason.is_none(), "{name}: no fused step ({reason:?})");
        let start = case.policies[0].decode_start;
        let runs: Vec<_> = runs(model.config().num_layers, start)
            .into_iter()
            .filter(|(_, p)| !p.starts_with("slim"))
            .collect();
        ensure!(runs.len() >= 6, "{name}: {} runs", runs.len());
        check(name, &model, &case.ids, &runs)?;
    }
    Ok(())
}

/// Models with experts decoded together on the fused step (Qwen3-MoE,
/// Mixtral, gpt-oss with its sinks): each sequence still gets its own
/// routing and the tokens it gets alone.
#[test]
fn sequences_with_experts_decoded_together_equal_each_decoded_alone() -> Result<()> {
    decode_cases(&lcut_testkit::MOE_CASES, None)
}

#[test]
fn quantized_smollm2_decoded_together_equals_each_alone() -> Result<()> {
    let Some(path) = real_model() else {
        return Ok(());
    };
    let mut model = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
    model.set_kv_dtype(DType::F16)?;
    let ids: Vec<u32> = (0..40u32).map(|i| 1 + (i * 37) % 400).collect();
    let runs = vec![
        (30, "full".to_string()),
        (24, "speed:22+bos".to_string()),
        (30, "speed:15".to_string()),
    ];
    check("SmolLM2 Q4_1", &model, &ids, &runs)
}

#[test]
fn a_token_count_other_than_the_sequences_is_refused() -> Result<()> {
    let case = ReferenceCase::load(&oracle_case(ORACLE_CASES[0]))?;
    let model = case.model(DType::F32, &Device::Cpu)?;
    let mut a = prefilled(&model, &case.ids, 4, "full")?;
    let mut seqs = vec![&mut a];
    let err = model
        .forward_batch(&mut seqs, &[1, 2])
        .err()
        .context("two tokens for one sequence were accepted")?;
    ensure!(err.to_string().contains("1 sequences") && err.to_string().contains("2 tokens"));
    Ok(())
}
