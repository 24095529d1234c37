//! The chunk product's micro-kernel over sixteen unpacked weight rows, for
//! every format whose weights are whole numbers per block of 32 values with
//! an f32 scale: the 4- and 5-bit formats (Q4_0, Q4_1, Q5_0, Q5_1, MXFP4
//! and Q4_K's and Q5_K's sub-blocks), weight `d · q + e` with q unsigned, and Q6_K, weight
//! `d · sc · (q - 32)` with a signed 8-bit scale `sc` per half block.
//!
//! Sixteen weight rows are unpacked once into bytes interleaved four at a
//! time (lane r of a 64-byte step holds four values of row r), so that one
//! integer multiply-add of four unsigned weight bytes against four signed
//! activation bytes broadcast to every lane adds into lane r the dot
//! product of row r: `vpdpbusd` on AVX-512 VNNI ([`super::tile_avx512`]),
//! `vpmaddubsw` and `vpmaddwd` on AVX2 ([`super::tile_avx2`]), which give
//! the same integers (no pair of products here reaches the 16-bit
//! saturation: 2 · 63 · 127 < 32767). After the eight steps of a block
//! each lane holds the block's integer sum (Q6_K: one per half, combined
//! with the halves' scales in integers as the row kernels do), and one
//! conversion and one or two multiply-adds in f32 scale sixteen (row,
//! block) sums at once, lane by lane in the same order on both levels, so
//! the two levels' outputs are the same bits.
//!
//! Q8_0 has no tile here: its weights' own error is so small that 8-bit
//! activations in every prefill chunk doubled its logits' largest
//! deviation from transformers' (0.11 to 0.21 of the logit scale on the
//! oracle models); its tile multiplies 16-bit activations instead
//! ([`super::tile_q8`]).

#![allow(unsafe_code)]

use std::ops::Range;

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::aligned::AlignedBytes;
use crate::quant::format::{
    MXFP4_PLUS12, QK, QK_K, QuantFormat, e8m0_half, f16_at, nibbles32, q4k_scale_min, q5k_values,
    q6k_values, values5,
};
use crate::quant::packed::{
    GROUP_ROWS, Q5K_PAIR_AT, Q5K_PAIR_BYTES, group_block_bytes, q6k_unpack_words,
};
use crate::quant::tile_amx::{AmxActs, Tiles};
use crate::quant::{Layout, QuantMatrix};

/// Weight rows per tile (one per lane of a 512-bit register).
pub(super) const TILE: usize = 16;

/// Bytes of one block of a tile: eight steps of four values of each row.
pub(super) const BLOCK_BYTES: usize = 8 * 64;

/// Most activation rows sharing one pass over a tile on AVX2 (and in Q8_0's
/// tile on both levels).
pub(super) const GROUP: usize = 4;

/// Most activation rows sharing one pass over a tile on AVX-512: sixteen
/// chains of `vpdpbusd` (two per row) keep its units busy where four rows'
/// single chains waited on each instruction's latency.
pub(super) const GROUP_AVX512: usize = 8;

/// Whether `format` has the tile path at `isa` on this CPU.
pub(super) fn supports(isa: Isa, format: QuantFormat) -> bool {
    level(isa).is_some() && format != QuantFormat::Q8_0
}

/// Narrowest rows the AMX tiles take. On narrower matrices (Gemma 3 270M's
/// 640 columns, SmolLM2's 576) a whole prefill ran 1-11% slower with them
/// than on the AVX-512 tile (six interleaved rounds on Gemma, mixed on
/// SmolLM2), though one thread's product alone ran as fast or faster.
pub(super) const AMX_MIN_COLS: usize = 2048;

/// Whether the chunk product of `format` at `isa`, rows of `cols` values,
/// takes the AMX tiles here: every format with this tile but Q6_K, rows of
/// at least [`AMX_MIN_COLS`], where AMX runs.
pub(super) fn takes_amx(isa: Isa, format: QuantFormat, cols: usize) -> bool {
    supports(isa, format)
        && level(isa) == Some(Isa::Amx)
        && format != QuantFormat::Q6K
        && cols >= AMX_MIN_COLS
}

/// The level a tile (this one or Q8_0's) runs on at `isa` here: AMX (the
/// 8-bit tile only; Q8_0's runs its AVX-512 path there), AVX-512 VNNI or
/// AVX2, `None` below.
pub(super) fn level(isa: Isa) -> Option<Isa> {
    if isa >= Isa::Amx && Isa::Amx.available() {
        Some(Isa::Amx)
    } else if isa >= Isa::Avx512 && Isa::Avx512.available() {
        Some(Isa::Avx512)
    } else if isa >= Isa::Avx2 && Isa::Avx2.available() {
        Some(Isa::Avx2)
    } else {
        None
    }
}

