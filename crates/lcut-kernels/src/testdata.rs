//! Deterministic data for tests and benchmarks: a small random number
//! generator and random quantized blocks (with the edge values a format
//! can hold), so that every crate checks the kernels on the same inputs
//! without a dependency.

use std::io::Write;

use half::f16;

use crate::isa::Isa;
use crate::quant::QuantFormat;

/// SplitMix64: a tiny, fast, reproducible generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// Roughly normal (sum of four uniforms, scaled to unit variance).
    pub fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum();
        (s - 2.0) * 3f32.sqrt()
    }

    /// `n` roughly normal values times `scale`.
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Write `v` as f16 at `blk[at..at + 2]`.
fn put_f16(blk: &mut [u8], at: usize, v: f32) {
    blk[at..at + 2].copy_from_slice(&f16::from_f32(v).to_bits().to_le_bytes());
}

/// Little-endian f32s (a reference file's values).
pub fn le_floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A row of reference weights dot one quantized activation row, in f64
/// (each term weight x value x its block's scale), and the sum of the
/// terms' magnitudes (the scale of a product's rounding).
pub fn dot_with_q8(w: &[f32], a: &crate::quant::Q8Row<'_>) -> (f64, f64) {
    w.iter().enumerate().fold((0.0, 0.0), |(s, m), (j, &x)| {
        let t = f64::from(x) * f64::from(a.q[j]) * f64::from(a.d[j / 32]);
        (s + t, m + t.abs())
    })
}

/// `blocks` random blocks of `format`: random payload bytes and finite
/// scales, with every 8th block at an edge: payload all ones (largest
/// values, most negative Q8 bytes), all zeros, or a zero scale.
pub fn random_blocks(format: QuantFormat, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let size = format.block_bytes();
    let mut out = rng.bytes(blocks * size);
    for (i, blk) in out.chunks_exact_mut(size).enumerate() {
        let edge = (i % 8 == 7).then_some((i / 8) % 3);
        match edge {
            Some(0) => blk.fill(0xFF),
            Some(1) => blk.fill(0x00),
            _ => {}
        }
        if matches!(format, QuantFormat::Q8_0) && edge == Some(0) {
            // -128 and 127 alternating: the extremes of a signed byte
            for (j, b) in blk[2..].iter_mut().enumerate() {
                *b = if j % 2 == 0 { 0x80 } else { 0x7F };
            }
        }
        let scale = if edge == Some(2) {
            0.0
        } else {
            rng.uniform(0.002, 0.05)
        };
        match format {
            QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => put_f16(blk, 0, scale),
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                put_f16(blk, 0, scale);
                put_f16(blk, 2, rng.uniform(-0.3, 0.1));
            }
            QuantFormat::Q4K => {
                put_f16(blk, 0, scale / 16.0);
                put_f16(blk, 2, rng.uniform(0.0, 0.01));
            }
            QuantFormat::Q5K => {
                put_f16(blk, 0, scale / 32.0);
                put_f16(blk, 2, rng.uniform(0.0, 0.01));
            }
            QuantFormat::Q6K => put_f16(blk, 208, scale / 64.0),
            // exponents 2^-10..2^-4 (the codes reach 12), the smallest
            // (subnormal) where the others get a zero scale
            QuantFormat::Mxfp4 => {
                blk[0] = if edge == Some(2) {
                    0
                } else {
                    118 + (rng.next_u64() % 7) as u8
                }
            }
        }
    }
    out
}

/// [`random_blocks`] as a model file's blocks are, for timing: MXFP4's
/// subnormal edge exponents (e < 2, scales below 2^-126, which the FPU runs
/// by slow microcode assists and real weights never have) raised into the
/// others' range; the other formats' blocks as they are.
pub fn bench_blocks(format: QuantFormat, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = random_blocks(format, blocks, rng);
    if format == QuantFormat::Mxfp4 {
        for blk in out.chunks_exact_mut(format.block_bytes()) {
            blk[0] = blk[0].max(118);
        }
    }
    out
}

