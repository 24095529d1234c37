//! The tile's products on AMX-INT8, for the formats whose block sums are
//! scaled as `d · sum + e · s` (Q4_0, Q4_1, Q5_0, Q5_1 and Q4_K's
//! sub-blocks): one `tdpbsud` multiplies a block of sixteen activation rows
//! (signed bytes, an A tile of 16 rows x 32 bytes) by the tile's block of
//! sixteen weight rows (unsigned bytes, whose eight steps of four values
//! per row are already the B tile's layout: 8 rows x 64 bytes) into
//! sixteen rows of sixteen i32 sums, one activation row by every weight
//! row: the same integers `vpdpbusd` adds. The sums go through memory to
//! the AVX-512 registers, where each activation row's are scaled as
//! [`super::tile_avx512`] scales them, lane by lane in the same order: the
//! outputs are the same bits on every level.
//!
//! What bounds it: a block's scales allow no more than 32 values a
//! `tdpbsud` (half the 64 a tile row holds), and each block's sums are
//! stored and scaled, so the tile unit spends about as long storing 16 x
//! 16 sums as multiplying them; and the tile instructions take time from
//! the scaling's vector work rather than run beside it (each added alone
//! to the scaling loop slowed it; docs/performance-decode.md, "AMX
//! tiles"), so issuing products further ahead does not help. On one
//! Sapphire Rapids core the product
//! runs about 1.2x the AVX-512 tile; Q6_K, whose halves of 16 values each
//! need their own product and store, ran slower than its AVX-512 tile and
//! stays there.
//!
//! The activations are laid out once per product for the A tiles
//! ([`AmxActs`]: a block of sixteen rows in 512 consecutive bytes on whole
//! cache lines, and their scales side by side; read in place, at the rows'
//! stride, the tile loads stalled the product: 132-140 against 180-200
//! GMAC/s), and the tile's values start on a cache line too, so that no
//! tile row is split across two lines. The tile registers are set up once per
//! tile's product ([`Tiles::start`]) and released when it ends, so that a
//! thread not multiplying holds no tile state for the kernel to save.

#![allow(unsafe_code)]

use std::arch::asm;
use std::arch::x86_64::{
    __m512i, _mm512_cvtepi32_ps, _mm512_fmadd_ps, _mm512_load_si512, _mm512_loadu_ps,
    _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
};

use crate::isa::Isa;
use crate::quant::acts::Q8Row;
use crate::quant::aligned::AlignedBytes;
use crate::quant::format::QK;
use crate::quant::tile::{BLOCK_BYTES, Scaling, TILE, Tile};

/// Activation rows one `tdpbsud` takes (an A tile's rows).
pub(super) const ROWS: usize = TILE;

/// The tile registers' shapes (palette 1), as `ldtilecfg` reads them: two
/// sets of three, tmm0-tmm2 and tmm3-tmm5, each the sums (16 rows of 16
/// i32), a block of sixteen activation rows (16 rows x 32 bytes) and the
/// weights' block (8 steps of 64 bytes). Two sets let a block's product
/// start before the previous block's has been stored.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    unused: [u8; 16],
}

impl Config {
    /// Both sets.
    fn new() -> Self {
        let mut c = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
            unused: [0; 16],
        };
        let set = [(64, 16), (QK as u16, 16), (64, 8)];
        for (t, (colsb, rows)) in set.into_iter().chain(set).enumerate() {
            c.colsb[t] = colsb;
            c.rows[t] = rows;
        }
        c
    }
}

/// Sixteen rows of sixteen i32, aligned for a tile store and vector loads.
#[repr(C, align(64))]
struct Sums([[i32; TILE]; ROWS]);

/// Blocks' sums in flight, one after another: one block's being scaled
/// while the next three are multiplied and stored. Four slots are 4 KiB,
/// so that no slot being read shares its address's low twelve bits with
/// one being stored (the processor would take the load as waiting on the
/// store, and each block's scaling on the next block's product).
const SLOTS: usize = 4;