/// The activation rows `a` in groups of up to `G`: `group(rows, sums)`
/// leaves each row's products with a tile's rows in `sums`, which go to
/// `o[i * stride + r]` for activation row i and weight row r < `rows`.
pub(super) fn by_groups<A, const G: usize>(
    a: &[A],
    rows: usize,
    o: &mut [f32],
    stride: usize,
    mut group: impl FnMut(&[A], &mut [[f32; TILE]; G]),
) {
    let mut sums = [[0f32; TILE]; G];
    for (g, chunk) in a.chunks(G).enumerate() {
        group(chunk, &mut sums);
        for (i, s) in sums.iter().enumerate().take(chunk.len()) {
            let at = (g * G + i) * stride;
            o[at..at + rows].copy_from_slice(&s[..rows]);
        }
    }
}

/// Where one activation row's blocks start (values, scales, scaled sums,
/// sums per 16), checked once against the tile's blocks so that the inner
/// loop reads them without bounds checks.
#[derive(Clone, Copy)]
pub(super) struct ActPtrs {
    q: *const i8,
    d: *const f32,
    s: *const f32,
    sum16: *const i16,
}

impl ActPtrs {
    /// The pointers of `a`; panics if it holds fewer than `blocks` blocks.
    pub(super) fn of(a: &Q8Row<'_>, blocks: usize) -> Self {
        assert!(
            a.q.len() >= QK * blocks
                && a.d.len() >= blocks
                && a.s.len() >= blocks
                && a.sum16.len() >= 2 * blocks,
            "an activation row shorter than the tile's {blocks} blocks"
        );
        Self {
            q: a.q.as_ptr(),
            d: a.d.as_ptr(),
            s: a.s.as_ptr(),
            sum16: a.sum16.as_ptr(),
        }
    }

    /// Activation bytes `4k..4k + 4` of block `b` as one word.
    ///
    /// # Safety
    /// `b` is below the blocks checked in [`ActPtrs::of`] and `k < 8`.
    #[inline(always)]
    pub(super) unsafe fn word(self, b: usize, k: usize) -> i32 {
        // SAFETY: within the row's `QK * blocks` values (the caller's bounds).
        unsafe { self.q.add(QK * b + 4 * k).cast::<i32>().read_unaligned() }
    }

    /// Block `b`'s scale and scaled sum.
    ///
    /// # Safety
    /// `b` is below the blocks checked in [`ActPtrs::of`].
    #[inline(always)]
    pub(super) unsafe fn scales(self, b: usize) -> (f32, f32) {
        // SAFETY: within the row's `blocks` scales (the caller's bounds).
        unsafe { (*self.d.add(b), *self.s.add(b)) }
    }

    /// The sum of the values of half `h` of block `b`.
    ///
    /// # Safety
    /// `b` is below the blocks checked in [`ActPtrs::of`] and `h < 2`.
    #[inline(always)]
    pub(super) unsafe fn sum16(self, b: usize, h: usize) -> i32 {
        // SAFETY: within the row's `2 * blocks` sums (the caller's bounds).
        i32::from(unsafe { *self.sum16.add(2 * b + h) })
    }
}

/// How a block's integer sums become weights' products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Scaling {
    /// `d · sum + e · s` (s: the activation block's scaled sum).
    #[default]
    Offset,
    /// `d · (sc_0 · (sum_0 - 32 · sum16_0) + sc_1 · (sum_1 - 32 · sum16_1))`
    /// over the block's two halves (Q6_K).
    Centered,
}

/// The scales of one 32-value block of one row.
#[derive(Debug, Clone, Copy)]
enum BlockScale {
    /// Weight `d · q + e`.
    Offset { d: f32, e: f32 },
    /// Weight `d · sc[half] · (q - 32)`.
    Centered { d: f32, sc: [i8; 2] },
}

