//! The logit lens against Hugging Face transformers on the reference cases
//! (`fixtures/oracle/*/lens.safetensors`, made by
//! `fixtures/oracle/lens_reference.py`: `output_hidden_states` through the
//! model's own final norm and LM head, softcap included): per hidden state
//! and position, the log-probability, rank, top token and KL(final ‖
//! lens) of the token the last layer ranks first. Then the decode-time lens
//! (one token per fused step) against the teacher-forced one, and the lens
//! of the top layer against the model's own logits.

use std::collections::HashMap;

use anyhow::{Context, Result, ensure};
use lcut_model::{DType, Decoder, Device, LensProbe, LensRecord, LogitRows, ModelError, Tensor};
use lcut_testkit::{ORACLE_CASES, oracle_case};

/// Largest |difference| in a log-probability or KL allowed against
/// transformers (f32 on both sides; the logits agree to about 1e-5).
const TOL: f32 = 1e-4;

fn reference(case: &str) -> Result<HashMap<String, Tensor>> {
    let path = oracle_case(case).join("lens.safetensors");
    candle_core::safetensors::load(&path, &Device::Cpu).with_context(|| path.display().to_string())
}

fn rows_f32(r: &HashMap<String, Tensor>, key: &str) -> Result<Vec<Vec<f32>>> {
    Ok(r.get(key).context(key.to_string())?.to_vec2()?)
}

fn rows_i64(r: &HashMap<String, Tensor>, key: &str) -> Result<Vec<Vec<i64>>> {
    Ok(r.get(key)
        .context(key.to_string())?
        .to_dtype(DType::I64)?
        .to_vec2()?)
}

/// The teacher-forced lens of every position of `ids`, in position order.
fn teacher_forced(model: &Decoder, ids: &[u32]) -> Result<(Vec<LensRecord>, Tensor)> {
    let mut probe = LensProbe::new(model, 0);
    let logits = model.teacher_forced_logits(ids, Some(&mut probe))?;
    let mut records = probe.records;
    records.sort_by_key(|r| r.position);
    ensure!(records.len() == ids.len(), "{} records", records.len());
    Ok((records, logits))
}

/// lcut's records against the reference's `[sites, T]` arrays.
fn check_against(case: &str, records: &[LensRecord], r: &HashMap<String, Tensor>) -> Result<()> {
    let logprob = rows_f32(r, "logprob")?;
    let kl = rows_f32(r, "kl")?;
    let margin = rows_f32(r, "margin")?;
    let (lo, hi, top1) = (
        rows_i64(r, "rank_lo")?,
        rows_i64(r, "rank_hi")?,
        rows_i64(r, "top1")?,
    );
    let target: Vec<i64> = r["target"].to_dtype(DType::I64)?.to_vec1()?;
    let eps = 2e-3;
    let (mut worst_lp, mut worst_kl, mut tops) = (0f32, 0f32, 0);
    for rec in records {
        let t = rec.position;
        ensure!(
            i64::from(rec.target) == target[t],
            "{case} position {t}: target {} against transformers' {}",
            rec.target,
            target[t]
        );
        ensure!(
            rec.rank.len() == logprob.len(),
            "{case}: {} sites",
            rec.rank.len()
        );
        for i in 0..rec.rank.len() {
            worst_lp = worst_lp.max((rec.logprob[i] - logprob[i][t]).abs());
            worst_kl = worst_kl.max((rec.kl[i] - kl[i][t]).abs());
            let rank = i64::from(rec.rank[i]);
            ensure!(
                lo[i][t] <= rank && rank <= hi[i][t],
                "{case} site {i} position {t}: rank {rank} outside [{}, {}]",
                lo[i][t],
                hi[i][t]
            );
            if margin[i][t] > 2.0 * eps {
                ensure!(
                    i64::from(rec.top[i]) == top1[i][t],
                    "{case} site {i} position {t}: top token {} against {}",
                    rec.top[i],
                    top1[i][t]
                );
                tops += 1;
            }
        }
    }
    ensure!(
        worst_lp <= TOL && worst_kl <= TOL,
        "{case}: log-probability off by {worst_lp:e}, KL by {worst_kl:e} (> {TOL:e})"
    );
    ensure!(
        tops > records.len(),
        "{case}: only {tops} top tokens compared"
    );
    Ok(())
}

/// Every reference case, from its Hugging Face folder and from llama.cpp's
/// f32 GGUF of it (Gemma-2's norms stored as 1 + w there).
#[test]
fn the_lens_equals_transformers_on_every_reference_case() -> Result<()> {
    for case in ORACLE_CASES {
        let r = reference(case)?;
        let ids: Vec<u32> = r["input_ids"].to_dtype(DType::U32)?.to_vec1()?;
        for source in [oracle_case(case), oracle_case(case).join("model.f32.gguf")] {
            let model = Decoder::load(&source, DType::F32, &Device::Cpu)?;
            let (records, _) = teacher_forced(&model, &ids)?;
            check_against(&format!("{case} ({})", source.display()), &records, &r)?;
        }
    }
    Ok(())
}

