//! The gated delta rule over a run of rows in chunks, as transformers'
//! `torch_chunk_gated_delta_rule` and the FLA kernels compute a prefill:
//! within a chunk the rows' updates are condensed into matrix products
//! (the UT transform: a unit lower-triangular system, here inverted in
//! blocks), and the state moves once per chunk. It is the recurrence's sum
//! in another order, so within rounding of the row-by-row form
//! ([`super::GatedDeltaNet::forward`] on the host); every step is a tensor
//! op, so on a GPU the rows stay on the device and only the state (one
//! `d_k x d_v` matrix a value head) crosses to the host and back.

use candle_core::{D, DType, Device, Tensor};

use crate::error::Result;

/// Rows a chunk condenses: transformers' and the FLA kernels' 64.
pub(crate) const CHUNK: usize = 64;

/// Below this size a unit lower-triangular block is inverted row by row.
const LEAF: usize = 8;

/// The variable that chooses the form for a model's linear layers as it
/// loads: rows in a chunk (a power of two), or 0 for row by row on the host.
pub(crate) const CHUNK_ENV: &str = "LCUT_LINEAR_CHUNK";

/// Rows in a chunk for a model loaded on `device` ([`CHUNK_ENV`] where it
/// is set, else row by row on the CPU and [`CHUNK`] elsewhere); a value
/// that is neither 0 nor a power of two is said and the default holds.
pub(crate) fn chunk_for(device: &Device) -> Option<usize> {
    let set = std::env::var(CHUNK_ENV).ok();
    let (chunk, ignored) = chosen_chunk(set.as_deref(), device.is_cpu());
    if let Some(value) = ignored {
        eprintln!("{CHUNK_ENV}={value:?} is neither 0 nor a power of two: ignored");
    }
    chunk
}

/// The chunk for [`CHUNK_ENV`]'s value `set` on the CPU or not, and the
/// value when it was set but is neither 0 nor a power of two.
fn chosen_chunk(set: Option<&str>, on_cpu: bool) -> (Option<usize>, Option<String>) {
    let default = (!on_cpu).then_some(CHUNK);
    match set.map(str::trim) {
        None | Some("") => (default, None),
        Some(value) => match value.parse::<usize>() {
            Ok(0) => (None, None),
            Ok(rows) if rows.is_power_of_two() => (Some(rows), None),
            _ => (default, Some(value.to_string())),
        },
    }
}

/// The delta rule's inputs for `m` rows of every value head, in f32,
/// value heads first: queries and keys `[value_heads, m, d_k]` (each value
/// head's key head's, L2-normed, the queries scaled), values
/// `[value_heads, m, d_v]`, each row's log decay `g` (the state is
/// multiplied by `exp(g)`) and learning rate `beta`, both `[value_heads,
/// m]`.
pub(crate) struct DeltaRows {
    pub(crate) q: Tensor,
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
    pub(crate) g: Tensor,
    pub(crate) beta: Tensor,
}