/// Call `f(b, values, scale)` for each 32-value block `b` of a quantized
/// row of a format with the tile path, its values as unsigned bytes.
fn for_each_block32(
    format: QuantFormat,
    row: &[u8],
    mut f: impl FnMut(usize, &[u8; QK], BlockScale),
) {
    for (i, blk) in row.chunks_exact(format.block_bytes()).enumerate() {
        let d = f16_at(blk, 0);
        let offset = |values: &[u8; QK], e: f32| (*values, BlockScale::Offset { d, e });
        match format {
            QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q5_0 | QuantFormat::Q5_1 => {
                let (values, scale) = match format {
                    QuantFormat::Q4_0 => offset(&nibbles32(&blk[2..18]), -8.0 * d),
                    QuantFormat::Q4_1 => offset(&nibbles32(&blk[4..20]), f16_at(blk, 2)),
                    QuantFormat::Q5_0 => offset(&values5(&blk[2..6], &blk[6..22]), -16.0 * d),
                    _ => offset(&values5(&blk[4..8], &blk[8..24]), f16_at(blk, 2)),
                };
                f(i, &values, scale);
            }
            QuantFormat::Q4K | QuantFormat::Q5K => {
                let dmin = f16_at(blk, 2);
                for j in 0..QK_K / QK {
                    let (sc, m) = q4k_scale_min(&blk[4..16], j);
                    let values = if format == QuantFormat::Q5K {
                        q5k_values(&blk[16..48], &blk[48..176], j)
                    } else {
                        let bytes = &blk[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
                        std::array::from_fn(|l| {
                            if j % 2 == 0 {
                                bytes[l] & 0x0F
                            } else {
                                bytes[l] >> 4
                            }
                        })
                    };
                    let scale = BlockScale::Offset {
                        d: d * f32::from(sc),
                        e: -(dmin * f32::from(m)),
                    };
                    f(8 * i + j, &values, scale);
                }
            }
            QuantFormat::Q6K => {
                let d = f16_at(blk, 208);
                let values = q6k_values(blk);
                for j in 0..QK_K / QK {
                    let v: [u8; QK] = std::array::from_fn(|l| values[QK * j + l]);
                    let sc = [blk[192 + 2 * j] as i8, blk[193 + 2 * j] as i8];
                    f(8 * i + j, &v, BlockScale::Centered { d, sc });
                }
            }
            QuantFormat::Mxfp4 => {
                // unsigned as the tile takes them: code value + 12, the
                // 12 scales taken back off as the offset
                let d = e8m0_half(blk[0]);
                let values = nibbles32(&blk[1..17]).map(|q| MXFP4_PLUS12[usize::from(q)]);
                f(i, &values, BlockScale::Offset { d, e: -12.0 * d });
            }
            QuantFormat::Q8_0 => unreachable!("Q8_0 has no tile path (`supports`)"),
        }
    }
}

/// Up to [`TILE`] weight rows unpacked: per block, eight steps of 64 bytes
/// (four values of each row) and the rows' scales.
#[derive(Debug, Default)]
pub(super) struct Tile {
    /// The values, [block][step][row][4], from the start of a cache line
    /// (a step's 64 bytes on one line).
    pub(super) q: AlignedBytes,
    /// Each row's scale, [block][row].
    pub(super) d: Vec<f32>,
    /// `Offset`: each row's offset, [block][row].
    pub(super) e: Vec<f32>,
    /// `Centered`: each row's scale of each half, [block][half][row].
    pub(super) sc: Vec<i32>,
    /// How the sums are scaled.
    pub(super) scaling: Scaling,
    /// Steps whose 16-bit pair sums can be added without saturating (each
    /// pair is at most 2 · largest value · 128): 8 for 4-bit values, 4 for
    /// 5-bit, 2 for Q6_K's 6-bit; a divisor of 4.
    pub(super) i16_steps: usize,
    /// Rows unpacked (the lanes past them hold zeros).
    rows: usize,
}

impl Tile {
    /// Make the tile hold `rows` rows of `format` of `blocks` blocks of 32
    /// values each, the scaling and the 16-bit step count the format's:
    /// what both fills start from. Every value, scale and offset is zero,
    /// unless `every_lane_written` says the fill writes all [`TILE`] lanes
    /// of every block itself (then they keep whatever they held).
    fn start(&mut self, format: QuantFormat, rows: usize, blocks: usize, every_lane_written: bool) {
        self.rows = rows;
        self.scaling = if format == QuantFormat::Q6K {
            Scaling::Centered
        } else {
            Scaling::Offset
        };
        self.i16_steps = format.i16_pair_steps();
        let (offsets, scales) = match self.scaling {
            Scaling::Offset => (blocks * TILE, 0),
            Scaling::Centered => (0, blocks * 2 * TILE),
        };
        if every_lane_written {
            self.q.resize(blocks * BLOCK_BYTES);
            self.d.resize(blocks * TILE, 0.0);
            self.e.resize(offsets, 0.0);
            self.sc.resize(scales, 0);
        } else {
            self.q.reset(blocks * BLOCK_BYTES);
            reset(&mut self.d, blocks * TILE);
            reset(&mut self.e, offsets);
            reset(&mut self.sc, scales);
        }
    }

    /// Unpack the rows `w` (`row_bytes` each, at most [`TILE`]) of `format`.
    pub(super) fn fill(&mut self, format: QuantFormat, w: &[u8], row_bytes: usize) {
        let blocks = row_bytes / format.block_bytes() * (format.block_len() / QK);
        self.start(format, w.len() / row_bytes, blocks, false);
        for (r, row) in w.chunks_exact(row_bytes).enumerate() {
            for_each_block32(format, row, |b, values, scale| {
                match scale {
                    BlockScale::Offset { d, e } => {
                        self.d[b * TILE + r] = d;
                        self.e[b * TILE + r] = e;
                    }
                    BlockScale::Centered { d, sc } => {
                        self.d[b * TILE + r] = d;
                        self.sc[(2 * b) * TILE + r] = i32::from(sc[0]);
                        self.sc[(2 * b + 1) * TILE + r] = i32::from(sc[1]);
                    }
                }
                for k in 0..8 {
                    let at = b * BLOCK_BYTES + k * 64 + r * 4;
                    self.q.as_mut_slice()[at..at + 4].copy_from_slice(&values[4 * k..4 * k + 4]);
                }
            });
        }
    }

    /// Unpack the rows `rows` (at most [`TILE`], starting at a multiple of
    /// eight) of the interleaved matrix `m` straight from its group blocks,
    /// where eight rows' four bytes already sit side by side as a tile's
    /// step holds them: no row is rebuilt in the file's layout first.
    /// Returns false, leaving the tile as it was, for a format or layout
    /// this does not cover (Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, Q4_K, Q5_K and
    /// Q6_K interleaved are covered).
    pub(super) fn fill_interleaved(&mut self, m: &QuantMatrix<'_>, rows: Range<usize>) -> bool {
        let format = m.format;
        let covered = matches!(
            format,
            QuantFormat::Q4_0
                | QuantFormat::Q4_1
                | QuantFormat::Q5_0
                | QuantFormat::Q5_1
                | QuantFormat::Mxfp4
                | QuantFormat::Q4K
                | QuantFormat::Q5K
                | QuantFormat::Q6K
        );
        if m.layout != Layout::Interleaved || !covered || !rows.start.is_multiple_of(GROUP_ROWS) {
            return false;
        }
        let (len, gb) = (format.block_len(), group_block_bytes(format));
        let blocks_per_row = m.cols / len;
        let blocks = blocks_per_row * (len / QK);
        // two whole groups of eight rows write every lane (the group blocks
        // give each of their rows every value and scale)
        self.start(format, rows.len(), blocks, rows.len() == TILE);
        let groups = rows.start / GROUP_ROWS..rows.end.div_ceil(GROUP_ROWS);
        for (g, group) in groups.enumerate() {
            let data = &m.data[group * blocks_per_row * gb..][..blocks_per_row * gb];
            for (i, gblk) in data.chunks_exact(gb).enumerate() {
                match format {
                    QuantFormat::Q4_0
                    | QuantFormat::Q4_1
                    | QuantFormat::Q5_0
                    | QuantFormat::Q5_1 => self.put_32(format, g, i, gblk),
                    QuantFormat::Mxfp4 => self.put_mxfp4(g, i, gblk),
                    QuantFormat::Q6K => self.put_q6k(g, i, gblk),
                    QuantFormat::Q5K => self.put_q4k(g, i, gblk, true),
                    _ => self.put_q4k(g, i, gblk, false),
                }
            }
        }
        true
    }

    /// Step `k` of 32-value block `b` for the eight rows of group `g` of
    /// the tile: the low (`high` false) or high nibbles of `chunk`, and
    /// with `fifth` (`(bits, s)`: 32 bytes, a shift below 8) bit `s` of
    /// each byte of `bits` above its nibble (Q5_K).
    #[inline(always)]
    fn put_nibbles(
        &mut self,
        b: usize,
        k: usize,
        g: usize,
        chunk: &[u8],
        high: bool,
        fifth: Option<(&[u8], usize)>,
    ) {
        const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
        const ONE: u64 = 0x0101_0101_0101_0101;
        let at = b * BLOCK_BYTES + k * 64 + 4 * GROUP_ROWS * g;
        let to = &mut self.q.as_mut_slice()[at..at + 4 * GROUP_ROWS];
        // eight bytes at a time in a word: a nibble per byte needs no lane
        // shift the baseline instruction set lacks
        for (n, (to, from)) in to
            .chunks_exact_mut(8)
            .zip(chunk.chunks_exact(8))
            .enumerate()
        {
            let w = u64::from_le_bytes(from.try_into().expect("eight bytes"));
            let mut v = if high { (w >> 4) & LOW } else { w & LOW };
            if let Some((bits, s)) = fifth {
                let h = u64::from_le_bytes(bits[8 * n..8 * n + 8].try_into().expect("eight bytes"));
                // a shift below 8 brings each byte's bit s to its bit 0
                v |= ((h >> s) & ONE) << 4;
            }
            to.copy_from_slice(&v.to_le_bytes());
        }
    }

    /// Group block `i` (one block of eight rows of `format`: Q4_0, Q4_1,
    /// Q5_0 or Q5_1, laid out as `packed`'s module docs say) into group
    /// `g`: each row's scale, and its offset (`-8 d`, `-16 d` or the
    /// minimum), then the values with AVX2.
    fn put_32(&mut self, format: QuantFormat, g: usize, i: usize, gblk: &[u8]) {
        let (min_at, fifth_at, qs) = match format {
            QuantFormat::Q4_0 => (None, None, 16),
            QuantFormat::Q4_1 => (Some(16), None, 32),
            QuantFormat::Q5_0 => (None, Some(16), 48),
            _ => (Some(16), Some(32), 64),
        };
        let zero_offset = if fifth_at.is_some() { -16.0 } else { -8.0 };
        for r in 0..GROUP_ROWS {
            let d = f16_at(gblk, 2 * r);
            self.d[i * TILE + GROUP_ROWS * g + r] = d;
            self.e[i * TILE + GROUP_ROWS * g + r] = match min_at {
                Some(at) => f16_at(gblk, at + 2 * r),
                None => zero_offset * d,
            };
        }
        let fifth = fifth_at.map(|at| &gblk[at..at + 32]);
        assert!(Isa::Avx2.available(), "the tile needs AVX2, FMA and F16C");
        // SAFETY: AVX2, FMA and F16C run here (asserted above: the tile's
        // level implies all three).
        unsafe { values32_avx2(self.q.as_mut_slice(), g, i, &gblk[qs..qs + 128], fifth) };
    }

    /// Group block `i` (one MXFP4 block of eight rows: their exponents, then
    /// the codes laid out as Q4_0's nibbles) into group `g`, each code as
    /// its value plus 12 and the 12 taken back off as the offset, as
    /// [`Tile::fill`] takes the file's blocks.
    fn put_mxfp4(&mut self, g: usize, i: usize, gblk: &[u8]) {
        for (r, &exponent) in gblk[..GROUP_ROWS].iter().enumerate() {
            let d = e8m0_half(exponent);
            self.d[i * TILE + GROUP_ROWS * g + r] = d;
            self.e[i * TILE + GROUP_ROWS * g + r] = -12.0 * d;
        }
        // values 4c..4c + 4 are the low codes of chunk c, values 16 + 4c..
        // the high ones (Q4_0's order)
        for (c, chunk) in gblk[GROUP_ROWS..GROUP_ROWS + 128]
            .chunks_exact(32)
            .enumerate()
        {
            let low = i * BLOCK_BYTES + c * 64 + 4 * GROUP_ROWS * g;
            let high = low + 4 * 64;
            let (head, tail) = self.q.as_mut_slice().split_at_mut(high);
            mxfp4_codes(chunk, &mut head[low..low + 32], &mut tail[..32]);
        }
    }

    /// Group block `i` (one Q4_K block of eight rows, eight sub-blocks of
    /// 32; `five`: one Q5_K block) into group `g`.
    fn put_q4k(&mut self, g: usize, i: usize, gblk: &[u8], five: bool) {
        assert!(Isa::Avx2.available(), "the tile needs AVX2, FMA and F16C");
        // SAFETY: AVX2, FMA and F16C run here (asserted above: the tile's
        // level implies all three).
        unsafe { q4k_scales_avx2(&mut self.d, &mut self.e, g, i, gblk) };
        if !five {
            // SAFETY: as above.
            unsafe { q4k_nibbles_avx2(self.q.as_mut_slice(), g, i, &gblk[160..160 + 1024]) };
            return;
        }
        // Q5_K: each pair's fifth-bit vectors, then its eight chunks; chunk
        // 4h + m's bits are bits m (low nibbles) and 4 + m (high) of vector h
        for p in 0..4 {
            let at = Q5K_PAIR_AT + Q5K_PAIR_BYTES * p;
            let chunks = &gblk[at + 64..at + Q5K_PAIR_BYTES];
            for (k, chunk) in chunks.chunks_exact(32).enumerate() {
                let (h, m) = (k / 4, k % 4);
                let bits = &gblk[at + 32 * h..at + 32 * h + 32];
                self.put_nibbles(8 * i + 2 * p, k, g, chunk, false, Some((bits, m)));
                self.put_nibbles(8 * i + 2 * p + 1, k, g, chunk, true, Some((bits, 4 + m)));
            }
        }
    }

    /// Group block `i` (one Q6_K block of eight rows) into group `g`: per
    /// half h of 128 values and step c, the packed copy's three chunks give
    /// step c of the half's four 32-value blocks ([`q6k_unpack_words`]).
    fn put_q6k(&mut self, g: usize, i: usize, gblk: &[u8]) {
        for r in 0..GROUP_ROWS {
            let d = f16_at(gblk, 2 * r);
            for j in 0..QK_K / QK {
                let b = 8 * i + j;
                self.d[b * TILE + GROUP_ROWS * g + r] = d;
                for half in 0..2 {
                    let sc = gblk[16 + 8 * (2 * j + half) + r] as i8;
                    self.sc[(2 * b + half) * TILE + GROUP_ROWS * g + r] = i32::from(sc);
                }
            }
        }
        let word = |bytes: &[u8], n: usize| {
            u64::from_le_bytes(bytes[8 * n..8 * n + 8].try_into().expect("eight bytes"))
        };
        for h in 0..2 {
            for c in 0..8 {
                let at = 144 + 96 * (8 * h + c);
                let (x, y, z) = (
                    &gblk[at..at + 32],
                    &gblk[at + 32..at + 64],
                    &gblk[at + 64..at + 96],
                );
                for n in 0..4 {
                    let values = q6k_unpack_words(word(x, n), word(y, n), word(z, n));
                    for (j, v) in values.into_iter().enumerate() {
                        let to = (8 * i + 4 * h + j) * BLOCK_BYTES + c * 64 + 4 * GROUP_ROWS * g;
                        self.q.as_mut_slice()[to + 8 * n..to + 8 * n + 8]
                            .copy_from_slice(&v.to_le_bytes());
                    }
                }
            }
        }
    }

    /// Blocks of 32 values per row.
    pub(super) fn blocks(&self) -> usize {
        self.d.len() / TILE
    }

    /// The tile against every activation row `a` on the best level up to
    /// `isa` ([`supports`] must hold): `o[i * stride + r]` is row r dot
    /// activation row i. `amx` holds `a`'s whole groups of sixteen laid
    /// out for AMX, given where the AMX tiles take the product
    /// ([`takes_amx`]); those groups run on the tiles, the rest, and all
    /// rows without it, on AVX-512 or AVX2: the same bits.
    pub(super) fn product(
        &self,
        isa: Isa,
        a: &[Q8Row<'_>],
        amx: Option<&AmxActs>,
        o: &mut [f32],
        stride: usize,
    ) {
        let level = level(isa).expect("the tile runs on AVX2, AVX-512 or AMX");
        let mut a = a;
        let mut o = o;
        // `amx` is given only where the tiles take this product (`takes_amx`)
        if let Some(acts) = amx
            && let Some(mut tiles) = Tiles::start()
        {
            let whole = acts.rows().min(a.len() / TILE * TILE);
            let mut g = 0;
            by_groups(&a[..whole], self.rows, o, stride, |_, sums| {
                tiles.group(self, acts, g, sums);
                g += 1;
            });
            if whole == a.len() {
                return;
            }
            a = &a[whole..];
            o = &mut o[whole * stride..];
        }
        if level >= Isa::Avx512 {
            by_groups(a, self.rows, o, stride, |group, sums| {
                super::tile_avx512::group(self, group, sums)
            });
        } else {
            super::tile_avx2::product(self, a, o, stride, self.rows);
        }
    }
}

/// MXFP4's codes as the tile takes them: the low and the high nibbles of
/// the 32 bytes `chunk` through [`MXFP4_PLUS12`], into `low` and `high`
/// (32 bytes each), one table shuffle per 32 codes. Every tile level runs
/// AVX2 ([`level`]).
fn mxfp4_codes(chunk: &[u8], low: &mut [u8], high: &mut [u8]) {
    assert!(
        chunk.len() == 32 && low.len() == 32 && high.len() == 32,
        "MXFP4 codes go 32 bytes at a time"
    );
    assert!(Isa::Avx2.available(), "the tile needs AVX2");
    // SAFETY: AVX2 runs here, and the three slices hold 32 bytes (asserted
    // above).
    unsafe { mxfp4_codes_avx2(chunk, low, high) }
}

/// [`mxfp4_codes`] on AVX2.
///
/// # Safety
/// AVX2 is available and each slice holds at least 32 bytes.
#[target_feature(enable = "avx2")]
unsafe fn mxfp4_codes_avx2(chunk: &[u8], low: &mut [u8], high: &mut [u8]) {
    use std::arch::x86_64::{
        __m128i, __m256i, _mm_loadu_si128, _mm256_and_si256, _mm256_broadcastsi128_si256,
        _mm256_loadu_si256, _mm256_set1_epi8, _mm256_shuffle_epi8, _mm256_srli_epi16,
        _mm256_storeu_si256,
    };
    // SAFETY: the table is 16 bytes, the slices 32 (the caller's bounds).
    unsafe {
        let table =
            _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_PLUS12.as_ptr().cast::<__m128i>()));
        let nibble = _mm256_set1_epi8(0x0F);
        let v = _mm256_loadu_si256(chunk.as_ptr().cast::<__m256i>());
        let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(v, nibble));
        let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble));
        _mm256_storeu_si256(low.as_mut_ptr().cast::<__m256i>(), lo);
        _mm256_storeu_si256(high.as_mut_ptr().cast::<__m256i>(), hi);
    }
}

