//! ggml's block formats: their sizes and how a block turns back into floats.
//!
//! A quantized row of `cols` values is `cols / block_len` blocks laid end to
//! end, as in a GGUF file. The layouts (little-endian, f16 scales):
//!
//! - `Q4_0` (18 bytes / 32 values): scale d, 16 bytes of 4-bit q; value j is
//!   the low nibble of byte j (j < 16) or the high nibble of byte j - 16;
//!   weight = d (q - 8).
//! - `Q4_1` (20 / 32): scale d, minimum m, 16 bytes of nibbles as Q4_0;
//!   weight = d q + m.
//! - `Q5_0` (22 / 32): scale d, 32 high bits (a little-endian u32: bit j
//!   is value j's fifth bit), 16 bytes of nibbles as Q4_0; weight = d (q - 16).
//! - `Q5_1` (24 / 32): scale d, minimum m, high bits and nibbles as Q5_0;
//!   weight = d q + m.
//! - `Q8_0` (34 / 32): scale d, 32 signed bytes; weight = d q.
//! - `Q4_K` (144 / 256): super-scales d and dmin, 12 bytes packing eight
//!   6-bit (scale, min) pairs, 128 bytes of nibbles: bytes 32i..32i+32 hold
//!   sub-block 2i in their low nibbles and 2i+1 in their high nibbles;
//!   weight = d sc_j q - dmin m_j in sub-block j of 32.
//! - `Q5_K` (176 / 256): d, dmin and the 12 scale bytes as Q4_K, 32 bytes of
//!   fifth bits (qh), then the 128 bytes of nibbles as Q4_K; value l of
//!   sub-block j adds 16 where bit j of qh[l] is set; weight as Q4_K's.
//! - `Q6_K` (210 / 256): 128 bytes of low nibbles (ql), 64 bytes of high
//!   bit pairs (qh), 16 signed 8-bit scales, super-scale d; in each half of
//!   128 values (ql advancing 64 bytes, qh 32), value 32t + l (t < 4, l < 32)
//!   is the low (t even) or high (t odd) nibble of ql[l + 32 (t mod 2)] with
//!   bits 2t, 2t+1 of qh[l] above it; weight = d sc_(value/16) (q - 32).

use half::f16;

use crate::error::{KernelError, Result};

/// A ggml block format the kernels read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    /// 4-bit values with one scale per 32 (offset 8).
    Q4_0,
    /// 4-bit values with a scale and a minimum per 32.
    Q4_1,
    /// 5-bit values with one scale per 32 (offset 16).
    Q5_0,
    /// 5-bit values with a scale and a minimum per 32.
    Q5_1,
    /// 8-bit values with one scale per 32.
    Q8_0,
    /// 4-bit values in super-blocks of 256 with 6-bit sub-block scales and mins.
    Q4K,
    /// 5-bit values in super-blocks of 256, scales and mins as Q4_K.
    Q5K,
    /// 6-bit values in super-blocks of 256 with 8-bit scales per 16.
    Q6K,
    /// 4-bit E2M1 codes with one power-of-two exponent per 32 (gpt-oss's experts).
    Mxfp4,
}

/// Every format, in ggml's type order.
pub const FORMATS: [QuantFormat; 9] = [
    QuantFormat::Q4_0,
    QuantFormat::Q4_1,
    QuantFormat::Q5_0,
    QuantFormat::Q5_1,
    QuantFormat::Q8_0,
    QuantFormat::Q4K,
    QuantFormat::Q5K,
    QuantFormat::Q6K,
    QuantFormat::Mxfp4,
];

/// MXFP4's code values, doubled E2M1 (ggml's `kvalues_mxfp4`).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Values per block of the 32-value formats (and per activation block).
pub const QK: usize = 32;
/// Values per super-block of the K-quants.
pub const QK_K: usize = 256;

impl QuantFormat {
    /// Values per block.
    pub const fn block_len(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 | Self::Mxfp4 => QK,
            Self::Q4K | Self::Q5K | Self::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
            Self::Mxfp4 => 17,
        }
    }

    /// How many steps of unsigned-weight x signed-activation byte pairs
    /// (`maddubs`, each pair at most 2 x the largest weight x 128) can be
    /// added in 16 bits before they must widen: 8 for 4-bit weights, 4 for
    /// 5-bit, 2 for Q6_K's 6-bit, 1 for Q8_0's 8-bit magnitudes; 4 for
    /// MXFP4, whose values taken unsigned (code value + 12) reach 24.
    pub const fn i16_pair_steps(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q4_1 | Self::Q4K => 8,
            Self::Q5_0 | Self::Q5_1 | Self::Q5K | Self::Mxfp4 => 4,
            Self::Q6K => 2,
            Self::Q8_0 => 1,
        }
    }

    /// The format's name as ggml spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Mxfp4 => "MXFP4",
        }
    }

    /// ggml's type id (as in a GGUF tensor header).
    pub const fn ggml_type(self) -> u32 {
        match self {
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::Mxfp4 => 39,
        }
    }

    /// The format of ggml type id `id`, if the kernels read it.
    pub fn from_ggml_type(id: u32) -> Option<Self> {
        FORMATS.into_iter().find(|f| f.ggml_type() == id)
    }

    /// Bytes of one row of `cols` values, or an error when `cols` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize> {
        if !cols.is_multiple_of(self.block_len()) {
            return Err(KernelError::PartialBlock {
                format: self.name(),
                cols,
                block: self.block_len(),
            });
        }
        Ok(cols / self.block_len() * self.block_bytes())
    }
}

