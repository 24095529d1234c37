//! The numbers behind the heatmaps: small layer × column grids, and the
//! layer × prompt-position map re-binned to the columns on screen.
//!
//! A long prompt (128K positions) is never drawn cell by cell: a
//! [`PositionIndex`] keeps cumulative attention per layer at the trace's bin
//! edges, and [`PositionIndex::rebin`] answers "mean attention per token in
//! positions `[a, b)`" for every screen column in O(layers × columns × log bins).

use lcut_trace::{LayerCurves, PromptTrace, Tensor2, Tensor3};

/// A dense `rows × cols` grid, row-major; row = layer.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    /// Rows (layers).
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// `rows * cols` values, NaN where nothing was measured.
    pub values: Vec<f32>,
}

impl Grid {
    /// A grid from a 2-D tensor.
    pub fn from_tensor(t: &Tensor2) -> Self {
        let [rows, cols] = t.shape();
        Self {
            rows,
            cols,
            values: t.data().to_vec(),
        }
    }

    /// One column of per-layer values.
    pub fn column(values: &[f32]) -> Self {
        Self {
            rows: values.len(),
            cols: 1,
            values: values.to_vec(),
        }
    }

    /// The value at (`row`, `col`), NaN outside.
    pub fn get(&self, row: usize, col: usize) -> f32 {
        if row < self.rows && col < self.cols {
            self.values[row * self.cols + col]
        } else {
            f32::NAN
        }
    }
}

/// `[L, T, H]` → `[L, T]`: the mean over heads.
pub fn mean_over_heads(t: &Tensor3) -> Grid {
    let [l, s, h] = t.shape();
    let d = t.data();
    let values = (0..l * s)
        .map(|i| {
            let lane = &d[i * h..(i + 1) * h];
            lane.iter().sum::<f32>() / h.max(1) as f32
        })
        .collect();
    Grid {
        rows: l,
        cols: s,
        values,
    }
}

/// `[L, T, H]` → `[L, H]`: the mean over decode steps (NaN with no steps).
pub fn mean_over_steps(t: &Tensor3) -> Grid {
    let [l, s, h] = t.shape();
    let d = t.data();
    let mut values = vec![0.0f32; l * h];
    for li in 0..l {
        for k in 0..s {
            let base = (li * s + k) * h;
            for hi in 0..h {
                values[li * h + hi] += d[base + hi];
            }
        }
    }
    let n = s as f32;
    values
        .iter_mut()
        .for_each(|v| *v = if s == 0 { f32::NAN } else { *v / n });
    Grid {
        rows: l,
        cols: h,
        values,
    }
}

/// `[L, T, H]` → per layer: the mean over steps and heads.
pub fn mean_per_layer(t: &Tensor3) -> Vec<f32> {
    let [l, s, h] = t.shape();
    let n = s * h;
    t.data()
        .chunks(n.max(1))
        .take(l)
        .map(|c| {
            if n == 0 {
                f32::NAN
            } else {
                c.iter().sum::<f32>() / n as f32
            }
        })
        .collect()
}

/// The three small grids and the BoS column shown for one selection.
#[derive(Debug, Clone)]
pub struct SelectionGrids {
    /// Layer × decode step, mean prefill mass over heads.
    pub by_step: Grid,
    /// Layer × head, mean prefill mass over steps.
    pub by_head: Grid,
    /// Per-layer attention on BoS.
    pub bos: Vec<f32>,
    /// Per-layer attention on no key (a learned sink's share, gpt-oss);
    /// `None` for a model without sinks.
    pub sink: Option<Vec<f32>>,
}

impl SelectionGrids {
    /// The grids of one prompt's trace.
    pub fn of_trace(t: &PromptTrace) -> Self {
        Self {
            by_step: mean_over_heads(&t.prefill),
            by_head: mean_over_steps(&t.prefill),
            bos: mean_per_layer(&t.bos),
            sink: t.sink.as_ref().map(mean_per_layer),
        }
    }

    /// The grids of the aggregated curves (every prompt).
    pub fn of_curves(c: &LayerCurves) -> Self {
        Self {
            by_step: Grid::from_tensor(&c.prefill_by_step),
            by_head: Grid::from_tensor(&c.prefill_by_head),
            bos: c.bos.to_vec(),
            sink: (!c.sink.is_empty()).then(|| c.sink.to_vec()),
        }
    }
}

/// Cumulative prompt attention per layer at the bin edges of one trace.
#[derive(Debug, Clone)]
pub struct PositionIndex {
    layers: usize,
    edges: Vec<usize>,
    /// `layers × (bins + 1)`: mass in positions `0..edges[k]` at layer `l`.
    cum: Vec<f64>,
    /// Highest per-token density over the prefill positions.
    max_density: f32,
    /// Lowest positive per-token density over the prefill positions.
    min_positive_density: f32,
}