/// The last hidden state's lens is the model's own distribution: its
/// log-probability of the top token is the log-softmax of the logits (to
/// float rounding: the lens reads through the fused step's head product,
/// the teacher-forced logits through the tensor path), its rank 1, its KL
/// 0.
#[test]
fn the_top_site_is_the_model_itself() -> Result<()> {
    for case in ["llama-gqa", "gemma2-softcap"] {
        let r = reference(case)?;
        let ids: Vec<u32> = r["input_ids"].to_dtype(DType::U32)?.to_vec1()?;
        let model = Decoder::load(&oracle_case(case), DType::F32, &Device::Cpu)?;
        let (records, logits) = teacher_forced(&model, &ids)?;
        let lsm: Vec<Vec<f32>> =
            candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1)?.to_vec2()?;
        let top = lcut_model::argmax_rows(&logits)?;
        for rec in &records {
            let last = rec.rank.len() - 1;
            let t = rec.position;
            ensure!(
                rec.target == top[t] && rec.top[last] == top[t],
                "{case} {t}"
            );
            ensure!(rec.rank[last] == 1 && rec.kl[last] == 0.0, "{case} {t}");
            let want = lsm[t][top[t] as usize];
            ensure!(
                (rec.logprob[last] - want).abs() <= 1e-5,
                "{case} {t}: {} vs {want}",
                rec.logprob[last]
            );
        }
    }
    Ok(())
}

/// Decoding one token at a time (the fused step, which every reference
/// architecture takes on the CPU) gives the lens teacher forcing gives, at
/// every decode position; named targets are honoured.
#[test]
fn the_decode_time_lens_equals_the_teacher_forced_one() -> Result<()> {
    for case in ORACLE_CASES {
        let r = reference(case)?;
        let ids: Vec<u32> = r["input_ids"].to_dtype(DType::U32)?.to_vec1()?;
        let model = Decoder::load(&oracle_case(case), DType::F32, &Device::Cpu)?;
        ensure!(
            model.unfused_reason()?.is_none(),
            "{case} does not take the fused step"
        );
        let (forced, _) = teacher_forced(&model, &ids)?;
        let s = 28;
        let mut probe = LensProbe::new(&model, s - 1);
        let mut seq = model.new_full_sequence();
        model.forward(&mut seq, &ids[..s], LogitRows::Last, Some(&mut probe))?;
        for i in s..ids.len() {
            model.forward(&mut seq, &ids[i..=i], LogitRows::Last, Some(&mut probe))?;
        }
        ensure!(probe.records.len() == ids.len() - s + 1, "{case}");
        for rec in &probe.records {
            let want = &forced[rec.position];
            ensure!(
                rec.target == want.target && rec.top == want.top,
                "{case} {}",
                rec.position
            );
            ensure!(rec.rank == want.rank, "{case} {}: ranks", rec.position);
            for (a, b) in rec
                .logprob
                .iter()
                .chain(&rec.kl)
                .zip(want.logprob.iter().chain(&want.kl))
            {
                ensure!((a - b).abs() <= 2e-5, "{case} {}: {a} vs {b}", rec.position);
            }
        }
    }
    Ok(())
}

/// Hidden states that do not fit the model are a named error.
#[test]
fn misshapen_hidden_states_are_refused() -> Result<()> {
    let model = Decoder::load(&oracle_case("llama-gqa"), DType::F32, &Device::Cpu)?;
    let d = model.config().hidden_size;
    let good = Tensor::zeros((2, d), DType::F32, &Device::Cpu)?;
    let narrow = Tensor::zeros((2, d - 1), DType::F32, &Device::Cpu)?;
    let err = model
        .lens_records(&[good.clone(), narrow], &[0, 1], None, None)
        .unwrap_err();
    ensure!(matches!(err, ModelError::LensInput { .. }), "{err:?}");
    ensure!(err.to_string().contains("site 1"), "{err}");
    let err = model
        .lens_records(&[good], &[0, 1], Some(&[1]), None)
        .unwrap_err();
    ensure!(
        err.to_string().contains("1 targets for 2 positions"),
        "{err}"
    );
    Ok(())
}

/// Kept logits are each position's `[sites, vocab]`, and their log-softmax
/// at the target is the recorded log-probability.
#[test]
fn kept_logits_are_the_records_logits() -> Result<()> {
    let model = Decoder::load(&oracle_case("qwen2-bias"), DType::F32, &Device::Cpu)?;
    let ids: Vec<u32> = reference("qwen2-bias")?["input_ids"]
        .to_dtype(DType::U32)?
        .to_vec1()?;
    let mut probe = LensProbe::new(&model, ids.len() - 3).keeping_logits();
    model.teacher_forced_logits(&ids, Some(&mut probe))?;
    let kept = probe.take_logits();
    ensure!(kept.len() == 3 && probe.take_logits().is_empty());
    let sites = model.config().num_layers + 1;
    for ((position, z), rec) in kept.iter().zip(&probe.records) {
        ensure!(*position == rec.position);
        ensure!(
            z.dims() == [sites, model.config().vocab_size],
            "{:?}",
            z.dims()
        );
        let lsm: Vec<Vec<f32>> =
            candle_nn::ops::log_softmax(z, candle_core::D::Minus1)?.to_vec2()?;
        ensure!(lsm.len() == sites && rec.logprob.len() == sites);
        for (row, &want) in lsm.iter().zip(&rec.logprob) {
            let got = row[rec.target as usize];
            ensure!((got - want).abs() <= 1e-5, "{got} vs {want}");
        }
    }
    Ok(())
}
