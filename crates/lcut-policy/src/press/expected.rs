//! Expected Attention (kvpress's own `ExpectedAttentionPress`): the
//! queries of the prompt's rows from `sink` on, before RoPE, are summed
//! into their mean and covariance per query head; both are rotated by RoPE
//! averaged over the next `future` positions (512); a key at position `j`
//! then scores the attention such queries are expected to pay it,
//! `softmax_j(mu·k_j / sqrt(d) + k_j' C k_j / 2d)`, averaged over each K/V
//! head's query heads and scaled by `|v_j|` (plus `epsilon`). The first
//! `sink` positions (4) are always kept; each K/V head keeps its own
//! highest-scoring others.

use rayon::prelude::*;

use super::PressParams;
use super::math::{key, norm, softmax};
use crate::visibility::PromptKv;

/// Sums of one layer's prompt queries (before RoPE): per query head, the
/// row count, the sum and the sum of outer products, in f64.
#[derive(Debug, Clone, Default)]
pub(super) struct QueryStats {
    rows: usize,
    width: usize,
    sum: Vec<f64>,
    outer: Vec<f64>,
}

impl QueryStats {
    /// Add the rows (`heads * d` values each) whose position is in
    /// `from..to`.
    pub(super) fn push(
        &mut self,
        positions: &[usize],
        rows: &[f32],
        (from, to): (usize, usize),
        (heads, covariance): (usize, bool),
    ) {
        let width = rows.len() / positions.len().max(1);
        if width == 0 || heads == 0 {
            return;
        }
        let d = width / heads;
        if self.width == 0 {
            self.width = width;
            self.sum = vec![0.0; width];
            if covariance {
                self.outer = vec![0.0; heads * d * d];
            }
        }
        for (&p, row) in positions.iter().zip(rows.chunks_exact(width)) {
            if p < from || p >= to {
                continue;
            }
            self.rows += 1;
            self.sum
                .iter_mut()
                .zip(row)
                .for_each(|(s, &x)| *s += f64::from(x));
            if self.outer.is_empty() {
                continue;
            }
            // the upper triangle only (b >= a): the matrix is symmetric,
            // and `qa * qb` is `qb * qa` to the bit, so [`Self::outer`]
            // mirrors it into the sums the whole square would hold
            for h in 0..heads {
                let q = &row[h * d..(h + 1) * d];
                let o = &mut self.outer[h * d * d..(h + 1) * d * d];
                for a in 0..d {
                    let qa = f64::from(q[a]);
                    for b in a..d {
                        o[a * d + b] += qa * f64::from(q[b]);
                    }
                }
            }
        }
    }

    /// Rows summed.
    pub(super) fn rows(&self) -> usize {
        self.rows
    }

    /// Query head `h`'s sum of outer products, `[d][d]` row-major, with
    /// `d` its head width (none summed: empty).
    fn outer(&self, h: usize, d: usize) -> Vec<f64> {
        let Some(upper) = self.outer.get(h * d * d..(h + 1) * d * d) else {
            return Vec::new();
        };
        (0..d * d)
            .map(|x| {
                let (a, b) = (x / d, x % d);
                upper[a.min(b) * d + a.max(b)]
            })
            .collect()
    }
}

/// RoPE over positions `from..from + count`, averaged: `[d][d]` row-major
/// (rotate-half layout; dimensions past the rotated ones unchanged). The
/// angles are taken as the model takes them, `f32(position) * f32(freq)`.
fn average_rotation(inv_freq: &[f32], d: usize, from: usize, count: usize) -> Vec<f64> {
    let half = inv_freq.len();
    let mut r = vec![0f64; d * d];
    for i in 2 * half..d {
        r[i * d + i] = 1.0;
    }
    for (i, &f) in inv_freq.iter().enumerate() {
        let (mut c, mut s) = (0f64, 0f64);
        for p in from..from + count {
            let angle = p as f32 * f;
            c += f64::from(angle.cos());
            s += f64::from(angle.sin());
        }
        let (c, s) = (c / count as f64, s / count as f64);
        r[i * d + i] = c;
        r[(i + half) * d + i + half] = c;
        r[i * d + i + half] = -s;
        r[(i + half) * d + i] = s;
    }
    r
}