/// The activation rows' whole groups of sixteen laid out for the A tiles
/// and the scaling: for each group and each block of 32 values, the
/// sixteen rows' 32 bytes one after another (512 bytes), and their scales
/// and scaled sums side by side.
#[derive(Debug, Default)]
pub(super) struct AmxActs {
    /// The values (signed bytes), [group][block][row][32], each block of
    /// sixteen rows on its own eight cache lines.
    q: AlignedBytes,
    /// Each row's scale, [group][block][row].
    d: Vec<f32>,
    /// Each row's scale times its block's sum, [group][block][row].
    s: Vec<f32>,
    /// Blocks of 32 values per row.
    blocks: usize,
}

/// One group of [`AmxActs`].
#[derive(Clone, Copy)]
struct GroupActs<'a> {
    q: &'a [u8],
    d: &'a [f32],
    s: &'a [f32],
}

impl AmxActs {
    /// The whole groups of sixteen of the rows `a` (each at least `blocks`
    /// blocks).
    pub(super) fn new(a: &[Q8Row<'_>], blocks: usize) -> Self {
        let groups = a.len() / ROWS;
        let mut acts = AmxActs {
            q: AlignedBytes::zeroed(groups * blocks * ROWS * QK),
            d: Vec::with_capacity(groups * blocks * ROWS),
            s: Vec::with_capacity(groups * blocks * ROWS),
            blocks,
        };
        let mut values = acts.q.as_mut_slice().chunks_exact_mut(QK);
        for rows in a.chunks_exact(ROWS) {
            for b in 0..blocks {
                for (row, to) in rows.iter().zip(values.by_ref()) {
                    for (to, &v) in to.iter_mut().zip(&row.q[b * QK..(b + 1) * QK]) {
                        *to = v as u8;
                    }
                    acts.d.push(row.d[b]);
                    acts.s.push(row.s[b]);
                }
            }
        }
        acts
    }

    /// Activation rows held (whole groups).
    pub(super) fn rows(&self) -> usize {
        self.d.len() / self.blocks.max(1)
    }

    /// Group `g`.
    fn group(&self, g: usize) -> GroupActs<'_> {
        let n = self.blocks * ROWS;
        GroupActs {
            q: &self.q.as_slice()[g * n * QK..(g + 1) * n * QK],
            d: &self.d[g * n..(g + 1) * n],
            s: &self.s[g * n..(g + 1) * n],
        }
    }
}

/// The tile registers set up on this thread for one tile's product:
/// released when dropped.
pub(super) struct Tiles {
    /// Where the tiles' sums are stored for the vector registers.
    sums: Box<[Sums; SLOTS]>,
}

impl Tiles {
    /// Set the tile registers up, where the CPU and process run AMX
    /// (`None` otherwise).
    pub(super) fn start() -> Option<Tiles> {
        if !Isa::Amx.available() {
            return None;
        }
        let config = Config::new();
        // SAFETY: AMX-INT8 is available and this process was granted its
        // state (`Isa::Amx.available`); `config` is 64 readable bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &raw const config, options(nostack)) };
        let sums = Box::new(std::array::from_fn(|_| Sums([[0; TILE]; ROWS])));
        Some(Tiles { sums })
    }

