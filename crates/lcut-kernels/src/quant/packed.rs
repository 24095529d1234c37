//! A quantized matrix repacked at load for the products: rows interleaved
//! [`GROUP_ROWS`] at a time, so that one 32-byte load holds four values of
//! each of eight rows and a product adds every row into its own lane (no
//! permute, no gather, no horizontal sum per row).
//!
//! The same bytes as the file's blocks, rearranged: for each group of eight
//! rows and each block position, one *group block* holding the eight rows'
//! blocks. Within it (all little-endian; "chunk c" is 32 bytes holding
//! bytes 4c..4c+4 of each row's quants, row r at 4r):
//!
//! - `Q4_0`: 8 f16 scales, then the nibbles as 4 chunks: chunk c's low
//!   nibbles are values 4c..4c+4 of each row, its high nibbles values
//!   16+4c..16+4c+4 (144 bytes).
//! - `Q4_1`: 8 scales, 8 minimums, the nibbles as Q4_0 (160).
//! - `Q5_0`: 8 scales, the fifth bits as 8 words (word 2c: bit 4r+j is the
//!   fifth bit of row r's value 4c+j; word 2c+1: of value 16+4c+j), the
//!   nibbles as Q4_0 (176).
//! - `Q5_1`: 8 scales, 8 minimums, fifth bits and nibbles as Q5_0 (192).
//! - `Q8_0`: 8 scales, the signed bytes as 8 chunks (272).
//! - `MXFP4`: 8 exponent bytes, the nibbles as Q4_0 (136).
//! - `Q4_K`: 8 super-scales, 8 super-minimums, the 6-bit scales and minimums
//!   unpacked to bytes (64 each, sub-block j's eight at 8j), the nibbles as
//!   32 chunks: chunk c's low nibbles are sub-block 2(c/8), values
//!   4(c mod 8)..+4, its high nibbles sub-block 2(c/8)+1 (1,184 bytes: 32
//!   more than the eight blocks, 2.8%).
//! - `Q5_K`: the scales and minimums as Q4_K (160 bytes), then for each
//!   pair i of sub-blocks (2i, 2i+1), in the order a product reads them,
//!   the pair's fifth bits as two 32-byte vectors and its eight chunks of
//!   nibbles as Q4_K's chunks 8i..8i+8 (320 bytes a pair; 1,440 in all,
//!   2.3% more than the eight blocks). Byte p of fifth-bit vector h (h < 2)
//!   holds, for each m < 4, the fifth bit of byte p's low nibble in chunk
//!   4h + m at bit m and of its high nibble at bit 4 + m: shifting the
//!   vector right by m puts chunk 4h + m's bits at 0 and 4.
//! - `Q6_K`: 8 super-scales, the 16 signed scales of each row (group g's
//!   eight at 8g), then, in the order a product reads them, for each half
//!   h of 128 values and each c < 8, one *step* of three chunks X, Y, Z
//!   holding values 4c..4c+4 of each of the half's four blocks of 32
//!   (block t's value at byte 4r + j of its chunk is the half's value
//!   32t + 4c + j of row r): X holds block 0's six bits and block 2's top
//!   two above them, Y block 1's and block 3's top two, Z the low nibbles
//!   of blocks 2 (low) and 3 (high) (1,680 bytes, as many as the eight
//!   blocks). A product unpacks a step's four vectors in 11 operations
//!   ([`q6k_unpack_words`]); the file's split into low nibbles and high
//!   bit pairs took 17. Reading in order matters here: the same bytes in
//!   three separate runs were read at a tenth of the speed from memory
//!   (the prefetchers did not follow the jumps between them).
//!
//! A matrix whose rows are not a multiple of eight gets zero rows (scales
//! of zero) to fill its last group; their outputs are never returned.
//!
//! Every output of a row is the same sum whichever rows share its pass: an
//! activation row's arithmetic is the same instructions in its own
//! registers whatever the batch (the batch tests of the decoder hold the
//! logits bit for bit).

use std::ops::Range;

use rayon::prelude::*;

use crate::error::{KernelError, Result, check_len};
use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::aligned::AlignedBytes;
use crate::quant::format::{QuantFormat, q4k_scale_min};
use crate::quant::{Layout, QuantMatrix, portable};

/// Rows interleaved in one group.
pub const GROUP_ROWS: usize = 8;