impl PositionIndex {
    /// Builds the index of `trace.prompt_attention` (one pass over the bins).
    /// The colour range comes from the prefill bins (BoS and the decode-phase
    /// tokens, which take most of the mass, would wash the prompt out), or
    /// from every bin but BoS when no bin is purely prefill.
    pub fn new(trace: &PromptTrace) -> Self {
        let [layers, bins] = trace.prompt_attention.shape();
        let edges = trace.bin_edges.clone();
        let data = trace.prompt_attention.data();
        let (p0, s) = (trace.prefill_start(), trace.decode_start);
        // Per bin, once: 1 / width, and whether it is BoS (0), purely prefill
        // (1) or anything else (2).
        let inv_width: Vec<f32> = edges
            .windows(2)
            .map(|w| 1.0 / (w[1] - w[0]).max(1) as f32)
            .collect();
        let kind: Vec<u8> = edges
            .windows(2)
            .map(|w| match (w[0], w[1]) {
                (0, _) => 0,
                (a, b) if a >= p0 && b <= s => 1,
                _ => 2,
            })
            .collect();
        let mut cum = Vec::with_capacity(layers * (bins + 1));
        // (lowest positive, highest) density of prefill bins and of the others.
        let mut bounds = [(f32::INFINITY, 0.0f32); 3];
        for row in data.chunks_exact(bins.max(1)).take(layers) {
            let mut acc = 0.0f64;
            cum.push(0.0);
            for ((&m, &iw), &k) in row.iter().zip(&inv_width).zip(&kind) {
                let m = if m.is_finite() { m } else { 0.0 };
                acc += f64::from(m);
                cum.push(acc);
                let d = m * iw;
                let b = &mut bounds[usize::from(k)];
                b.1 = b.1.max(d);
                if d > 0.0 && d < b.0 {
                    b.0 = d;
                }
            }
        }
        let (min_pos, max_density) = if bounds[1].1 > 0.0 {
            bounds[1]
        } else {
            (bounds[1].0.min(bounds[2].0), bounds[2].1)
        };
        Self {
            layers,
            edges,
            cum,
            max_density,
            min_positive_density: min_pos,
        }
    }

    /// Number of prompt positions P.
    pub fn prompt_len(&self) -> usize {
        self.edges.last().copied().unwrap_or(0)
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.layers
    }

    /// The densities that bound the colour range: lowest positive and highest
    /// over the prefill positions.
    pub fn density_bounds(&self) -> [f32; 2] {
        [self.min_positive_density, self.max_density]
    }

    /// Where position `pos` (fractional) falls: the bin `k` holding it and
    /// the share of that bin before it.
    fn locate(&self, pos: f64) -> (usize, f64) {
        let bins = self.edges.len() - 1;
        let p = pos.clamp(0.0, self.prompt_len() as f64);
        // The bin holding p: the last edge at or below it.
        let k = self
            .edges
            .partition_point(|&e| (e as f64) <= p)
            .saturating_sub(1);
        if k >= bins {
            return (bins, 0.0);
        }
        let (a, b) = (self.edges[k] as f64, self.edges[k + 1] as f64);
        (k, (p - a) / (b - a))
    }

    /// Mass at `layer` in positions `0..pos` for a located position (mass is
    /// spread evenly inside a bin).
    fn cum_located(&self, layer: usize, (k, frac): (usize, f64)) -> f64 {
        let bins = self.edges.len() - 1;
        let row = &self.cum[layer * (bins + 1)..(layer + 1) * (bins + 1)];
        if k >= bins {
            row[bins]
        } else {
            row[k] + (row[k + 1] - row[k]) * frac
        }
    }

    /// Mean attention per token at `layer` in positions `[x0, x1)`.
    pub fn density(&self, layer: usize, x0: f64, x1: f64) -> f32 {
        if x1 <= x0 || layer >= self.layers {
            return f32::NAN;
        }
        let (a, b) = (self.locate(x0), self.locate(x1));
        ((self.cum_located(layer, b) - self.cum_located(layer, a)) / (x1 - x0)) as f32
    }

    /// A `layers × cols` grid of mean attention per token over `cols` equal
    /// slices of positions `[x0, x1)`. The slice edges are located once (a
    /// binary search each) and shared by every layer.
    pub fn rebin(&self, x0: f64, x1: f64, cols: usize) -> Grid {
        let cols = cols.max(1);
        let w = (x1 - x0) / cols as f64;
        let edges: Vec<(usize, f64)> = (0..=cols).map(|c| self.locate(x0 + w * c as f64)).collect();
        let mut values = Vec::with_capacity(self.layers * cols);
        for l in 0..self.layers {
            let mut prev = self.cum_located(l, edges[0]);
            for e in &edges[1..] {
                let next = self.cum_located(l, *e);
                values.push(if w > 0.0 {
                    ((next - prev) / w) as f32
                } else {
                    f32::NAN
                });
                prev = next;
            }
        }
        Grid {
            rows: self.layers,
            cols,
            values,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_diag::synthetic::synthetic_trace;

    #[test]
    fn means_over_axes() {
        let t = Tensor3::new([1, 2, 2], vec![1.0, 3.0, 5.0, 7.0]).unwrap();
        assert_eq!(mean_over_heads(&t).values, vec![2.0, 6.0]);
        assert_eq!(mean_over_steps(&t).values, vec![3.0, 5.0]);
        assert_eq!(mean_per_layer(&t), vec![4.0]);
    }

    #[test]
    fn rebinning_keeps_mass_and_density() {
        let tr = synthetic_trace(0, 3, 2, 4, 200);
        let idx = PositionIndex::new(&tr);
        assert_eq!(idx.prompt_len(), 200);
        let p = idx.prompt_len() as f64;
        for cols in [1, 7, 64, 500] {
            let g = idx.rebin(0.0, p, cols);
            for l in 0..3 {
                let total: f64 = (0..cols)
                    .map(|c| f64::from(g.get(l, c)) * p / cols as f64)
                    .sum();
                let want: f32 = tr.prompt_attention.view().row(l).sum();
                assert!(
                    (total as f32 - want).abs() < 1e-3,
                    "cols {cols}: {total} vs {want}"
                );
            }
        }
        // One column per bin over a single bin gives that bin's density.
        let (a, b) = (tr.bin_edges[3], tr.bin_edges[4]);
        let want = tr.prompt_attention.view()[[1, 3]] / (b - a) as f32;
        assert!((idx.density(1, a as f64, b as f64) - want).abs() < 1e-6);
        let [lo, hi] = idx.density_bounds();
        assert!(lo > 0.0 && hi >= lo);
    }
}