/// The instruction-set levels one test checks: [`IsaChecks::runs`] says
/// whether a level runs here ([`Isa::enabled`]) and counts the ones that do
/// not; when the test ends, a line naming them goes straight to the
/// terminal's standard error, past the test harness's output capture, so a
/// level that was not checked shows in every `cargo test` run:
///
/// ```text
/// SKIPPED 1 of 3 instruction-set levels in quant::exact_bits: avx512 (this CPU lacks it)
/// ```
#[derive(Debug)]
pub struct IsaChecks {
    test: &'static str,
    asked: Vec<Isa>,
    skipped: Vec<Isa>,
}

impl IsaChecks {
    /// The checks of test `test` (its name as the line shows it).
    pub fn new(test: &'static str) -> Self {
        Self {
            test,
            asked: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// Whether `isa` runs on this machine; a level that does not is
    /// counted as skipped.
    pub fn runs(&mut self, isa: Isa) -> bool {
        if !self.asked.contains(&isa) {
            self.asked.push(isa);
        }
        let runs = isa.enabled();
        if !runs && !self.skipped.contains(&isa) {
            self.skipped.push(isa);
        }
        runs
    }

    /// The levels skipped so far.
    pub fn skipped(&self) -> &[Isa] {
        &self.skipped
    }

    /// The line printed when the test ends, if any level was skipped.
    pub fn summary(&self) -> Option<String> {
        if self.skipped.is_empty() {
            return None;
        }
        let why = |isa: &Isa| {
            if isa.available() {
                format!("{} (LCUT_ISA caps it off)", isa.name())
            } else {
                format!("{} (this CPU lacks it)", isa.name())
            }
        };
        let names: Vec<String> = self.skipped.iter().map(why).collect();
        Some(format!(
            "SKIPPED {} of {} instruction-set levels in {}: {}",
            self.skipped.len(),
            self.asked.len(),
            self.test,
            names.join(", ")
        ))
    }
}

impl Drop for IsaChecks {
    fn drop(&mut self) {
        if let Some(line) = self.summary() {
            // `eprintln!` is captured by the test harness; a write to the
            // stream itself is not
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_this_process_does_not_run_is_counted_and_named() {
        let mut checks = IsaChecks::new("testdata::levels");
        for isa in crate::isa::ALL {
            assert_eq!(checks.runs(isa), isa.enabled());
        }
        assert!(checks.runs(Isa::Portable));
        let off: Vec<Isa> = crate::isa::ALL
            .into_iter()
            .filter(|i| !i.enabled())
            .collect();
        assert_eq!(checks.skipped(), off.as_slice());
        match checks.summary() {
            None => assert!(off.is_empty()),
            Some(line) => {
                assert!(line.starts_with(&format!(
                    "SKIPPED {} of {}",
                    off.len(),
                    crate::isa::ALL.len()
                )));
                assert!(off.iter().all(|i| line.contains(i.name())), "{line}");
            }
        }
    }
}

/// A visibility to test attention under: which keys the query at `pos` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// Every key up to and including its own.
    Causal,
    /// The last `w` keys up to its own.
    Window(usize),
    /// A policy's anchors with gaps: key 0 (BoS), every third block of 8
    /// keys before it, and its own.
    Anchors,
}

impl Visibility {
    /// The keys the query at `pos` reads, ascending and disjoint.
    pub fn spans(self, pos: usize) -> Vec<std::ops::Range<usize>> {
        match self {
            Self::Causal => std::iter::once(0..pos + 1).collect(),
            Self::Window(w) => std::iter::once((pos + 1).saturating_sub(w)..pos + 1).collect(),
            Self::Anchors => {
                let mut v: Vec<_> = std::iter::once(0..1).collect();
                let mut r = 8;
                while r + 8 <= pos {
                    v.push(r..r + 8);
                    r += 24;
                }
                if pos >= 1 && v.last().is_none_or(|l| l.end <= pos) {
                    v.push(pos..pos + 1);
                }
                v
            }
        }
    }
}

/// A random attention problem for the attention kernels' tests and device
/// checks: `heads` query heads over `kv_heads` K/V heads of `head_dim`
/// values, the last `queries` of `keys` positions, each query reading the
/// keys its [`Visibility`] gives, with Gemma's soft cap and gpt-oss's sinks
/// where asked; [`AttentionCase::reference`] answers it in f64.
#[derive(Debug, Clone, Copy)]
pub struct AttentionCase {
    /// Which keys each query reads.
    pub kind: Visibility,
    /// Query heads.
    pub heads: usize,
    /// K/V heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Queries per head (the last of the positions).
    pub queries: usize,
    /// Keys held per K/V head.
    pub keys: usize,
    /// The soft cap, if any.
    pub softcap: Option<f32>,
    /// Whether the heads have sink logits.
    pub sinks: bool,
}

impl AttentionCase {
    /// A case without soft cap or sinks.
    pub fn new(
        kind: Visibility,
        (heads, kv_heads): (usize, usize),
        head_dim: usize,
        queries: usize,
        keys: usize,
    ) -> Self {
        Self {
            kind,
            heads,
            kv_heads,
            head_dim,
            queries,
            keys,
            softcap: None,
            sinks: false,
        }
    }

    /// The keys query `i` reads (it sits at position `keys - queries + i`).
    pub fn spans(&self, i: usize) -> Vec<std::ops::Range<usize>> {
        self.kind.spans(self.keys - self.queries + i)
    }

    /// Every query's keys.
    pub fn query_spans(&self) -> crate::attention::QuerySpans {
        let mut spans = crate::attention::QuerySpans::new();
        for i in 0..self.queries {
            spans.push_query(self.spans(i));
        }
        spans
    }

    /// The attention of `q` [heads, queries, head_dim] over `k` and `v`
    /// [kv_heads, capacity, head_dim] (`capacity` >= `keys` rows a head)
    /// under `spec`, in f64: the output [heads, queries, head_dim] and each
    /// row's log-sum-exp [heads, queries] (the sink included).
    pub fn reference(
        &self,
        spec: &crate::attention::AttentionSpec<'_>,
        (q, k, v): (&[f32], &[f32], &[f32]),
        capacity: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let (n, hd, group) = (self.queries, self.head_dim, self.heads / self.kv_heads);
        let mut out = vec![0.0; self.heads * n * hd];
        let mut lse = vec![0.0; self.heads * n];
        let at = |g: usize, t: usize| (g * capacity + t) * hd..(g * capacity + t + 1) * hd;
        for h in 0..self.heads {
            let g = h / group;
            for i in 0..n {
                let qh = &q[(h * n + i) * hd..(h * n + i + 1) * hd];
                let rows: Vec<usize> = self.spans(i).into_iter().flatten().collect();
                let scores: Vec<f64> = rows
                    .iter()
                    .map(|&t| {
                        let dot = qh
                            .iter()
                            .zip(&k[at(g, t)])
                            .map(|(a, b)| f64::from(*a) * f64::from(*b))
                            .sum::<f64>();
                        let s = f64::from(spec.scale) * dot;
                        spec.softcap
                            .map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh())
                    })
                    .collect();
                let sink = spec.sinks.map(|s| f64::from(s[h]));
                let m = scores
                    .iter()
                    .copied()
                    .chain(sink)
                    .fold(f64::NEG_INFINITY, f64::max);
                let total: f64 = scores
                    .iter()
                    .chain(sink.as_ref())
                    .map(|s| (s - m).exp())
                    .sum();
                lse[h * n + i] = m + total.ln();
                for (&t, s) in rows.iter().zip(&scores) {
                    let p = (s - m).exp() / total;
                    for (o, x) in out[(h * n + i) * hd..].iter_mut().zip(&v[at(g, t)]) {
                        *o += p * f64::from(*x);
                    }
                }
            }
        }
        (out, lse)
    }
}