/// Bytes of one group block of `format`: eight rows' blocks (and, for
/// Q4_K, their scales and minimums unpacked).
pub const fn group_block_bytes(format: QuantFormat) -> usize {
    const {
        assert!(Q5K_PAIR_AT + 4 * Q5K_PAIR_BYTES == GROUP_ROWS * 176 + 32);
    }
    match format {
        QuantFormat::Q4K | QuantFormat::Q5K => GROUP_ROWS * format.block_bytes() + 32,
        _ => GROUP_ROWS * format.block_bytes(),
    }
}

/// Where a Q5_K group block's first pair of sub-blocks (fifth bits, then
/// nibble chunks) starts.
pub(crate) const Q5K_PAIR_AT: usize = 160;
/// Bytes of one pair of a Q5_K group block: 64 of fifth bits, 256 of nibbles.
pub(crate) const Q5K_PAIR_BYTES: usize = 64 + 256;

/// Bytes of a `rows` x `cols` matrix of `format` in the interleaved layout.
pub fn packed_len(format: QuantFormat, rows: usize, cols: usize) -> Result<usize> {
    format.row_bytes(cols)?;
    let blocks = cols / format.block_len();
    Ok(rows.div_ceil(GROUP_ROWS) * blocks * group_block_bytes(format))
}

/// Where the parts of a group block of a 32-value format start: (scales,
/// minimums, fifth-bit words, quants).
const fn parts32(format: QuantFormat) -> (usize, Option<usize>, Option<usize>, usize) {
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q8_0 => (0, None, None, 16),
        QuantFormat::Q4_1 => (0, Some(16), None, 32),
        QuantFormat::Q5_0 => (0, None, Some(16), 48),
        _ => (0, Some(16), Some(32), 64),
    }
}

/// Where a 32-value block keeps its parts: (minimum, fifth bits, quants).
const fn raw32(format: QuantFormat) -> (Option<usize>, Option<usize>, usize) {
    match format {
        QuantFormat::Q4_0 => (None, None, 2),
        QuantFormat::Q4_1 => (Some(2), None, 4),
        QuantFormat::Q5_0 => (None, Some(2), 6),
        QuantFormat::Q5_1 => (Some(2), Some(4), 8),
        _ => (None, None, 2),
    }
}