/// Q4_K's and Q5_K's scales of group block `i` (eight rows' `d` and
/// `dmin` in f16, then each 32-value sub-block's eight 6-bit scales and
/// minimums, unpacked to bytes) into group `g` of the tile's scales `d` and
/// offsets `e`: lane r of sub-block j takes `d_r · sc` and `-(dmin_r · m)`,
/// eight rows in one register, the same products as one row at a time.
#[target_feature(enable = "avx2,f16c")]
fn q4k_scales_avx2(d: &mut [f32], e: &mut [f32], g: usize, i: usize, gblk: &[u8]) {
    use std::arch::x86_64::{
        __m128i, _mm_loadl_epi64, _mm_loadu_si128, _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32,
        _mm256_cvtph_ps, _mm256_mul_ps, _mm256_set1_ps, _mm256_storeu_ps, _mm256_xor_ps,
    };
    let (scales, minimums) = (&gblk[..16], &gblk[16..32]);
    // SAFETY: both are 16 readable bytes (sliced above); unaligned loads.
    let (dv, mv) = unsafe {
        (
            _mm256_cvtph_ps(_mm_loadu_si128(scales.as_ptr().cast::<__m128i>())),
            _mm256_cvtph_ps(_mm_loadu_si128(minimums.as_ptr().cast::<__m128i>())),
        )
    };
    let sign = _mm256_set1_ps(-0.0);
    let bytes8 = |at: usize| {
        let b = &gblk[at..at + GROUP_ROWS];
        // SAFETY: `b` is 8 readable bytes (sliced above); unaligned load.
        let v = unsafe { _mm_loadl_epi64(b.as_ptr().cast::<__m128i>()) };
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    };
    for j in 0..QK_K / QK {
        let at = (8 * i + j) * TILE + GROUP_ROWS * g;
        let (to_d, to_e) = (&mut d[at..at + GROUP_ROWS], &mut e[at..at + GROUP_ROWS]);
        let (sc, m) = (bytes8(32 + 8 * j), bytes8(96 + 8 * j));
        // SAFETY: both are 8 writable f32 (sliced above); unaligned stores.
        unsafe {
            _mm256_storeu_ps(to_d.as_mut_ptr(), _mm256_mul_ps(dv, sc));
            _mm256_storeu_ps(to_e.as_mut_ptr(), _mm256_xor_ps(_mm256_mul_ps(mv, m), sign));
        }
    }
}