    /// The tile `t` (scaled `Offset`) against group `g` of
    /// `acts` (activation rows 16 g .. 16 g + 16) into `out[i]`, one lane
    /// per weight row.
    pub(super) fn group(
        &mut self,
        t: &Tile,
        acts: &AmxActs,
        g: usize,
        out: &mut [[f32; TILE]; ROWS],
    ) {
        assert_eq!(
            t.scaling,
            Scaling::Offset,
            "the AMX tiles scale `Offset` sums"
        );
        let blocks = t.blocks();
        assert!(
            acts.blocks == blocks && (g + 1) * ROWS <= acts.rows(),
            "group {g} of activations laid out for {blocks} blocks"
        );
        // SAFETY: the tiles are configured on this thread (`start`, which
        // checked AMX and AVX-512); the group holds `blocks` blocks.
        unsafe { run(t, acts.group(g), &mut self.sums, out) }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `start` on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// One tile product on the tile set `$c, $a, $b` (sums, activations,
/// weights): the 16 activation rows of 32 bytes at `$acts` times the 8
/// weights' steps of 64 bytes at `$w`, stored as sixteen rows of sixteen
/// i32 at `$out`.
macro_rules! tile_product {
    ($c:literal, $a:literal, $b:literal, $acts:expr, $w:expr, $out:expr) => {
        asm!(
            concat!("tilezero ", $c),
            concat!("tileloadd ", $a, ", [{a} + {sa} * 1]"),
            concat!("tileloadd ", $b, ", [{w} + {sw} * 1]"),
            concat!("tdpbsud ", $c, ", ", $a, ", ", $b),
            concat!("tilestored [{c} + {sw} * 1], ", $c),
            a = in(reg) $acts,
            sa = in(reg) QK,
            w = in(reg) $w,
            sw = in(reg) 64usize,
            c = in(reg) $out,
            options(nostack),
        )
    };
}

/// Row `i` of the sums as a vector.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
fn sums_row(s: &Sums, i: usize) -> __m512i {
    // SAFETY: row `i` is 64 bytes, 64-byte aligned.
    unsafe { _mm512_load_si512(s.0[i].as_ptr().cast::<__m512i>()) }
}

/// The tile `t` against one group of sixteen activation rows `a`.
///
/// # Safety
/// The tiles are configured on this thread ([`Tiles::start`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn run(t: &Tile, a: GroupActs<'_>, sums: &mut [Sums; SLOTS], out: &mut [[f32; TILE]; ROWS]) {
    let blocks = t.blocks();
    assert!(t.q.len() >= blocks * BLOCK_BYTES && t.d.len() >= blocks * TILE);
    assert!(t.e.len() >= blocks * TILE);
    assert!(a.q.len() >= blocks * ROWS * QK && a.d.len() >= blocks * ROWS);
    assert!(a.s.len() >= blocks * ROWS);
    let mut acc = [_mm512_setzero_ps(); ROWS];
    // block b's sums: on tile set b mod 2, into slot b mod SLOTS
    let start = |b: usize, slot: &mut Sums| {
        // SAFETY: block `b` of the tile's values and of the group's
        // activations are in bounds (checked above: b < blocks); the tiles
        // are configured (the caller); the store writes the 1 KiB slot.
        unsafe {
            let w = t.q.as_slice().as_ptr().add(b * BLOCK_BYTES);
            let x = a.q.as_ptr().add(b * ROWS * QK).cast::<i8>();
            let o = slot.0.as_mut_ptr();
            if b.is_multiple_of(2) {
                tile_product!("tmm0", "tmm1", "tmm2", x, w, o);
            } else {
                tile_product!("tmm3", "tmm4", "tmm5", x, w, o);
            }
        }
    };
    let ahead = SLOTS - 1;
    for b in 0..blocks.min(ahead) {
        start(b, &mut sums[b % SLOTS]);
    }
    for b in 0..blocks {
        // a later block's product runs while this block's sums are scaled
        if b + ahead < blocks {
            start(b + ahead, &mut sums[(b + ahead) % SLOTS]);
        }
        let held = &sums[b % SLOTS];
        // SAFETY: the block's 16 scales and offsets are in bounds, and so
        // are the activation rows' scales and scaled sums (checked above).
        let (d, e, ad, s) = unsafe {
            (
                _mm512_loadu_ps(t.d.as_ptr().add(b * TILE)),
                _mm512_loadu_ps(t.e.as_ptr().add(b * TILE)),
                a.d.as_ptr().add(b * ROWS),
                a.s.as_ptr().add(b * ROWS),
            )
        };
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: i < 16, the block's rows (checked above).
            let (ad, s) = unsafe { (*ad.add(i), *s.add(i)) };
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(ad));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums_row(held, i)), scale, *acc);
            *acc = _mm512_fmadd_ps(e, _mm512_set1_ps(s), *acc);
        }
    }
    for (acc, out) in acc.into_iter().zip(out.iter_mut()) {
        // SAFETY: `out` is 16 writable f32; unaligned store.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }
}
