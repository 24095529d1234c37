//! SlimInfer's block scorer on the host: representative keys per block
//! (unit means, the block mean or the element-wise maximum), scored against
//! the window's mean query as `r(j) = max_m (1/H) Σ_h |q̄_h · k̄^h_{j,m}|`.

use crate::slim::ScoreMode;
use crate::visibility::HostKeys;

/// Representative keys of the scored blocks: each block's summaries
/// (`[kv_heads][head_dim]` each), in block order.
#[derive(Debug, Clone, Default)]
pub struct BlockSummaries {
    kv_heads: usize,
    head_dim: usize,
    /// (block, its summaries flattened `[n][kv_heads][head_dim]`).
    blocks: Vec<(usize, Vec<f32>)>,
}

impl BlockSummaries {
    /// Summarise the keys of `blocks` (each with the positions it covers)
    /// under `mode`, with token units of `unit` positions aligned to the block
    /// start `block_start` (`unit` matters for [`ScoreMode::Unit`] only).
    pub fn build(
        keys: &HostKeys<'_>,
        blocks: &[(usize, std::ops::Range<usize>)],
        mode: ScoreMode,
        block_size: usize,
        unit: usize,
    ) -> Self {
        let (kh, hd) = (keys.kv_heads, keys.head_dim);
        let n = keys.positions.len();
        let key = |h: usize, i: usize| &keys.data[(h * n + i) * hd..(h * n + i + 1) * hd];
        let mut out = Vec::with_capacity(blocks.len());
        for (b, range) in blocks {
            // indices of the block's tokens among the held keys
            let lo = keys.positions.partition_point(|&p| p < range.start);
            let hi = keys.positions.partition_point(|&p| p < range.end);
            if lo == hi {
                continue;
            }
            let groups: Vec<Vec<usize>> = match mode {
                ScoreMode::Unit => {
                    let mut groups: Vec<Vec<usize>> = Vec::new();
                    let mut current = usize::MAX;
                    for i in lo..hi {
                        let u = (keys.positions[i] - b * block_size) / unit;
                        if u != current {
                            groups.push(Vec::new());
                            current = u;
                        }
                        groups.last_mut().expect("pushed").push(i);
                    }
                    groups
                }
                ScoreMode::Avg | ScoreMode::Max => vec![(lo..hi).collect()],
            };
            let mut summary = Vec::with_capacity(groups.len() * kh * hd);
            for g in &groups {
                for h in 0..kh {
                    let mut acc = match mode {
                        ScoreMode::Max => vec![f32::NEG_INFINITY; hd],
                        _ => vec![0f32; hd],
                    };
                    for &i in g {
                        for (a, &x) in acc.iter_mut().zip(key(h, i)) {
                            match mode {
                                ScoreMode::Max => *a = a.max(x),
                                _ => *a += x,
                            }
                        }
                    }
                    if mode != ScoreMode::Max {
                        let inv = 1.0 / g.len() as f32;
                        acc.iter_mut().for_each(|a| *a *= inv);
                    }
                    summary.extend(acc);
                }
            }
            out.push((*b, summary));
        }
        Self {
            kv_heads: kh,
            head_dim: hd,
            blocks: out,
        }
    }

    /// Blocks summarised, ascending.
    pub fn blocks(&self) -> impl Iterator<Item = usize> + '_ {
        self.blocks.iter().map(|(b, _)| *b)
    }

    /// Score the blocks in `domain` (those summarised) against the mean
    /// query `q` (`[heads][head_dim]`, query head h reading KV head
    /// `h / (heads / kv_heads)`): the best summary's head-mean |q·k|.
    pub fn score(&self, q: &[f32], heads: usize, domain: &[usize]) -> Vec<(usize, f32)> {
        let (kh, hd) = (self.kv_heads, self.head_dim);
        let group = heads / kh.max(1);
        let per = kh * hd;
        self.blocks
            .iter()
            .filter(|(b, _)| domain.binary_search(b).is_ok())
            .map(|(b, summaries)| {
                let best = summaries
                    .chunks(per)
                    .map(|s| {
                        let total: f32 = (0..heads)
                            .map(|h| {
                                let k = &s[(h / group) * hd..(h / group + 1) * hd];
                                let qh = &q[h * hd..(h + 1) * hd];
                                qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>().abs()
                            })
                            .sum();
                        total / heads as f32
                    })
                    .fold(f32::NEG_INFINITY, f32::max);
                (*b, best)
            })
            .collect()
    }
}

