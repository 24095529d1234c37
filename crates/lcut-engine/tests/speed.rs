//! SPEED in the engine: full-depth equivalence, KV bytes equal to the cost
//! formula, no prefill K/V or hidden state above the cutoff, and the decode
//! start taken from a chat template.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use lcut_engine::{Generation, GenerationConfig, PreparedPrompt, Session};
use lcut_model::probes::StatePositionsProbe;
use lcut_model::{DType, Decoder, Device, LlamaShape};
use lcut_policy::{Anchors, Phase, Policy, PolicyKind, PolicySpec};
use lcut_synth::RandomLlama;

use lcut_testkit::oracle_case as oracle;

fn reference_ids(name: &str) -> Result<Vec<u32>> {
    Ok(lcut_testkit::oracle_ids(name)?)
}

fn greedy(max_new_tokens: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        ..GenerationConfig::default()
    }
}

#[test]
fn speed_at_full_depth_equals_full_bit_for_bit() -> Result<()> {
    for case in ["llama-gqa", "gemma2-softcap", "mistral-window"] {
        let model = Decoder::load(&oracle(case), DType::F32, &Device::Cpu)?;
        let layers = model.config().num_layers;
        let prompt = PreparedPrompt::from_ids(reference_ids(case)?[..30].to_vec(), Some(24))?;
        let mut full = Generation::new(&model, prompt.clone(), Policy::full(layers), greedy(10))?;
        let spec: PolicySpec = format!("speed:{layers}+bos").parse()?;
        let mut speed = Generation::new(&model, prompt, spec.resolve(layers)?, greedy(10))?;
        while let Some(a) = full.step(None)? {
            let b = speed.step(None)?.context("speed stopped early")?;
            ensure!(
                a.token == b.token,
                "{case}: token {} vs {}",
                a.token,
                b.token
            );
            let diff: f32 = (&a.logits - &b.logits)?.abs()?.max(0)?.to_scalar()?;
            ensure!(
                diff == 0.0,
                "{case}: logits differ by {diff} at step {}",
                a.index
            );
        }
        ensure!(speed.step(None)?.is_none());
    }
    Ok(())
}

/// What `lcut eval --suite` relies on to run a prompt once for the full
/// model and SPEED: a SPEED generation that goes on from the full run's
/// state before the decode start, restricted to the policy, is the
/// policy's own generation (same tokens, logits within 1e-5 of the
/// largest), with and without the BoS anchor.
#[test]
fn a_generation_from_the_full_prefill_restricted_is_the_policy_s_own() -> Result<()> {
    for case in ["llama-gqa", "qwen2-bias", "gemma2-softcap"] {
        let model = Decoder::load(&oracle(case), DType::F32, &Device::Cpu)?;
        let layers = model.config().num_layers;
        let prompt = PreparedPrompt::from_ids(reference_ids(case)?[..30].to_vec(), Some(24))?;
        let mut full = Generation::new(&model, prompt.clone(), Policy::full(layers), greedy(8))?;
        ensure!(full.prefill_to_decode_start(|_| true)?);
        for spec in ["speed:2+bos", "speed:2", "speed:1+bos"] {
            let policy = spec.parse::<PolicySpec>()?.resolve(layers)?;
            let prefix = full
                .sequence()
                .restricted(policy, prompt.phases(&policy)?)?;
            let mut shared = Generation::from_prefix(&model, prompt.clone(), prefix, greedy(8))?;
            let mut own = Generation::new(&model, prompt.clone(), policy, greedy(8))?;
            while let Some(a) = own.step(None)? {
                let b = shared.step(None)?.context("the shared run stopped early")?;
                ensure!(
                    a.token == b.token,
                    "{case} {spec}: token {} vs {}",
                    a.token,
                    b.token
                );
                let diff: f32 = (&a.logits - &b.logits)?.abs()?.max(0)?.to_scalar()?;
                let top: f32 = a.logits.abs()?.max(0)?.to_scalar()?;
                ensure!(
                    diff <= 1e-5 * top,
                    "{case} {spec}: logits differ by {diff} (largest {top}) at step {}",
                    a.index
                );
            }
            ensure!(shared.step(None)?.is_none());
        }
    }
    Ok(())
}