/// The f16 at `bytes[at..at + 2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// MXFP4's code values plus 12 (0..=24): unsigned, as the products that
/// multiply unsigned weights take them, 12 x the activations' sum coming off.
pub(crate) const MXFP4_PLUS12: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_MXFP4[i] + 12) as u8;
        i += 1;
    }
    t
};

/// An MXFP4 block's scale from its E8M0 exponent byte: 2^(e - 128)
/// exactly, as ggml's `ggml_e8m0_to_fp32_half` builds it (subnormal below
/// e = 2).
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(u32::from(e - 1) << 23)
    }
}

/// The 32 signed values (doubled E2M1) of an MXFP4 block's 16 code bytes.
#[inline(always)]
pub(crate) fn mxfp4_values(qs: &[u8]) -> [i8; QK] {
    nibbles32(qs).map(|q| KVALUES_MXFP4[usize::from(q)])
}

/// Scale and minimum of sub-block `j` (0..8) of a Q4_K block from its 12
/// packed bytes (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn q4k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The 32 4-bit values of a Q4_0/Q4_1 block's 16 nibble bytes, in order.
#[inline(always)]
pub(crate) fn nibbles32(qs: &[u8]) -> [u8; QK] {
    let mut v = [0u8; QK];
    for j in 0..16 {
        v[j] = qs[j] & 0x0F;
        v[j + 16] = qs[j] >> 4;
    }
    v
}

/// The 32 5-bit values of a Q5_0/Q5_1 block: nibbles at `qs` (16 bytes),
/// fifth bits in the little-endian u32 at `qh`.
#[inline(always)]
pub(crate) fn values5(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut v = nibbles32(qs);
    for (j, x) in v.iter_mut().enumerate() {
        *x |= (((high >> j) & 1) as u8) << 4;
    }
    v
}

/// The 32 5-bit values of sub-block `j` (0..8) of a Q5_K block: nibbles
/// of `qs[32 (j / 2)..]` (low for even `j`, high for odd), bit `j` of
/// `qh[l]` above value l (ggml's `dequantize_row_q5_K`).
#[inline(always)]
pub(crate) fn q5k_values(qh: &[u8], qs: &[u8], j: usize) -> [u8; QK] {
    let bytes = &qs[32 * (j / 2)..32 * (j / 2) + 32];
    let qh = &qh[..QK];
    std::array::from_fn(|l| {
        let q = if j.is_multiple_of(2) {
            bytes[l] & 0x0F
        } else {
            bytes[l] >> 4
        };
        q | (((qh[l] >> j) & 1) << 4)
    })
}

