//! Checks several of lcut-model's test files share: the oracle cases as
//! loaded models, the largest difference of two tensors, a run's top-128
//! logits against transformers', and side-by-side decoding against one
//! sequence at a time. Each test file uses part of it.

#![allow(dead_code)] // each test binary uses its own part

use anyhow::{Context, Result, ensure};
use lcut_model::{DType, Decoder, Device, LogitRows, Sequence, Tensor};
use lcut_parity::ReferenceCase;
use lcut_testkit::{ORACLE_CASES, oracle_case};

/// An oracle case as a model, its token ids and its decode start.
pub struct OracleModel {
    /// The case's name.
    pub name: &'static str,
    /// The case's model, in f32 on the CPU.
    pub model: Decoder,
    /// The case's tokens.
    pub ids: Vec<u32>,
    /// Where its decode phase starts.
    pub decode_start: usize,
}

/// Every oracle case as a model.
pub fn oracle_models() -> Result<Vec<OracleModel>> {
    models_of(&ORACLE_CASES)
}

/// The reference cases `names` as models (f32, from their folders).
pub fn models_of(names: &[&'static str]) -> Result<Vec<OracleModel>> {
    names
        .iter()
        .map(|&name| {
            let case = ReferenceCase::load(&oracle_case(name))?;
            Ok(OracleModel {
                name,
                model: case.model(DType::F32, &Device::Cpu)?,
                decode_start: case.policies[0].decode_start,
                ids: case.ids,
            })
        })
        .collect()
}

/// The largest absolute difference of two tensors of one shape.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    ensure!(
        a.dims() == b.dims(),
        "shape {:?} vs {:?}",
        a.dims(),
        b.dims()
    );
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

/// Check our logit rows `ours` against transformers' top logits per row
/// (`top_idx`, `top_val`, best first): within `tol` at transformers' top
/// positions, and the same argmax wherever transformers' best two are more
/// than `margin` apart. Returns the largest difference.
pub fn check_top_logits(
    what: &str,
    ours: &Tensor,
    top_idx: &Tensor,
    top_val: &Tensor,
    tol: f32,
    margin: f32,
) -> Result<f32> {
    let d = max_abs_diff(&ours.gather(top_idx, 1)?, top_val)?;
    ensure!(d <= tol, "{what}: top-128 logits differ by {d:e}");
    let best = lcut_model::argmax_rows(ours)?;
    let (top, top_ids) = (top_val.to_vec2::<f32>()?, top_idx.to_vec2::<u32>()?);
    for (r, (v, i)) in top.iter().zip(&top_ids).enumerate() {
        ensure!(
            v[0] - v[1] <= margin || best[r] == i[0],
            "{what} row {r}: argmax {} vs transformers {}",
            best[r],
            i[0]
        );
    }
    Ok(d)
}

/// Decode `ids[from..]` into two copies of the same sequences, `together`
/// in one batched pass per token and `alone` one sequence at a time, and
/// require bit-equal logits at every step (`keys` name the sequences).
pub fn side_by_side_equals_one_at_a_time(
    model: &Decoder,
    what: &str,
    keys: &[&str],
    (mut together, mut alone): (Vec<Sequence>, Vec<Sequence>),
    ids: &[u32],
    from: usize,
) -> Result<()> {
    for i in from..ids.len() {
        let mut refs: Vec<&mut Sequence> = together.iter_mut().collect();
        let tokens = vec![ids[i]; refs.len()];
        let batch = model.forward_batch(&mut refs, &tokens)?;
        for (k, seq) in alone.iter_mut().enumerate() {
            let one = model
                .forward(seq, &ids[i..=i], LogitRows::Last, None)?
                .logits
                .context("logits")?;
            let (a, b) = (
                one.flatten_all()?.to_vec1::<f32>()?,
                batch[k].flatten_all()?.to_vec1::<f32>()?,
            );
            ensure!(
                a == b,
                "{what} {}: step {i} side by side differs from one at a time",
                keys[k]
            );
        }
    }
    Ok(())
}