/// The 32 bytes `chunk` (eight rows' four values side by side) into the
/// tile's values `q`: its low nibbles at `low`, its high nibbles at `high`,
/// with `fifth` (the words of the low and of the high values' fifth bits,
/// bit k for byte k) put above the nibbles.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn put_chunk(q: &mut [u8], low: usize, high: usize, chunk: &[u8], fifth: Option<(u32, u32)>) {
    use super::packed_avx2::bits_to_bytes;
    use std::arch::x86_64::{
        __m256i, _mm256_and_si256, _mm256_loadu_si256, _mm256_or_si256, _mm256_set1_epi8,
        _mm256_srli_epi16, _mm256_storeu_si256,
    };
    let nibble = _mm256_set1_epi8(0x0F);
    let chunk = &chunk[..32];
    // SAFETY: `chunk` is 32 readable bytes (sliced above); unaligned load.
    let v = unsafe { _mm256_loadu_si256(chunk.as_ptr().cast::<__m256i>()) };
    let (mut lo, mut hi) = (
        _mm256_and_si256(v, nibble),
        _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble),
    );
    if let Some((low_bits, high_bits)) = fifth {
        lo = _mm256_or_si256(lo, bits_to_bytes(low_bits));
        hi = _mm256_or_si256(hi, bits_to_bytes(high_bits));
    }
    let to = &mut q[low..low + 32];
    // SAFETY: `to` is 32 writable bytes (sliced above); unaligned store.
    unsafe { _mm256_storeu_si256(to.as_mut_ptr().cast::<__m256i>(), lo) };
    let to = &mut q[high..high + 32];
    // SAFETY: as above.
    unsafe { _mm256_storeu_si256(to.as_mut_ptr().cast::<__m256i>(), hi) };
}