/// The 256 6-bit values (0..=63, before the offset of 32) of a Q6_K block.
pub(crate) fn q6k_values(blk: &[u8]) -> [u8; QK_K] {
    let mut v = [0u8; QK_K];
    for half in 0..2 {
        let ql = &blk[64 * half..64 * half + 64];
        let qh = &blk[128 + 32 * half..128 + 32 * half + 32];
        let out = &mut v[128 * half..128 * half + 128];
        for l in 0..32 {
            out[l] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            out[l + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            out[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            out[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    v
}

/// Dequantize one block of `format` into `out` (`block_len` values).
fn dequantize_block(format: QuantFormat, blk: &[u8], out: &mut [f32]) {
    match format {
        QuantFormat::Q4_0 => {
            let d = f16_at(blk, 0);
            for (o, q) in out.iter_mut().zip(nibbles32(&blk[2..18])) {
                *o = d * (f32::from(q) - 8.0);
            }
        }
        QuantFormat::Q4_1 => {
            let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
            for (o, q) in out.iter_mut().zip(nibbles32(&blk[4..20])) {
                *o = d * f32::from(q) + m;
            }
        }
        QuantFormat::Q5_0 => {
            let d = f16_at(blk, 0);
            for (o, q) in out.iter_mut().zip(values5(&blk[2..6], &blk[6..22])) {
                *o = d * (f32::from(q) - 16.0);
            }
        }
        QuantFormat::Q5_1 => {
            let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
            for (o, q) in out.iter_mut().zip(values5(&blk[4..8], &blk[8..24])) {
                *o = d * f32::from(q) + m;
            }
        }
        QuantFormat::Q8_0 => {
            let d = f16_at(blk, 0);
            for (o, &q) in out.iter_mut().zip(&blk[2..34]) {
                *o = d * f32::from(q as i8);
            }
        }
        QuantFormat::Q4K => {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let (scales, qs) = (&blk[4..16], &blk[16..144]);
            for (j, sub) in out.chunks_exact_mut(QK).enumerate() {
                let (sc, m) = q4k_scale_min(scales, j);
                let (dj, mj) = (d * f32::from(sc), dmin * f32::from(m));
                let bytes = &qs[32 * (j / 2)..32 * (j / 2) + 32];
                for (o, &b) in sub.iter_mut().zip(bytes) {
                    let q = if j % 2 == 0 { b & 0x0F } else { b >> 4 };
                    *o = dj * f32::from(q) - mj;
                }
            }
        }
        QuantFormat::Q5K => {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let (scales, qh, qs) = (&blk[4..16], &blk[16..48], &blk[48..176]);
            for (j, sub) in out.chunks_exact_mut(QK).enumerate() {
                let (sc, m) = q4k_scale_min(scales, j);
                let (dj, mj) = (d * f32::from(sc), dmin * f32::from(m));
                for (o, q) in sub.iter_mut().zip(q5k_values(qh, qs, j)) {
                    *o = dj * f32::from(q) - mj;
                }
            }
        }
        QuantFormat::Q6K => {
            let d = f16_at(blk, 208);
            let values = q6k_values(blk);
            for (i, (o, q)) in out.iter_mut().zip(values).enumerate() {
                let sc = f32::from(blk[192 + i / 16] as i8);
                *o = d * sc * (f32::from(q) - 32.0);
            }
        }
        QuantFormat::Mxfp4 => {
            let d = e8m0_half(blk[0]);
            for (o, q) in out.iter_mut().zip(mxfp4_values(&blk[1..17])) {
                *o = f32::from(q) * d;
            }
        }
    }
}

/// Dequantize whole blocks of `format` (`bytes`) into `out`, which must
/// hold exactly their values.
pub fn dequantize(format: QuantFormat, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    let blocks = bytes.len() / format.block_bytes();
    crate::error::check_len(
        "quantized bytes",
        blocks * format.block_bytes(),
        bytes.len(),
    )?;
    crate::error::check_len("dequantized values", blocks * format.block_len(), out.len())?;
    for (blk, o) in bytes
        .chunks_exact(format.block_bytes())
        .zip(out.chunks_exact_mut(format.block_len()))
    {
        dequantize_block(format, blk, o);
    }
    Ok(())
}

/// Quantize `values` (whole blocks of 32) to MXFP4 into `out` (17 bytes a
/// block), as ggml's `quantize_row_mxfp4_ref` does: each block's E8M0
/// exponent is `floor(log2(max |x|)) - 2 + 127` (0 for a block of zeros,
/// wrapped to a byte as ggml's cast wraps it), its scale half of
/// 2^(e - 127), and each value the
/// first code of [`KVALUES_MXFP4`] nearest to it in that scale (values
/// past 12 scales clip to the largest code). The values `i` and `i + 16`
/// share code byte `i`, low nibble first, as the kernels read them.
pub fn quantize_mxfp4(values: &[f32], out: &mut [u8]) -> Result<()> {
    let blocks = values.len() / QK;
    crate::error::check_len("MXFP4 values", blocks * QK, values.len())?;
    let block_bytes = QuantFormat::Mxfp4.block_bytes();
    crate::error::check_len("MXFP4 bytes", blocks * block_bytes, out.len())?;
    let nearest = |x: f32, d: f32| -> u8 {
        let mut best = (0u8, (f32::from(KVALUES_MXFP4[0]) * d - x).abs());
        for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
            let err = (f32::from(k) * d - x).abs();
            if err < best.1 {
                best = (i as u8, err);
            }
        }
        best.0
    };
    for (xs, blk) in values
        .chunks_exact(QK)
        .zip(out.chunks_exact_mut(block_bytes))
    {
        let amax = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
        // ggml's cast of the exponent to a byte wraps below zero (a block
        // under 2^-125 gets a scale near 2^124 and codes of zero): the same
        // bytes here
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as i32 as u8
        } else {
            0
        };
        let d = e8m0_half(e);
        blk[0] = e;
        for j in 0..QK / 2 {
            blk[1 + j] = nearest(xs[j], d) | (nearest(xs[j + QK / 2], d) << 4);
        }
    }
    Ok(())
}