/// The `k` best-scoring blocks, ascending; ties go to the lower index.
pub fn top_blocks(scores: &[(usize, f32)], k: usize) -> Vec<usize> {
    let mut order: Vec<(usize, f32)> = scores.to_vec();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut chosen: Vec<usize> = order.into_iter().take(k).map(|(b, _)| b).collect();
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One KV head of width 2; keys given per position.
    fn keys(rows: &[[f32; 2]]) -> (Vec<usize>, Vec<f32>) {
        let positions = (0..rows.len()).collect();
        (positions, rows.iter().flatten().copied().collect())
    }

    fn summaries(
        rows: &[[f32; 2]],
        blocks: &[(usize, std::ops::Range<usize>)],
        mode: ScoreMode,
        bs: usize,
        unit: usize,
    ) -> BlockSummaries {
        let (positions, data) = keys(rows);
        let k = HostKeys {
            kv_heads: 1,
            head_dim: 2,
            positions: &positions,
            data: &data,
        };
        BlockSummaries::build(&k, blocks, mode, bs, unit)
    }

    #[test]
    fn one_aligned_unit_wins_under_unit_scoring_and_loses_under_avg() {
        // block 0: one unit along q, the other three anti-aligned (cancels on
        // average to -1); block 1: weakly aligned throughout
        let a = [1.0, 0.0];
        let anti = [-0.5, 0.0];
        let weak = [0.3, 0.0];
        let rows = [
            a, a, anti, anti, anti, anti, anti, anti, weak, weak, weak, weak, weak, weak, weak,
            weak,
        ];
        let blocks = [(0, 0..8), (1, 8..16)];
        let q = [1.0, 0.0];
        let unit = summaries(&rows, &blocks, ScoreMode::Unit, 8, 2).score(&q, 1, &[0, 1]);
        assert_eq!(top_blocks(&unit, 1), vec![0]);
        assert_eq!(unit[0].1, 1.0);
        let avg = summaries(&rows, &blocks, ScoreMode::Avg, 8, 2).score(&q, 1, &[0, 1]);
        // block 0's mean key is (2 - 3) / 8 = -0.125: |·| = 0.125 < 0.3
        assert!((avg[0].1 - 0.125).abs() < 1e-6, "{avg:?}");
        assert_eq!(top_blocks(&avg, 1), vec![1]);
        let max = summaries(&rows, &blocks, ScoreMode::Max, 8, 2).score(&q, 1, &[0, 1]);
        assert_eq!(max[0].1, 1.0);
    }

    #[test]
    fn an_anti_aligned_unit_counts_through_the_absolute_value() {
        let rows = [[-2.0, 0.0], [-2.0, 0.0], [0.1, 0.0], [0.1, 0.0]];
        let s = summaries(&rows, &[(0, 0..2), (1, 2..4)], ScoreMode::Unit, 2, 2);
        let scores = s.score(&[1.0, 0.0], 1, &[0, 1]);
        assert_eq!(top_blocks(&scores, 1), vec![0]);
        assert_eq!(scores[0].1, 2.0);
    }

    #[test]
    fn query_heads_read_their_kv_group() {
        // 2 KV heads of width 1, 4 query heads: heads 0,1 read KV head 0
        let positions = vec![0, 1];
        // [kv_head][token][dim]: head 0 keys 1, 0; head 1 keys 0, 5
        let data = vec![1.0, 0.0, 0.0, 5.0];
        let k = HostKeys {
            kv_heads: 2,
            head_dim: 1,
            positions: &positions,
            data: &data,
        };
        let s = BlockSummaries::build(&k, &[(0, 0..1), (1, 1..2)], ScoreMode::Unit, 1, 1);
        // queries: heads 0,1 = 1; heads 2,3 = 0 -> block 0 scores 0.5, block 1 0
        let scores = s.score(&[1.0, 1.0, 0.0, 0.0], 4, &[0, 1]);
        assert_eq!(scores, vec![(0, 0.5), (1, 0.0)]);
        // heads 2,3 = 1 -> block 1 wins with 2.5
        let scores = s.score(&[0.0, 0.0, 1.0, 1.0], 4, &[0, 1]);
        assert_eq!(scores, vec![(0, 0.0), (1, 2.5)]);
    }

    #[test]
    fn ties_go_to_the_lower_block_and_partial_blocks_use_the_tokens_they_have() {
        assert_eq!(top_blocks(&[(3, 1.0), (1, 1.0), (2, 1.0)], 2), vec![1, 2]);
        assert_eq!(top_blocks(&[(3, 1.0)], 4), vec![3]);
        // block 1 has three tokens (positions 4..7) in units of 2: (4,5), (6)
        let rows = [[0.0, 0.0]; 4]
            .into_iter()
            .chain([[0.0, 0.0], [0.0, 0.0], [3.0, 0.0]])
            .collect::<Vec<_>>();
        let s = summaries(&rows, &[(0, 0..4), (1, 4..7)], ScoreMode::Unit, 4, 2);
        assert_eq!(s.score(&[1.0, 0.0], 1, &[0, 1]), vec![(0, 0.0), (1, 3.0)]);
        let s = summaries(&rows, &[(0, 0..4), (1, 4..7)], ScoreMode::Avg, 4, 2);
        assert_eq!(s.score(&[1.0, 0.0], 1, &[0, 1]), vec![(0, 0.0), (1, 1.0)]);
    }

    #[test]
    fn blocks_outside_the_domain_or_without_keys_are_not_scored() {
        let rows = [[1.0, 0.0]; 4];
        let s = summaries(
            &rows,
            &[(0, 0..2), (1, 2..4), (2, 4..6)],
            ScoreMode::Unit,
            2,
            1,
        );
        assert_eq!(s.blocks().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(s.score(&[1.0, 0.0], 1, &[1]), vec![(1, 1.0)]);
    }
}