/// The values of 32-value group block `i` (`quants`: four chunks of 32
/// bytes, eight rows' four bytes side by side; chunk c's low nibbles are
/// step c, its high nibbles step c + 4) into group `g` of the tile's values
/// `q`, with `fifth` (Q5_0, Q5_1: eight words, word 2c's bit 4r + j the
/// fifth bit of chunk c's low value j of row r, word 2c + 1 of the high
/// one) put above the nibbles.
#[target_feature(enable = "avx2,fma,f16c")]
fn values32_avx2(q: &mut [u8], g: usize, i: usize, quants: &[u8], fifth: Option<&[u8]>) {
    let words: Option<[u32; 8]> = fifth.map(|bits| {
        std::array::from_fn(|n| u32::from_le_bytes([0, 1, 2, 3].map(|b| bits[4 * n + b])))
    });
    for (c, chunk) in quants.chunks_exact(32).enumerate() {
        let low = i * BLOCK_BYTES + c * 64 + 4 * GROUP_ROWS * g;
        let bits = words.map(|w| (w[2 * c], w[2 * c + 1]));
        put_chunk(q, low, low + 4 * 64, chunk, bits);
    }
}

/// Q4_K's values of group block `i` (`quants`: 32 chunks of 32 bytes,
/// eight rows' four bytes side by side) into group `g` of the tile's values
/// `q`: sub-blocks 2p and 2p + 1 are the low and high nibbles of chunks
/// 8p..8p + 8, step k of both in chunk 8p + k.
#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_nibbles_avx2(q: &mut [u8], g: usize, i: usize, quants: &[u8]) {
    for (c, chunk) in quants.chunks_exact(32).enumerate() {
        let (p, k) = (c / 8, c % 8);
        let low = (8 * i + 2 * p) * BLOCK_BYTES + k * 64 + 4 * GROUP_ROWS * g;
        put_chunk(q, low, low + BLOCK_BYTES, chunk, None);
    }
}