/// A state that does not hold exactly the prompt's tokens before its
/// decode start cannot be continued: the error says how many it holds.
#[test]
fn a_prefix_of_another_length_is_refused() -> Result<()> {
    let model = Decoder::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    let layers = model.config().num_layers;
    let ids = reference_ids("llama-gqa")?;
    let short = PreparedPrompt::from_ids(ids[..20].to_vec(), Some(16))?;
    let mut full = Generation::new(&model, short, Policy::full(layers), greedy(4))?;
    ensure!(full.prefill_to_decode_start(|_| true)?);
    let prompt = PreparedPrompt::from_ids(ids[..30].to_vec(), Some(24))?;
    let err = Generation::from_prefix(&model, prompt, full.sequence().fork()?, greedy(4))
        .err()
        .context("a 16-token prefix of a prompt whose decode start is 24 was accepted")?;
    let msg = err.to_string();
    ensure!(msg.contains("16") && msg.contains("24"), "{msg}");
    Ok(())
}

fn small_random_model(dir: &Path, layers: usize) -> Result<Decoder> {
    RandomLlama {
        shape: LlamaShape {
            vocab_size: 256,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: layers,
            num_heads: 4,
            num_kv_heads: 2,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 4096,
            layout: lcut_model::Layout::Llama,
        },
        seed: 3,
    }
    .write(dir)?;
    Ok(Decoder::load(dir, DType::F32, &Device::Cpu)?)
}

#[test]
fn kv_bytes_held_equal_the_cost_formula() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let layers = 6;
    let model = small_random_model(dir.path(), layers)?;
    let b = model.kv_shape().bytes_per_token_layer() as u64;
    let l = layers as u64;
    // (prompt length, decode start, new tokens, cutoff, anchors)
    let cases = [
        (40, 39, 5, 4, Anchors::Bos),
        (40, 30, 7, 1, Anchors::Bos),
        (100, 95, 3, 5, Anchors::None),
        (64, 50, 9, 3, Anchors::Prefix(6)),
        (17, 16, 1, 6, Anchors::Bos),
        (700, 690, 4, 2, Anchors::Bos), // more than one prefill chunk
    ];
    for (p, s, new, cut, anchors) in cases {
        let ids: Vec<u32> = (0..p as u32).map(|i| 3 + (i * 37) % 250).collect();
        let prompt = PreparedPrompt::from_ids(ids, Some(s))?;
        let policy = Policy::new(PolicyKind::Speed, cut, layers, anchors)?;
        let config = GenerationConfig {
            prefill_chunk: 256,
            ..greedy(new)
        };
        let out = Generation::new(&model, prompt, policy, config)?.run(|_| true)?;
        let a = anchors.len(None)? as u64;
        let prefill = s as u64 - a;
        // decode-phase tokens processed: the prompt's s..p, then every output token but the last
        let d = (p - s) as u64 + out.tokens.len() as u64 - 1;
        let formula = b * (cut as u64 * prefill + l * (a + d));
        ensure!(
            out.kv_bytes_held == formula,
            "{policy} P={p}: held {} != {formula}",
            out.kv_bytes_held
        );
        ensure!(out.kv_bytes_formula == formula);
        ensure!(out.kv_bytes_full == b * l * (a + prefill + d));
    }
    Ok(())
}

/// On the layouts counted layer by layer (Gemma 4's shared K/V, Qwen3.5's
/// layers without K/V) the K/V a decode step reads is the K/V held, and
/// both are what the sequence holds: the bench's `res. x` column and the
/// memory line count the full layers only.
#[test]
fn layered_layouts_read_the_kv_they_hold() -> Result<()> {
    for case in [lcut_testkit::GEMMA4_CASE, lcut_testkit::QWEN35_CASE] {
        let model = Decoder::load(&oracle(case), DType::F32, &Device::Cpu)?;
        let layers = model.config().num_layers;
        let ids = reference_ids(case)?;
        let prompt = PreparedPrompt::from_ids(ids[..24].to_vec(), Some(21))?;
        for text in ["full", "speed:4+bos", "speed:2"] {
            let policy = text.parse::<PolicySpec>()?.resolve(layers)?;
            let out = Generation::new(&model, prompt.clone(), policy, greedy(5))?.run(|_| true)?;
            ensure!(
                out.kv_bytes_resident == out.kv_bytes_formula
                    && out.kv_bytes_formula == out.kv_bytes_held,
                "{case} {text}: resident {}, formula {}, held {}",
                out.kv_bytes_resident,
                out.kv_bytes_formula,
                out.kv_bytes_held
            );
            ensure!(out.kv_bytes_held <= out.kv_bytes_full, "{case} {text}");
        }
    }
    Ok(())
}