/// The rows' outputs `[value_heads, m, d_v]` and the state
/// `[value_heads, d_k, d_v]` after them, from `state`, in chunks of
/// `chunk` rows (a power of two). Every row enters the state.
pub(crate) fn delta_rule_in_chunks(
    rows: &DeltaRows,
    state: &Tensor,
    chunk: usize,
) -> Result<(Tensor, Tensor)> {
    debug_assert!(chunk.is_power_of_two());
    let (hv, m, dk) = rows.q.dims3()?;
    let dv = rows.v.dim(2)?;
    let dev = rows.q.device();
    let pad = (chunk - m % chunk) % chunk;
    let chunks = (m + pad) / chunk;
    // padded rows have no rate and no decay: they leave the state as it is
    let chunked = |x: &Tensor, width: usize| -> Result<Tensor> {
        Ok(x.pad_with_zeros(1, 0, pad)?
            .reshape((hv, chunks, chunk, width))?)
    };
    let q = chunked(&rows.q, dk)?;
    let k = chunked(&rows.k, dk)?;
    let v = chunked(&rows.v, dv)?;
    let beta = chunked(&rows.beta.unsqueeze(2)?, 1)?;
    let g = chunked(&rows.g.unsqueeze(2)?, 1)?.squeeze(3)?;
    let (k_beta, v_beta) = (k.broadcast_mul(&beta)?, v.broadcast_mul(&beta)?);
    // the log decay from the chunk's start to each row, and between rows
    // (rows later than the reader masked out before the exponential)
    let cum = g.cumsum(2)?;
    let later = mask(
        chunk,
        dev,
        |i, j| if j > i { f32::NEG_INFINITY } else { 0.0 },
    )?;
    let between = cum
        .unsqueeze(3)?
        .broadcast_sub(&cum.unsqueeze(2)?)?
        .broadcast_add(&later)?
        .exp()?;
    let kt = k.transpose(2, 3)?.contiguous()?;
    // I + the strictly lower part of (beta k) k^T, decayed: the UT system
    let earlier = mask(chunk, dev, |i, j| f32::from(u8::from(j < i)))?;
    let eye = mask(chunk, dev, |i, j| f32::from(u8::from(j == i)))?;
    let system = k_beta
        .matmul(&kt)?
        .mul(&between)?
        .broadcast_mul(&earlier)?
        .broadcast_add(&eye)?;
    let within = q.matmul(&kt)?.mul(&between)?;
    let from_start = cum.exp()?.unsqueeze(3)?;
    let solved = unit_lower_inverse(&system)?.matmul(&Tensor::cat(
        &[&v_beta, &k_beta.broadcast_mul(&from_start)?],
        3,
    )?)?;
    let (new_values, k_cumdecay) = (solved.narrow(3, 0, dv)?, solved.narrow(3, dv, dk)?);
    let q_decayed = q.broadcast_mul(&from_start)?;
    let last = cum.narrow(2, chunk - 1, 1)?;
    let k_to_end = k.broadcast_mul(&last.broadcast_sub(&cum)?.exp()?.unsqueeze(3)?)?;
    let chunk_decay = last.exp()?.unsqueeze(3)?;
    // the scan over chunks: each reads the state the chunks before left
    let mut s = state.to_dtype(DType::F32)?;
    let mut outs = Vec::with_capacity(chunks);
    for i in 0..chunks {
        let at =
            |x: &Tensor| -> Result<Tensor> { Ok(x.narrow(1, i, 1)?.squeeze(1)?.contiguous()?) };
        let v_new = (at(&new_values)? - at(&k_cumdecay)?.matmul(&s)?)?;
        outs.push((at(&q_decayed)?.matmul(&s)? + at(&within)?.matmul(&v_new)?)?);
        let written = at(&k_to_end)?.t()?.contiguous()?.matmul(&v_new)?;
        s = (s.broadcast_mul(&at(&chunk_decay)?)? + written)?;
    }
    let out = Tensor::cat(&outs, 1)?.narrow(1, 0, m)?;
    Ok((out, s))
}

/// A `[n, n]` f32 matrix of `entry(row, column)`.
fn mask(n: usize, dev: &Device, entry: impl Fn(usize, usize) -> f32) -> Result<Tensor> {
    let values: Vec<f32> = (0..n * n).map(|x| entry(x / n, x % n)).collect();
    Ok(Tensor::from_vec(values, (n, n), dev)?)
}

/// The inverse of each unit lower-triangular matrix in `m` `[.., n, n]`
/// (`n` a power of two).
fn unit_lower_inverse(m: &Tensor) -> Result<Tensor> {
    let n = m.dim(D::Minus1)?;
    let batch = m.elem_count() / (n * n).max(1);
    Ok(inverse_in_halves(&m.reshape((batch, n, n))?)?.reshape(m.shape())?)
}

