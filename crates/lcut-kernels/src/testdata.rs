//! Deterministic data for tests and benchmarks: a small random number
//! generator and random quantized blocks (with the edge values a format
//! can hold), so that every crate checks the kernels on the same inputs
//! without a dependency.

use half::f16;

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
            QuantFormat::Q6K => put_f16(blk, 208, scale / 64.0),
        }
    }
    out
}