/// Each K/V head's scores over the prompt's `n` positions; the first
/// `sink` score infinity.
pub(super) fn scores(p: &PressParams, kv: &PromptKv<'_>, stats: &QueryStats) -> Vec<Vec<f64>> {
    let keys = &kv.keys;
    let (n, d, heads) = (keys.positions.len(), keys.head_dim, kv.heads);
    let group = heads / keys.kv_heads;
    let rows = stats.rows.max(1) as f64;
    let r = average_rotation(kv.rope_inv_freq, d, n, p.future);
    let rotate = |v: &[f64]| -> Vec<f64> {
        (0..d)
            .map(|i| (0..d).map(|j| r[i * d + j] * v[j]).sum())
            .collect()
    };
    let scale = 1.0 / (d as f64).sqrt();
    // each K/V head's keys from the first scored position, in f64
    let keys64: Vec<Vec<f64>> = (0..keys.kv_heads)
        .map(|g| {
            (p.sink..n)
                .flat_map(|j| key(keys, g, j).iter().map(|&x| f64::from(x)))
                .collect()
        })
        .collect();
    // heads are independent: each runs on its own thread, the same sums
    let per_head: Vec<Vec<f64>> = (0..heads)
        .into_par_iter()
        .map(|h| {
            let mu: Vec<f64> = stats.sum[h * d..(h + 1) * d]
                .iter()
                .map(|s| s / rows)
                .collect();
            let mu_r = rotate(&mu);
            // C' = R C R^T, C = outer / rows - mu mu^T
            let cov_r = (!stats.outer.is_empty() && p.covariance).then(|| {
                let o = stats.outer(h, d);
                let c: Vec<f64> = (0..d * d)
                    .map(|x| o[x] / rows - mu[x / d] * mu[x % d])
                    .collect();
                let rc: Vec<f64> = (0..d * d)
                    .map(|x| (0..d).map(|k| r[(x / d) * d + k] * c[k * d + x % d]).sum())
                    .collect();
                (0..d * d)
                    .map(|x| {
                        (0..d)
                            .map(|k| rc[(x / d) * d + k] * r[(x % d) * d + k])
                            .sum()
                    })
                    .collect::<Vec<f64>>()
            });
            let g = h / group;
            let mut z: Vec<f64> = keys64[g]
                .chunks_exact(d)
                .map(|k| {
                    let mean = mu_r.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() * scale;
                    let spread = cov_r.as_ref().map_or(0.0, |c| {
                        let ck: f64 = (0..d)
                            .map(|a| k[a] * (0..d).map(|b| c[a * d + b] * k[b]).sum::<f64>())
                            .sum();
                        ck / d as f64 / 2.0
                    });
                    mean + spread
                })
                .collect();
            softmax(&mut z);
            z
        })
        .collect();
    let values = |g: usize, j: usize| {
        let n = keys.positions.len();
        norm(&kv.values[(g * n + j) * d..(g * n + j + 1) * d])
    };
    (0..keys.kv_heads)
        .map(|g| {
            let mut s = vec![f64::INFINITY; p.sink];
            s.extend((p.sink..n).map(|j| {
                let i = j - p.sink;
                let mean = (g * group..(g + 1) * group)
                    .map(|h| per_head[h][i])
                    .sum::<f64>()
                    / group as f64;
                match p.vnorm {
                    true => (mean + p.epsilon) * values(g, j),
                    false => mean,
                }
            }));
            s
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::PressName;
    use super::*;
    use crate::visibility::HostKeys;

    /// The upper triangle summed and mirrored is, bit for bit, the whole
    /// square summed row by row.
    #[test]
    fn the_outer_sums_are_the_whole_squares() {
        let (heads, d, n) = (2, 5, 7);
        let rows: Vec<f32> = (0..n * heads * d)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 3.0 + 1e-3 * i as f32)
            .collect();
        let positions: Vec<usize> = (0..n).collect();
        let mut stats = QueryStats::default();
        stats.push(&positions, &rows, (1, n), (heads, true));
        assert_eq!(stats.rows(), n - 1);
        for h in 0..heads {
            let mut want = vec![0f64; d * d];
            for row in rows.chunks_exact(heads * d).skip(1) {
                let q = &row[h * d..(h + 1) * d];
                for a in 0..d {
                    for b in 0..d {
                        want[a * d + b] += f64::from(q[a]) * f64::from(q[b]);
                    }
                }
            }
            let got = stats.outer(h, d);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "head {h}: {got:?} vs {want:?}"
            );
        }
        assert!(QueryStats::default().outer(0, d).is_empty());
    }

    #[test]
    fn the_average_rotation_of_one_position_is_rope_itself() {
        let f = [0.5f32, 0.01];
        let r = average_rotation(&f, 4, 3, 1);
        // rotate-half: x' = x cos - x_{i+2} sin for i < 2
        let x = [1.0, 2.0, 3.0, 4.0];
        let y: Vec<f64> = (0..4)
            .map(|i| (0..4).map(|j| r[i * 4 + j] * x[j]).sum())
            .collect();
        let a = 3.0f32 * 0.5;
        let want0 = 1.0 * f64::from(a.cos()) - 3.0 * f64::from(a.sin());
        assert!((y[0] - want0).abs() < 1e-12, "{} vs {want0}", y[0]);
        let want2 = 3.0 * f64::from(a.cos()) + 1.0 * f64::from(a.sin());
        assert!((y[2] - want2).abs() < 1e-12);
    }

    #[test]
    fn sinks_are_kept_and_a_key_aligned_with_the_mean_query_scores_highest() {
        let p = PressParams {
            sink: 1,
            vnorm: false,
            ..PressParams::new(PressName::Expected, 0.5)
        };
        // d = 2 without rotation, one head; queries all (1, 0)
        let mut stats = QueryStats::default();
        stats.push(
            &[1, 2, 3],
            &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
            (1, 4),
            (1, true),
        );
        assert_eq!(stats.rows(), 3);
        let data = [9.0f32, 9.0, 0.0, 1.0, 2.0, 0.0, -1.0, 0.0];
        let positions = [0, 1, 2, 3];
        let kv = PromptKv {
            keys: HostKeys {
                kv_heads: 1,
                head_dim: 2,
                positions: &positions,
                data: &data,
            },
            values: &data,
            heads: 1,
            rope_inv_freq: &[],
        };
        let s = scores(&p, &kv, &stats);
        assert!(s[0][0].is_infinite());
        assert!(s[0][2] > s[0][1] && s[0][1] > s[0][3]);
    }
}