/// `v` as `len` zeros, keeping its allocation.
pub(super) fn reset<T: Default + Clone>(v: &mut Vec<T>, len: usize) {
    v.clear();
    v.resize(len, T::default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::acts::Q8Rows;
    use crate::quant::{FORMATS, PackedMatrix};
    use crate::testdata::{Rng, random_blocks};

    /// Every format the tile takes (all but Q8_0, as [`supports`] says),
    /// each of which also fills from the interleaved copy directly.
    fn tile_formats() -> impl Iterator<Item = QuantFormat> {
        FORMATS.into_iter().filter(|&f| f != QuantFormat::Q8_0)
    }

    /// What the tile's product of weight row `r` and activation row `a`
    /// is defined as, one block after another: the block's integer sum
    /// (Q6_K: each half's, centred and scaled), then in f32 `acc +=
    /// sum · (d_w · d_a)` and, with an offset, `acc += e_w · s_a`, each a
    /// fused multiply-add.
    fn defining_sum(t: &Tile, a: &Q8Row<'_>, r: usize) -> f32 {
        let mut acc = 0f32;
        for b in 0..t.blocks() {
            let sum = |steps: Range<usize>| -> i32 {
                steps
                    .flat_map(|k| (0..4).map(move |j| (k, j)))
                    .map(|(k, j)| {
                        let w = t.q.as_slice()[b * BLOCK_BYTES + k * 64 + 4 * r + j];
                        i32::from(w) * i32::from(a.q[QK * b + 4 * k + j])
                    })
                    .sum()
            };
            let isum = match t.scaling {
                Scaling::Offset => sum(0..8),
                Scaling::Centered => (0..2)
                    .map(|h| {
                        let centered = sum(4 * h..4 * h + 4) - 32 * i32::from(a.sum16[2 * b + h]);
                        t.sc[(2 * b + h) * TILE + r] * centered
                    })
                    .sum(),
            };
            acc = (isum as f32).mul_add(t.d[b * TILE + r] * a.d[b], acc);
            if t.scaling == Scaling::Offset {
                acc = t.e[b * TILE + r].mul_add(a.s[b], acc);
            }
        }
        acc
    }

    /// The tile's product on each level this CPU runs is its defining sum
    /// bit for bit, for every format, on rows of several chunks of blocks
    /// and a part chunk, every count of activation rows in a last group,
    /// whole and part tiles: however a level orders its loads and passes,
    /// each lane sums its blocks in order (and so every level gives the
    /// same bits, on a machine that has only one of them too).
    #[test]
    fn the_tile_product_is_its_defining_sum_bit_for_bit() {
        // AVX2 and AVX-512 where this CPU runs them (a level this CPU lacks
        // falls to a lower one, or to none)
        let levels: Vec<Isa> = [Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|&isa| level(isa) == Some(isa))
            .collect();
        let mut rng = Rng::new(41);
        for format in tile_formats() {
            let (rows, cols) = (21, 2048 + 256);
            let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
            let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
            for n in [1, 2, 3, 4, 6, 9] {
                let x = rng.normals(n * cols, 1.0);
                let mut acts = Q8Rows::new();
                acts.quantize(&x, n, cols).expect("whole blocks");
                let a: Vec<Q8Row<'_>> = (0..n).map(|i| acts.row(i)).collect();
                for first in (0..rows).step_by(TILE) {
                    let range = first..rows.min(first + TILE);
                    let mut t = Tile::default();
                    t.fill(format, &m.rows_data(range.clone()), m.row_bytes);
                    for &level in &levels {
                        let mut got = vec![f32::NAN; n * range.len()];
                        t.product(level, &a, None, &mut got, range.len());
                        for (i, row) in a.iter().enumerate() {
                            for r in 0..range.len() {
                                let want = defining_sum(&t, row, r);
                                assert_eq!(
                                    got[i * range.len() + r].to_bits(),
                                    want.to_bits(),
                                    "{format:?} {} rows {range:?} act {i} of {n} row {r}",
                                    level.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// A tile filled straight from the interleaved copy holds the same
    /// bytes, scales and offsets as one filled from the file's rows, for
    /// every format that has the direct fill, on whole and part-filled
    /// groups: so the products read the same tile either way.
    #[test]
    fn filling_from_the_interleaved_copy_is_filling_from_the_rows() {
        let mut rng = Rng::new(31);
        for format in tile_formats() {
            let (rows, cols) = (37, 2 * QK_K);
            let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
            let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
            let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
            let p = packed.view();
            // one tile for every fill, left full of other values after each:
            // a whole tile's fill, which does not zero it first, must write
            // every lane itself
            let mut direct = Tile::default();
            for first in (0..rows).step_by(TILE) {
                let range = first..rows.min(first + TILE);
                let mut from_rows = Tile::default();
                assert!(direct.fill_interleaved(&p, range.clone()), "{format:?}");
                from_rows.fill(format, &m.rows_data(range.clone()), m.row_bytes);
                assert_eq!(
                    (direct.scaling, direct.i16_steps, direct.blocks()),
                    (from_rows.scaling, from_rows.i16_steps, from_rows.blocks())
                );
                // lanes past the rows hold zeros in one and padding rows'
                // zero codes in the other: compare the rows' own lanes
                for b in 0..from_rows.blocks() {
                    for r in 0..range.len() {
                        let at = b * TILE + r;
                        assert_eq!(direct.d[at].to_bits(), from_rows.d[at].to_bits());
                        if from_rows.scaling == Scaling::Offset {
                            assert_eq!(direct.e[at].to_bits(), from_rows.e[at].to_bits());
                        } else {
                            for half in [2 * b, 2 * b + 1] {
                                let at = half * TILE + r;
                                assert_eq!(direct.sc[at], from_rows.sc[at], "{format:?}");
                            }
                        }
                        for k in 0..8 {
                            let q = b * BLOCK_BYTES + k * 64 + 4 * r;
                            assert_eq!(
                                direct.q.as_slice()[q..q + 4],
                                from_rows.q.as_slice()[q..q + 4],
                                "{format:?} rows {range:?} block {b} step {k} row {r}"
                            );
                        }
                    }
                }
                direct.q.as_mut_slice().fill(0xA5);
                direct.d.fill(f32::NAN);
                direct.e.fill(f32::NAN);
                direct.sc.fill(-7);
            }
        }
    }
}