/// The little-endian u32 at `bytes[at..at + 4]`.
pub(crate) fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Where step `c` of half `h` of a Q6_K block (values 4c..4c+4 of the
/// half's four blocks of 32) starts in the file's block, as three runs of
/// four bytes: the low nibbles of blocks 0 (low) and 2 (high), those of
/// blocks 1 and 3, and the four blocks' high bit pairs (bits 2t, 2t + 1).
const fn q6k_step_bytes(h: usize, c: usize) -> [usize; 3] {
    [64 * h + 4 * c, 64 * h + 32 + 4 * c, 128 + 32 * h + 4 * c]
}

/// Four byte places of a Q6_K step at once (little-endian words of four
/// bytes), from the file's three runs there (see [`q6k_step_bytes`]) to
/// the packed layout's X, Y and Z. The masks come before every left shift
/// and after every right one, so no bits cross between byte places.
const fn q6k_pack_step([a, b, bits]: [u32; 3]) -> [u32; 3] {
    const LOW: u32 = 0x0F0F_0F0F;
    const PAIR: u32 = 0x0303_0303;
    [
        (a & LOW) | ((bits & PAIR) << 4) | (((bits >> 4) & PAIR) << 6),
        (b & LOW) | (((bits >> 2) & PAIR) << 4) | (((bits >> 6) & PAIR) << 6),
        ((a >> 4) & LOW) | (b & !LOW),
    ]
}

/// The inverse of [`q6k_pack_step`]: the file's three runs of four bytes.
const fn q6k_unpack_step([x, y, z]: [u32; 3]) -> [u32; 3] {
    const LOW: u32 = 0x0F0F_0F0F;
    const PAIR: u32 = 0x0303_0303;
    [
        (x & LOW) | ((z & LOW) << 4),
        (y & LOW) | (z & !LOW),
        ((x >> 4) & PAIR)
            | (((y >> 4) & PAIR) << 2)
            | (((x >> 6) & PAIR) << 4)
            | (((y >> 6) & PAIR) << 6),
    ]
}

/// The 6-bit values (0..=63) of the half's four blocks at eight byte
/// places of a packed Q6_K step, from its chunks X, Y and Z read as
/// little-endian words: byte k of word t is block t's value at place k.
/// The products do the same on 32 bytes at once: two masks for blocks 0
/// and 1, and for blocks 2 and 3 the top pair shifted down to bits 4-5
/// beside Z's nibble (the word's shifts carry bits across bytes only
/// outside the masks).
pub(crate) const fn q6k_unpack_words(x: u64, y: u64, z: u64) -> [u64; 4] {
    const SIX: u64 = 0x3F3F_3F3F_3F3F_3F3F;
    const TOP: u64 = 0x3030_3030_3030_3030;
    const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    [
        x & SIX,
        y & SIX,
        ((x >> 2) & TOP) | (z & LOW),
        ((y >> 2) & TOP) | ((z >> 4) & LOW),
    ]
}

/// Interleave the eight blocks `blocks` (one per row, at the same block
/// position) into the group block `out`.
pub(crate) fn pack_block(format: QuantFormat, blocks: &[&[u8]; GROUP_ROWS], out: &mut [u8]) {
    /// `len` bytes of each row (`qs(row)`) as chunks of four bytes per row.
    fn chunks<'a>(out: &mut [u8], qs: impl Fn(usize) -> &'a [u8], len: usize) {
        for c in 0..len / 4 {
            for r in 0..GROUP_ROWS {
                let at = 32 * c + 4 * r;
                out[at..at + 4].copy_from_slice(&qs(r)[4 * c..4 * c + 4]);
            }
        }
    }
    match format {
        QuantFormat::Mxfp4 => {
            for (r, b) in blocks.iter().enumerate() {
                out[r] = b[0];
            }
            chunks(&mut out[GROUP_ROWS..], |r| &blocks[r][1..17], 16);
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            for (r, b) in blocks.iter().enumerate() {
                out[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
                out[16 + 2 * r..18 + 2 * r].copy_from_slice(&b[2..4]);
                for j in 0..8 {
                    let (sc, m) = q4k_scale_min(&b[4..16], j);
                    out[32 + 8 * j + r] = sc;
                    out[96 + 8 * j + r] = m;
                }
            }
            if format == QuantFormat::Q4K {
                chunks(&mut out[160..], |r| &blocks[r][16..144], 128);
                return;
            }
            for i in 0..4 {
                let at = Q5K_PAIR_AT + Q5K_PAIR_BYTES * i;
                for h in 0..2 {
                    for p in 0..32 {
                        let (r, j) = (p / 4, p % 4);
                        let mut byte = 0u8;
                        for m in 0..4 {
                            let qh = blocks[r][16 + 4 * (4 * h + m) + j];
                            byte |= ((qh >> (2 * i)) & 1) << m;
                            byte |= ((qh >> (2 * i + 1)) & 1) << (4 + m);
                        }
                        out[at + 32 * h + p] = byte;
                    }
                }
                let qs = 48 + 32 * i;
                chunks(&mut out[at + 64..], |r| &blocks[r][qs..qs + 32], 32);
            }
        }
        QuantFormat::Q6K => {
            for (r, b) in blocks.iter().enumerate() {
                out[2 * r..2 * r + 2].copy_from_slice(&b[208..210]);
                for g in 0..16 {
                    out[16 + 8 * g + r] = b[192 + g];
                }
            }
            // in the order a product reads them: for each half h and each
            // step c, the step's chunks X, Y and Z
            for h in 0..2 {
                for c in 0..8 {
                    let at = 144 + 96 * (8 * h + c);
                    let file = q6k_step_bytes(h, c);
                    for (r, b) in blocks.iter().enumerate() {
                        let step = q6k_pack_step(file.map(|from| word(b, from)));
                        for (k, w) in step.into_iter().enumerate() {
                            let to = at + 32 * k + 4 * r;
                            out[to..to + 4].copy_from_slice(&w.to_le_bytes());
                        }
                    }
                }
            }
        }
        _ => {
            let (_, min_at, bits_at, qs_at) = parts32(format);
            let (raw_min, raw_bits, raw_qs) = raw32(format);
            for (r, b) in blocks.iter().enumerate() {
                out[2 * r..2 * r + 2].copy_from_slice(&b[0..2]);
                if let (Some(at), Some(raw)) = (min_at, raw_min) {
                    out[at + 2 * r..at + 2 * r + 2].copy_from_slice(&b[raw..raw + 2]);
                }
            }
            if let (Some(at), Some(raw)) = (bits_at, raw_bits) {
                let mut words = [0u32; 8];
                for (r, b) in blocks.iter().enumerate() {
                    let high = u32::from_le_bytes([b[raw], b[raw + 1], b[raw + 2], b[raw + 3]]);
                    for c in 0..4 {
                        for j in 0..4 {
                            let lo = (high >> (4 * c + j)) & 1;
                            let hi = (high >> (16 + 4 * c + j)) & 1;
                            words[2 * c] |= lo << (4 * r + j);
                            words[2 * c + 1] |= hi << (4 * r + j);
                        }
                    }
                }
                for (i, w) in words.iter().enumerate() {
                    out[at + 4 * i..at + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
                }
            }
            let len = if format == QuantFormat::Q8_0 { 32 } else { 16 };
            chunks(&mut out[qs_at..], |r| &blocks[r][raw_qs..raw_qs + len], len);
        }
    }
}

/// Row `lane` of the group block `gblk` back as the file's block, into
/// `out` (`format.block_bytes()` bytes): the inverse of [`pack_block`].
pub(crate) fn unpack_block(format: QuantFormat, gblk: &[u8], lane: usize, out: &mut [u8]) {
    let r = lane;
    let unchunk = |out: &mut [u8], src: &[u8], len: usize| {
        for c in 0..len / 4 {
            out[4 * c..4 * c + 4].copy_from_slice(&src[32 * c + 4 * r..32 * c + 4 * r + 4]);
        }
    };
    match format {
        QuantFormat::Mxfp4 => {
            out[0] = gblk[r];
            unchunk(&mut out[1..17], &gblk[GROUP_ROWS..], 16);
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            out[0..2].copy_from_slice(&gblk[2 * r..2 * r + 2]);
            out[2..4].copy_from_slice(&gblk[16 + 2 * r..18 + 2 * r]);
            let sc = |j: usize| gblk[32 + 8 * j + r];
            let m = |j: usize| gblk[96 + 8 * j + r];
            for j in 0..4 {
                out[4 + j] = sc(j) | ((sc(j + 4) >> 4) << 6);
                out[8 + j] = m(j) | ((m(j + 4) >> 4) << 6);
                out[12 + j] = (sc(j + 4) & 0x0F) | ((m(j + 4) & 0x0F) << 4);
            }
            if format == QuantFormat::Q4K {
                unchunk(&mut out[16..144], &gblk[160..], 128);
                return;
            }
            out[16..48].fill(0);
            for i in 0..4 {
                let at = Q5K_PAIR_AT + Q5K_PAIR_BYTES * i;
                for h in 0..2 {
                    for j in 0..4 {
                        let byte = gblk[at + 32 * h + 4 * r + j];
                        for m in 0..4 {
                            let qh = &mut out[16 + 4 * (4 * h + m) + j];
                            *qh |= ((byte >> m) & 1) << (2 * i);
                            *qh |= ((byte >> (4 + m)) & 1) << (2 * i + 1);
                        }
                    }
                }
                let qs = 48 + 32 * i;
                unchunk(&mut out[qs..qs + 32], &gblk[at + 64..], 32);
            }
        }
        QuantFormat::Q6K => {
            out[208..210].copy_from_slice(&gblk[2 * r..2 * r + 2]);
            for g in 0..16 {
                out[192 + g] = gblk[16 + 8 * g + r];
            }
            for h in 0..2 {
                for c in 0..8 {
                    let at = 144 + 96 * (8 * h + c);
                    let file = q6k_step_bytes(h, c);
                    let step = [0, 1, 2].map(|k| word(gblk, at + 32 * k + 4 * r));
                    for (to, w) in file.into_iter().zip(q6k_unpack_step(step)) {
                        out[to..to + 4].copy_from_slice(&w.to_le_bytes());
                    }
                }
            }
        }
        _ => {
            let (_, min_at, bits_at, qs_at) = parts32(format);
            let (raw_min, raw_bits, raw_qs) = raw32(format);
            out[0..2].copy_from_slice(&gblk[2 * r..2 * r + 2]);
            if let (Some(at), Some(raw)) = (min_at, raw_min) {
                out[raw..raw + 2].copy_from_slice(&gblk[at + 2 * r..at + 2 * r + 2]);
            }
            if let (Some(at), Some(raw)) = (bits_at, raw_bits) {
                let bits = |i: usize| word(gblk, at + 4 * i);
                let mut high = 0u32;
                for c in 0..4 {
                    for j in 0..4 {
                        high |= ((bits(2 * c) >> (4 * r + j)) & 1) << (4 * c + j);
                        high |= ((bits(2 * c + 1) >> (4 * r + j)) & 1) << (16 + 4 * c + j);
                    }
                }
                out[raw..raw + 4].copy_from_slice(&high.to_le_bytes());
            }
            let len = if format == QuantFormat::Q8_0 { 32 } else { 16 };
            unchunk(&mut out[raw_qs..raw_qs + len], &gblk[qs_at..], len);
        }
    }
}

/// A quantized matrix in the interleaved layout, owning its bytes.
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    format: QuantFormat,
    rows: usize,
    cols: usize,
    bytes: AlignedBytes,
}

impl PackedMatrix {
    /// `m` (in the file's row layout) repacked, its row `i` taken from row
    /// `order(i)` of `m` (to put rows in another order on the way), the
    /// groups packed in parallel on rayon's threads.
    pub fn pack(m: &QuantMatrix<'_>, order: impl Fn(usize) -> usize + Sync) -> Result<Self> {
        Self::pack_in_slabs(m, order, usize::MAX, |_| {})
    }

    /// [`Self::pack`] in slabs of `slab_rows` rows (rounded up to whole
    /// groups), one after another, telling `done` each slab's rows once they
    /// are packed: a caller reading `m` from a file mapping releases those
    /// rows' pages as it goes, so that a large matrix is not held twice
    /// (mapped and packed) at once.
    pub fn pack_in_slabs(
        m: &QuantMatrix<'_>,
        order: impl Fn(usize) -> usize + Sync,
        slab_rows: usize,
        mut done: impl FnMut(std::ops::Range<usize>),
    ) -> Result<Self> {
        let format = m.format();
        let (rows, cols) = (m.rows(), m.cols());
        let len = packed_len(format, rows, cols)?;
        let raw = match m.layout {
            Layout::Rows => m.data,
            Layout::Interleaved => {
                return Err(KernelError::Heads(
                    "a matrix is repacked from the file's row layout".into(),
                ));
            }
        };
        if let Some(bad) = (0..rows).map(&order).find(|&r| r >= rows) {
            return Err(KernelError::Rows {
                start: bad,
                end: bad + 1,
                len: rows,
            });
        }
        let mut bytes = AlignedBytes::for_weights(len);
        let blocks = cols / format.block_len();
        let (bb, gb) = (format.block_bytes(), group_block_bytes(format));
        let zero = vec![0u8; bb];
        let group_len = (blocks * gb).max(1);
        let slab_groups = slab_rows.div_ceil(GROUP_ROWS).max(1);
        for (slab, part) in bytes
            .as_mut_slice()
            .chunks_mut(group_len.saturating_mul(slab_groups))
            .enumerate()
        {
            let first = slab.saturating_mul(slab_groups);
            part.par_chunks_mut(group_len)
                .enumerate()
                .for_each(|(i, out)| {
                    let g = first + i;
                    for (b, out) in out.chunks_exact_mut(gb).enumerate() {
                        let block = |lane: usize| -> &[u8] {
                            let r = g * GROUP_ROWS + lane;
                            if r < rows {
                                let at = order(r) * m.row_bytes + b * bb;
                                &raw[at..at + bb]
                            } else {
                                &zero
                            }
                        };
                        let eight: [&[u8]; GROUP_ROWS] = std::array::from_fn(block);
                        pack_block(format, &eight, out);
                    }
                });
            let end = first.saturating_add(slab_groups).saturating_mul(GROUP_ROWS);
            done((first * GROUP_ROWS).min(rows)..end.min(rows));
        }
        Ok(Self {
            format,
            rows,
            cols,
            bytes,
        })
    }

    /// The matrix as the kernels read it.
    pub fn view(&self) -> QuantMatrix<'_> {
        QuantMatrix {
            format: self.format,
            data: self.bytes.as_slice(),
            rows: self.rows,
            cols: self.cols,
            row_bytes: self.format.row_bytes(self.cols).unwrap_or(0),
            layout: Layout::Interleaved,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }
}

/// Row `r` of an interleaved matrix back in the file's layout, into `out`
/// (`row_bytes` bytes).
pub(crate) fn unpack_row(m: &QuantMatrix<'_>, r: usize, out: &mut [u8]) {
    let format = m.format;
    let blocks = m.cols / format.block_len();
    let (bb, gb) = (format.block_bytes(), group_block_bytes(format));
    let group = &m.data[(r / GROUP_ROWS) * blocks * gb..][..blocks * gb];
    for (b, o) in out[..blocks * bb].chunks_exact_mut(bb).enumerate() {
        unpack_block(format, &group[b * gb..(b + 1) * gb], r % GROUP_ROWS, o);
    }
}

/// Row `r` of an interleaved matrix dequantized into `out` (`cols`
/// values), a block at a time.
pub(crate) fn dequantize_row(m: &QuantMatrix<'_>, r: usize, out: &mut [f32]) -> Result<()> {
    let format = m.format;
    let (len, bb, gb) = (
        format.block_len(),
        format.block_bytes(),
        group_block_bytes(format),
    );
    check_len("dequantized values", m.cols, out.len())?;
    let blocks = m.cols / len;
    let group = &m.data[(r / GROUP_ROWS) * blocks * gb..][..blocks * gb];
    let mut raw = [0u8; 256];
    for (b, o) in out.chunks_exact_mut(len).enumerate() {
        unpack_block(
            format,
            &group[b * gb..(b + 1) * gb],
            r % GROUP_ROWS,
            &mut raw[..bb],
        );
        super::dequantize(format, &raw[..bb], o)?;
    }
    Ok(())
}

/// Rows `rows` of the interleaved matrix `m` dot the activation rows `a`:
/// `out[(r - rows.start) * n + i]`, as [`super::matvec_rows`] lays them.
pub(crate) fn rows_unchecked(
    isa: Isa,
    m: &QuantMatrix<'_>,
    a: &[Q8Row<'_>],
    rows: Range<usize>,
    out: &mut [f32],
) {
    let n = a.len();
    if n == 0 || rows.is_empty() {
        return;
    }
    let blocks = m.cols / m.format.block_len();
    let gb = blocks * group_block_bytes(m.format);
    let mut sums = [[0f32; GROUP_ROWS]; super::MAX_BATCH];
    let mut raw = Vec::new();
    for g in rows.start / GROUP_ROWS..rows.end.div_ceil(GROUP_ROWS) {
        let group = &m.data[g * gb..(g + 1) * gb];
        group_product(isa, m.format, group, a, &mut sums, &mut raw);
        let first = g * GROUP_ROWS;
        let lanes = rows.start.max(first)..rows.end.min(first + GROUP_ROWS);
        for r in lanes {
            let at = (r - rows.start) * n;
            for (o, s) in out[at..at + n].iter_mut().zip(&sums) {
                *o = s[r - first];
            }
        }
    }
}

/// One group's eight rows dot every activation row: `sums[i][lane]`.
fn group_product(
    isa: Isa,
    format: QuantFormat,
    group: &[u8],
    a: &[Q8Row<'_>],
    sums: &mut [[f32; GROUP_ROWS]; super::MAX_BATCH],
    raw: &mut Vec<u8>,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 && super::packed_avx512::group(format, group, a, sums) {
            return;
        }
        if isa >= Isa::Avx2 && super::packed_avx2::group(format, group, a, sums) {
            return;
        }
    }
    let _ = isa;
    // the portable reference: each row back in the file's layout
    let (bb, gb) = (format.block_bytes(), group_block_bytes(format));
    let blocks = group.len() / gb;
    raw.resize(blocks * bb, 0);
    for lane in 0..GROUP_ROWS {
        for b in 0..blocks {
            unpack_block(
                format,
                &group[b * gb..(b + 1) * gb],
                lane,
                &mut raw[b * bb..(b + 1) * bb],
            );
        }
        for (s, act) in sums.iter_mut().zip(a) {
            s[lane] = portable::dot_row(format, raw, act);
        }
    }
}

/// Check that `data` holds a `rows` x `cols` interleaved matrix of `format`.
pub(crate) fn check_packed(
    format: QuantFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
) -> Result<usize> {
    let row_bytes = format.row_bytes(cols)?;
    check_len(
        "packed matrix bytes",
        packed_len(format, rows, cols)?,
        data.len(),
    )?;
    Ok(row_bytes)
}

/// The activation words (four values as a little-endian i32) of row `a`.
#[inline(always)]
pub(crate) fn act_word(a: &Q8Row<'_>, word: usize) -> i32 {
    super::acts::word_of(a.q, word)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::FORMATS;
    use crate::testdata::{Rng, random_blocks};

    #[test]
    fn packing_keeps_every_byte_and_unpacks_to_the_file_rows() {
        let mut rng = Rng::new(7);
        for format in FORMATS {
            for rows in [1, 8, 13, 24] {
                let cols = 2 * format.block_len();
                let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
                let m = QuantMatrix::new(format, &data, rows, cols).expect("fits");
                let p = PackedMatrix::pack(&m, |r| rows - 1 - r).expect("packs");
                assert_eq!(
                    p.bytes(),
                    packed_len(format, rows, cols).expect("whole blocks")
                );
                let v = p.view();
                let mut back = vec![0u8; m.row_bytes];
                let (mut got, mut want_f) = (vec![0f32; cols], vec![0f32; cols]);
                for r in 0..rows {
                    unpack_row(&v, r, &mut back);
                    let want = &data[(rows - 1 - r) * m.row_bytes..(rows - r) * m.row_bytes];
                    assert_eq!(back, want, "{} row {r}", format.name());
                    v.dequantize_row(r, &mut got).expect("a row");
                    m.dequantize_row(rows - 1 - r, &mut want_f).expect("a row");
                    assert_eq!(got, want_f, "{} row {r}", format.name());
                }
            }
        }
    }

    /// Every byte triple of the file's Q6_K step packs and unpacks back at
    /// every byte place of a word, whatever its neighbours hold, and the
    /// packed bytes unpack, beside any others, to the values the file's
    /// decoder ([`crate::quant::format::q6k_values`]) reads from them.
    #[test]
    fn q6k_steps_pack_every_triple_back_and_unpack_to_the_file_values() {
        use crate::quant::format::q6k_values;
        // 32 triples a block: triple l at its place l of the first half
        // (low nibbles at l and 32 + l, high bit pairs at 128 + l)
        for first in (0..1u32 << 24).step_by(32) {
            let mut blk = [0u8; 210];
            for l in 0..32 {
                let [a, b, bits, _] = (first + l as u32).to_le_bytes();
                (blk[l], blk[32 + l], blk[128 + l]) = (a, b, bits);
            }
            let values = q6k_values(&blk);
            for l in 0..32 {
                let n = first + l as u32;
                let [a, b, bits, _] = n.to_le_bytes();
                // the triple at one byte place of the words, its
                // neighbours' bytes all ones, so that bits crossing places
                // would show
                let place = 8 * (n % 4);
                let at_place = |v: u8| !(0xFF << place) | (u32::from(v) << place);
                let words = q6k_pack_step([a, b, bits].map(at_place));
                assert_eq!(q6k_unpack_step(words), [a, b, bits].map(at_place));
                let step = words.map(|w| (w >> place) as u8);
                assert_eq!(
                    step,
                    q6k_pack_step([a, b, bits].map(u32::from)).map(|w| w as u8)
                );
                let want = [0, 32, 64, 96].map(|t| values[t + l]);
                // a different triple's bytes beside it, so that bits the
                // shifts carry across bytes must be masked off
                let shift = 8 * (n as usize % 8);
                let other = |k: usize| u64::from(step[(k + 1) % 3] ^ 0xFF) * 0x0101_0101_0101_0101;
                let chunk =
                    |k: usize| (other(k) & !(0xFF << shift)) | (u64::from(step[k]) << shift);
                let got =
                    q6k_unpack_words(chunk(0), chunk(1), chunk(2)).map(|w| (w >> shift) as u8);
                assert_eq!(got, want, "triple {a:#x} {b:#x} {bits:#x}");
            }
        }
    }
}
