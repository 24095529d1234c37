//! A chunk's experts on lcut's kernels: where every expert's matrices are
//! read in place from a mapped GGUF file, the chunk's rows are grouped by
//! the experts they chose and each chosen expert runs its gate, up and down
//! products once over its rows (the products of a dense quantized chunk,
//! [`MappedMatrix::product`]; the gate and up read the rows quantized
//! once), its output weighted into theirs. The same products and sums in
//! the same order as [`Experts::forward_routed`], without a tensor per
//! expert.

use candle_core::{DType, Tensor};
use lcut_kernels::ops::{self, GateActivation};

use crate::error::{ModelError, Result};
use crate::layers::{Experts, GateUpLinears, Mlp, Routing};
use crate::linear::{DEQUANTIZE_ROWS, Linear};
use crate::mapped::{MappedMatrix, ProductInput};

/// A matrix read in place and its bias in f32.
struct HostLinear<'a> {
    matrix: &'a MappedMatrix,
    bias: Option<Vec<f32>>,
}

impl<'a> HostLinear<'a> {
    /// `lin` where it is read in place (not adapted, not dense).
    fn of(lin: &'a Linear) -> Result<Option<Self>> {
        let Linear::Mapped { matrix, bias } = lin else {
            return Ok(None);
        };
        let bias = match bias {
            Some(b) => Some(b.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            None => None,
        };
        Ok(Some(Self { matrix, bias }))
    }

    /// `x W^T (+ b)` of `input`'s rows into `y` [n, rows].
    fn product(
        &self,
        input: &mut ProductInput<'_>,
        n: usize,
        y: &mut Vec<f32>,
        scratch: &mut Vec<f32>,
    ) -> Result<()> {
        let rows = self.matrix.dims().0;
        y.clear();
        y.resize(n * rows, 0.0);
        self.matrix.product(input, DEQUANTIZE_ROWS, y, scratch)?;
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(rows) {
                ops::add_bias_in_place(row, b)?;
            }
        }
        Ok(())
    }
}

/// One expert's matrices, where all three are read in place.
struct HostExpert<'a> {
    gate: HostLinear<'a>,
    up: HostLinear<'a>,
    down: HostLinear<'a>,
}

impl<'a> HostExpert<'a> {
    fn of(mlp: &'a Mlp) -> Result<Option<Self>> {
        let GateUpLinears::Separate(gate, up) = mlp.gate_up() else {
            return Ok(None);
        };
        Ok(
            match (
                HostLinear::of(gate)?,
                HostLinear::of(up)?,
                HostLinear::of(mlp.down())?,
            ) {
                (Some(gate), Some(up), Some(down)) => Some(Self { gate, up, down }),
                _ => None,
            },
        )
    }
}

/// The experts' output for rows `x` [n, hidden] routed by `routing`: the
/// grouped products where every expert is read in place and `x` is f32 on
/// the CPU, [`Experts::forward_routed`] otherwise.
pub(crate) fn experts_forward(experts: &Experts, x: &Tensor, routing: &Routing) -> Result<Tensor> {
    match grouped(experts, x, routing)? {
        Some(out) => experts.with_shared(x, out),
        None => experts.forward_routed(x, routing, None),
    }
}

/// The grouped products, or `None` where they do not apply.
fn grouped(experts: &Experts, x: &Tensor, routing: &Routing) -> Result<Option<Tensor>> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        return Ok(None);
    }
    let mut host = Vec::with_capacity(experts.experts().len());
    for mlp in experts.experts() {
        match HostExpert::of(mlp)? {
            Some(e) => host.push(e),
            None => return Ok(None),
        }
    }
    let Some(activation) = experts.experts().first().map(Mlp::gate_activation) else {
        return Ok(None);
    };
    let (n, d) = x.dims2()?;
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    // each expert's rows, ascending, and their weights
    let mut groups = vec![Vec::new(); host.len()];
    for (r, (chosen, weights)) in routing.experts.iter().zip(&routing.weights).enumerate() {
        for (&e, &w) in chosen.iter().zip(weights) {
            groups
                .get_mut(e)
                .ok_or(ModelError::LayerProgram {
                    what: "a routed expert past the layer's experts",
                })?
                .push((r, w));
        }
    }
    let mut out = vec![0f32; n * d];
    let mut b = Buffers::default();
    for (expert, rows) in host.iter().zip(&groups) {
        if rows.is_empty() {
            continue;
        }
        run_expert(expert, activation, (&xs, d), rows, &mut b)?;
        for (y, &(r, w)) in b.y.chunks_exact(d).zip(rows) {
            out[r * d..(r + 1) * d]
                .iter_mut()
                .zip(y)
                .for_each(|(o, v)| *o += v * w);
        }
    }
    Ok(Some(Tensor::from_vec(out, (n, d), x.device())?))
}

/// Host buffers reused across a chunk's experts.
#[derive(Default)]
struct Buffers {
    rows: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    y: Vec<f32>,
    scratch: Vec<f32>,
}