/// [`unit_lower_inverse`] of `[batch, n, n]`: the two diagonal halves
/// inverted together (as one batch twice as large), and the block below
/// them as `-B^-1 C A^-1`.
fn inverse_in_halves(m: &Tensor) -> Result<Tensor> {
    let (batch, n, _) = m.dims3()?;
    if n <= LEAF {
        return leaf_inverse(m);
    }
    let h = n / 2;
    let block = |r: usize, c: usize| -> Result<Tensor> { Ok(m.narrow(1, r, h)?.narrow(2, c, h)?) };
    let halves = inverse_in_halves(&Tensor::cat(&[block(0, 0)?, block(h, h)?], 0)?)?;
    let (top, bottom) = (halves.narrow(0, 0, batch)?, halves.narrow(0, batch, batch)?);
    let below = bottom
        .matmul(&block(h, 0)?.contiguous()?)?
        .matmul(&top)?
        .neg()?;
    let upper = Tensor::cat(&[&top, &top.zeros_like()?], 2)?;
    let lower = Tensor::cat(&[&below, &bottom], 2)?;
    Ok(Tensor::cat(&[&upper, &lower], 1)?)
}

/// [`unit_lower_inverse`] of small matrices `[batch, n, n]`, row by row
/// (forward substitution: row i is e_i minus the row's entries left of the
/// diagonal times the rows before it).
fn leaf_inverse(m: &Tensor) -> Result<Tensor> {
    let (batch, n, _) = m.dims3()?;
    let eye = mask(n, m.device(), |i, j| f32::from(u8::from(j == i)))?;
    let unit = |i: usize| -> Result<Tensor> {
        Ok(eye
            .narrow(0, i, 1)?
            .unsqueeze(0)?
            .broadcast_as((batch, 1, n))?
            .contiguous()?)
    };
    let mut done = unit(0)?;
    for i in 1..n {
        let left = m.narrow(1, i, 1)?.narrow(2, 0, i)?.contiguous()?;
        let row = (unit(i)? - left.matmul(&done)?)?;
        done = Tensor::cat(&[&done, &row], 1)?;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_kernels::testdata::Rng;

    /// The variable's values: unset or empty keeps the device's default, 0
    /// is row by row, a power of two is the chunk, anything else is said.
    #[test]
    fn the_chunk_is_the_devices_unless_set() {
        assert_eq!(chosen_chunk(None, true), (None, None));
        assert_eq!(chosen_chunk(None, false), (Some(CHUNK), None));
        assert_eq!(chosen_chunk(Some(" "), false), (Some(CHUNK), None));
        assert_eq!(chosen_chunk(Some("0"), false), (None, None));
        assert_eq!(chosen_chunk(Some("32"), true), (Some(32), None));
        for bad in ["48", "-1", "many"] {
            assert_eq!(chosen_chunk(Some(bad), true), (None, Some(bad.into())));
        }
    }

    /// The inverse of random unit lower-triangular matrices of each size,
    /// against their product with the matrix being the identity.
    #[test]
    fn unit_lower_inverses_invert() -> Result<()> {
        let mut rng = Rng::new(3);
        for n in [1, 2, 4, 8, 16, 64] {
            let values: Vec<f32> = (0..3 * n * n)
                .map(|x| {
                    let (i, j) = ((x / n) % n, x % n);
                    match j.cmp(&i) {
                        std::cmp::Ordering::Less => rng.normal() * 0.3,
                        std::cmp::Ordering::Equal => 1.0,
                        std::cmp::Ordering::Greater => 0.0,
                    }
                })
                .collect();
            let m = Tensor::from_vec(values, (3, n, n), &Device::Cpu)?;
            let product = m.matmul(&unit_lower_inverse(&m)?)?;
            let eye = mask(n, &Device::Cpu, |i, j| f32::from(u8::from(j == i)))?;
            let err = product
                .broadcast_sub(&eye)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f32>()?;
            assert!(err < 1e-4, "n = {n}: M M^-1 differs from I by {err}");
        }
        Ok(())
    }
}