#[test]
fn prefill_tokens_never_exist_or_keep_kv_above_the_cutoff() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let layers = 6;
    let model = small_random_model(dir.path(), layers)?;
    let ids: Vec<u32> = (0..300u32).map(|i| 3 + (i * 11) % 250).collect();
    let prompt = PreparedPrompt::from_ids(ids, Some(290))?;
    let policy = Policy::new(PolicyKind::Speed, 2, layers, Anchors::Bos)?;
    let mut generation = Generation::new(&model, prompt, policy, greedy(6))?;
    let mut seen = StatePositionsProbe::new(layers);
    while generation.step(Some(&mut seen))?.is_some() {}
    let phases = *generation.phases();
    let b = model.kv_shape().bytes_per_token_layer();
    for l in 0..layers {
        let cache = &generation.sequence().caches()[l];
        let prefill_held = cache
            .positions()
            .iter()
            .filter(|&&p| phases.phase(p) == Phase::Prefill)
            .count();
        let prefill_run = seen.positions[l]
            .iter()
            .filter(|&&p| phases.phase(p) == Phase::Prefill)
            .count();
        if l < 2 {
            ensure!(
                prefill_held == 289 && prefill_run == 289,
                "layer {l}: {prefill_held} held, {prefill_run} run"
            );
        } else {
            ensure!(
                prefill_held == 0,
                "layer {l} holds {prefill_held} prefill K/V"
            );
            ensure!(
                prefill_run == 0,
                "layer {l} ran {prefill_run} prefill tokens"
            );
            // the buffers were never sized for the prompt either
            ensure!(
                cache.bytes_allocated() <= b * (1 + 10 + 6),
                "layer {l} allocated {}",
                cache.bytes_allocated()
            );
        }
    }
    Ok(())
}

#[test]
fn decode_start_is_the_first_token_of_the_generation_prompt() -> Result<()> {
    let dir = tempfile::tempdir()?;
    lcut_testkit::chat_model(
        "llama-gqa",
        dir.path(),
        &["copy", "a", "b", "c", "d", "be", "brief"],
    )?;
    let session = Session::load(dir.path(), DType::F32, &Device::Cpu)?;
    let tok = session.tokenizer.as_ref().context("tokenizer")?;
    let p = session.prepare_text("copy a b c", Some("be brief"), true)?;
    let strings = tok.token_strings(&p.ids);
    ensure!(
        strings
            == [
                "<s>",
                "<|system|>",
                "be",
                "brief",
                "<|end|>",
                "<|user|>",
                "copy",
                "a",
                "b",
                "c",
                "<|end|>",
                "<|assistant|>"
            ],
        "{strings:?}"
    );
    ensure!(p.decode_start == 11, "decode start {}", p.decode_start);
    ensure!(p.system_len == Some(5), "system span {:?}", p.system_len);
    ensure!(p.chat_template_used);
    // +system anchors keep the BoS and the system message
    let policy: PolicySpec = "speed:3+system".parse()?;
    ensure!(p.phases(&policy.resolve(6)?)?.anchor_len() == 5);
    // raw prompts: BoS prepended, the last token starts decoding
    let raw = session.prepare_text("copy a b", None, false)?;
    ensure!(raw.ids[0] == 1 && raw.decode_start == raw.ids.len() - 1);
    Ok(())
}

#[test]
fn a_cancelled_generation_says_it_was_cancelled() -> Result<()> {
    let model = Decoder::load(&oracle("llama-gqa"), DType::F32, &Device::Cpu)?;
    let prompt = PreparedPrompt::from_ids(reference_ids("llama-gqa")?[..20].to_vec(), None)?;
    let full = Policy::full(model.config().num_layers);
    let out = Generation::new(&model, prompt.clone(), full, greedy(8))?.run(|s| s.index < 2)?;
    ensure!(
        out.stop == lcut_engine::StopReason::Cancelled,
        "{:?}",
        out.stop
    );
    ensure!(out.tokens.len() == 3);
    let out = Generation::new(&model, prompt, full, greedy(3))?.run(|_| true)?;
    ensure!(
        out.stop == lcut_engine::StopReason::MaxTokens,
        "{:?}",
        out.stop
    );
    Ok(())
}