/// One expert over its `rows` of `xs` [.., d]: its output rows into `b.y`.
fn run_expert(
    expert: &HostExpert<'_>,
    activation: GateActivation,
    (xs, d): (&[f32], usize),
    rows: &[(usize, f32)],
    b: &mut Buffers,
) -> Result<()> {
    let k = rows.len();
    b.rows.clear();
    for &(r, _) in rows {
        b.rows.extend_from_slice(&xs[r * d..(r + 1) * d]);
    }
    let mut input = ProductInput::new(&b.rows, k, d);
    expert
        .gate
        .product(&mut input, k, &mut b.gate, &mut b.scratch)?;
    expert
        .up
        .product(&mut input, k, &mut b.up, &mut b.scratch)?;
    ops::gate_in_place(&mut b.gate, &b.up, activation)?;
    let inner = b.gate.len() / k;
    let mut gated = ProductInput::new(&b.gate, k, inner);
    expert.down.product(&mut gated, k, &mut b.y, &mut b.scratch)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use lcut_kernels::testdata::Rng;
    use lcut_testkit::grads::{max_abs_diff, normal};

    use super::*;
    use crate::decoder::Decoder;
    use crate::decoder::WeightMode;
    use crate::layers::FeedForward;

    /// Each sparse layer's experts of `file` kept quantized, run on `rows`
    /// drawn rows grouped and through the tensor path: the largest
    /// difference against the largest output (an error where the grouped
    /// products did not run).
    fn compare(case: &str, file: &str, rows: usize) -> anyhow::Result<f32> {
        let path = lcut_testkit::oracle_case(case).join(file);
        let dec = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
        let mut rng = Rng::new(7);
        let mut worst = 0f32;
        let mut layers = 0;
        for layer in &dec.layers {
            let FeedForward::Experts(experts) = &layer.mlp else {
                continue;
            };
            let x = normal(&mut rng, 0.0, 1.0, &[rows, dec.cfg.hidden_size])?;
            let routing = experts.route(&x)?;
            let ours = grouped(experts, &x, &routing)?
                .ok_or_else(|| anyhow::anyhow!("{case}: the grouped products did not run"))?;
            let theirs = experts.forward_routed(&x, &routing, None)?;
            let scale = theirs.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
            worst = worst.max(max_abs_diff(&ours, &theirs) / scale);
            layers += 1;
        }
        anyhow::ensure!(layers > 0, "{case}: no layer of experts");
        Ok(worst)
    }

    /// Qwen3-MoE and Mixtral (SiLU, Q8_0) and gpt-oss (MXFP4 experts with
    /// biases and the clamped SwiGLU): the grouped products are the tensor
    /// path's bit for bit (both gate with the kernels' activation), at a few
    /// rows per expert (the batched product), tens (the chunk product) and
    /// more than `DEQUANTIZE_ROWS` (Q8_0's dequantized product on narrow
    /// matrices).
    #[test]
    fn grouped_experts_equal_the_tensor_path_bit_for_bit() -> anyhow::Result<()> {
        for (case, file) in [
            ("moe/qwen3moe-sparse", "model.q8_0.gguf"),
            ("moe/mixtral-top2", "model.q8_0.gguf"),
            ("moe/gptoss-gguf", "model.mxfp4.gguf"),
        ] {
            for rows in [5, 40, 150] {
                let d = compare(case, file, rows)?;
                anyhow::ensure!(
                    d == 0.0,
                    "{case}, {rows} rows: differs by {d:e} of the largest"
                );
            }
        }
        Ok(())
    }

    /// The stacked experts (a GPU's) against each expert run on its own
    /// rows, on every family's reference weights: Qwen3-MoE, Mixtral,
    /// gpt-oss (biases, the clamped SwiGLU, stacked in its checkpoint),
    /// Gemma 4 (experts beside the dense MLP, a learned scale per expert)
    /// and Qwen3.5-MoE (a shared expert); one row (a decode step) and rows
    /// whose choices just fit the experts (the gathered products), and 32
    /// times as many (the padded ones). The sums run in another order, so
    /// within 1e-5 of the largest output.
    #[test]
    fn stacked_experts_match_each_expert_run_alone() -> anyhow::Result<()> {
        for case in [
            "moe/qwen3moe-sparse",
            "moe/mixtral-top2",
            "moe/gptoss-sinks",
            "layouts/gemma4-moe",
            "layouts/qwen35moe-shared",
        ] {
            let path = lcut_testkit::oracle_case(case);
            let dec = Decoder::load_as(&path, WeightMode::Dense(DType::F32), &Device::Cpu)?;
            let mut rng = Rng::new(11);
            let mut blocks = 0;
            for layer in &dec.layers {
                let (FeedForward::Experts(experts) | FeedForward::DenseAndExperts(_, experts)) =
                    &layer.mlp
                else {
                    continue;
                };
                let stacked = experts.clone().stacked()?;
                anyhow::ensure!(stacked.is_stacked(), "{case}: the experts were not stacked");
                let d = dec.cfg.hidden_size;
                let top_k = experts
                    .route(&normal(&mut rng, 0.0, 1.0, &[1, d])?)?
                    .experts[0]
                    .len();
                let fit = experts.experts().len() / top_k;
                for rows in [1, fit, 32 * fit] {
                    let x = normal(&mut rng, 0.0, 1.0, &[rows, d])?;
                    let routing = experts.route(&x)?;
                    let theirs = experts.forward_routed(&x, &routing, None)?;
                    let ours = stacked.stacked_output(&x, &routing)?.ok_or_else(|| {
                        anyhow::anyhow!("{case}, {rows} rows: the stacks did not run")
                    })?;
                    let ours = stacked.with_shared(&x, ours)?;
                    let scale = theirs.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
                    let d = max_abs_diff(&ours, &theirs) / scale;
                    anyhow::ensure!(d <= 1e-5, "{case}, {rows} rows: {d:e} of the largest");
                }
                blocks += 1;
            }
            anyhow::ensure!(blocks > 0, "{case}: no block of experts");
        }
        Ok(())
    }
}
