//! A quantized matrix of a memory-mapped GGUF file, multiplied by the
//! kernels of `lcut-kernels`: in place in the mapping, or, once
//! [`MappedMatrix::pack`] has run (at load, on CPUs with AVX2), in a copy
//! with its rows interleaved eight at a time ([`PackedMatrix`]), the
//! layout the kernels read fastest. Packing releases the mapping's pages
//! of the matrix, so the process holds its bytes once either way.
//!
//! llama.cpp stores the rows of llama-family Q and K projections permuted
//! for its interleaved RoPE; a matrix read in place keeps the file's row
//! order and puts each product's outputs back in Hugging Face order (and a
//! dequantized copy's rows); a packed copy is made in Hugging Face order.

use std::sync::{Arc, OnceLock};

use candle_core::{Device, Tensor};
use lcut_kernels::Isa;
use lcut_kernels::quant::{self, PackedMatrix, Q8Rows, Q16Rows, QuantFormat, QuantMatrix};
use memmap2::Mmap;

use crate::error::Result;

/// How a mapped matrix multiplies `n` activation rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProductPath {
    /// Up to [`quant::MAX_BATCH`] rows: the kernels' batched product, one
    /// pass over the weights (decoding).
    Batched,
    /// More rows: the kernels' chunk product ([`quant::matmul`]:
    /// activations quantized once, weight tiles kept in cache while the
    /// rows pass over them, one parallel region; Q8_0 on AVX2 or AVX-512
    /// takes 16-bit activations, [`quant::matmul_wide`], as its weights are
    /// precise enough that 8-bit ones would be the larger error).
    Chunk,
    /// From `dequantize_rows` rows on, where the chunk product does not
    /// beat it ([`chunk_beats_gemm`]): the matrix dequantized (rows split
    /// across threads) and candle's f32 GEMM.
    Dequantized,
}

/// Q8_0 matrices narrower than this many columns dequantize for long
/// chunks rather than take the 16-bit tile: a 512-token prefill, 2 threads
/// on an AVX2-only EPYC, was 1.05x faster through the tile on the 1B shape
/// (2048 and 8192 columns; median of 7 interleaved rounds, 0.95 to 1.15)
/// but took 1.3x longer on SmolLM2 (576 and 1536 columns), whose small
/// products scale worse across threads on the tile.
pub const WIDE_TILE_MIN_COLS: usize = 2048;

/// Rows a mapped matrix is packed in at a time before their pages of the
/// mapping are released ([`MappedMatrix::pack`]): 8 MiB of a 2048-wide
/// Q8_0 matrix, small beside a model and large enough for rayon's threads.
pub const PACK_SLAB_ROWS: usize = 4096;

/// Whether the chunk product of a `format` matrix of `cols` columns beats
/// dequantizing it for candle's f32 GEMM on long chunks at `isa`. Measured
/// on SmolLM2's Q4_1 matrices (2 threads, AVX-512 VNNI, perf samples of one
/// 512-token prefill): the 8-bit tile took 0.45x the CPU time of the f32
/// GEMM over the dequantized matrices; without it (the batched dot
/// products, 8 rows at a time) 1.7x, so CPUs without it (no AVX2)
/// dequantize; Q8_0's 16-bit tile wins from [`WIDE_TILE_MIN_COLS`] on.
pub fn chunk_beats_gemm(isa: Isa, format: QuantFormat, cols: usize) -> bool {
    if quant::takes_wide_activations(isa, format) {
        cols >= WIDE_TILE_MIN_COLS
    } else {
        quant::has_tiled_path(isa, format)
    }
}

impl ProductPath {
    /// The path for `n` rows of a `format` matrix of `cols` columns.
    pub fn for_rows(n: usize, format: QuantFormat, cols: usize, dequantize_rows: usize) -> Self {
        if n <= quant::MAX_BATCH {
            Self::Batched
        } else if n < dequantize_rows || chunk_beats_gemm(Isa::detect(), format, cols) {
            Self::Chunk
        } else {
            Self::Dequantized
        }
    }
}

/// A [rows, cols] matrix of ggml blocks inside a mapped file.
#[derive(Clone)]
pub struct MappedMatrix {
    map: Arc<Mmap>,
    start: usize,
    format: QuantFormat,
    rows: usize,
    cols: usize,
    /// Heads whose rows llama.cpp permuted (Q or K of a llama-family file).
    permuted_heads: Option<usize>,
    /// For a permuted matrix, the file row of each Hugging Face row.
    file_rows: Option<Arc<[u32]>>,
    /// The interleaved copy in Hugging Face row order, once made; clones
    /// share it.
    packed: Arc<OnceLock<PackedMatrix>>,
    /// Pack on the first product rather than at load (an expert: most are
    /// read by few tokens, some by none, so a model holds in memory only
    /// the experts its tokens have used).
    pack_on_use: bool,
}

/// Whether matrices are packed at load: on CPUs whose kernels read the
/// interleaved layout faster (AVX2 and up), unless `LCUT_REPACK=0` keeps
/// every matrix in its mapping (to compare the two).
pub fn packs_at_load() -> bool {
    let off = std::env::var("LCUT_REPACK").is_ok_and(|v| matches!(v.trim(), "0" | "off" | "no"));
    !off && Isa::detect() >= Isa::Avx2
}

impl std::fmt::Debug for MappedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedMatrix")
            .field("format", &self.format)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("start", &self.start)
            .field("permuted_heads", &self.permuted_heads)
            .field("packed", &self.is_packed())
            .finish()
    }
}

impl MappedMatrix {
    /// The matrix at `map[start..]`: `rows` rows of `cols` values of
    /// `format`, checked to lie inside the map.
    pub(crate) fn new(
        map: Arc<Mmap>,
        start: usize,
        format: QuantFormat,
        (rows, cols): (usize, usize),
        permuted_heads: Option<usize>,
    ) -> Result<Self> {
        let bytes = format.row_bytes(cols)? * rows;
        if start + bytes > map.len() {
            return Err(lcut_kernels::KernelError::Length {
                what: "mapped matrix bytes",
                expected: start + bytes,
                got: map.len(),
            }
            .into());
        }
        if let Some(h) = permuted_heads
            && (h == 0 || rows % h != 0 || (rows / h) % 2 != 0)
        {
            return Err(lcut_kernels::KernelError::Heads(format!(
                "{rows} permuted rows over {h} heads"
            ))
            .into());
        }
        let mut m = Self {
            map,
            start,
            format,
            rows,
            cols,
            permuted_heads,
            file_rows: None,
            packed: Arc::new(OnceLock::new()),
            pack_on_use: false,
        };
        if permuted_heads.is_some() {
            m.file_rows = Some((0..rows).map(|r| m.file_row(r) as u32).collect());
        }
        Ok(m)
    }

    /// Make the interleaved copy (rows split across rayon's threads) and
    /// release the mapping's pages of the matrix; a no-op once packed. A
    /// matrix in the file's row order is packed in slabs of
    /// [`PACK_SLAB_ROWS`] rows and each slab's pages released as it is
    /// done, so that the mapped and the packed matrix are not both resident
    /// (Gemma 3's tied 262k-row head: 170 MiB twice at its peak before).
    pub fn pack(&self) -> Result<()> {
        if self.is_packed() {
            return Ok(());
        }
        let view = self.mapped_view();
        let row_bytes = view.bytes() / self.rows.max(1);
        let packed = match self.file_rows {
            // rows reordered within heads: released once, at the end
            Some(_) => {
                let packed = PackedMatrix::pack(&view, |r| self.file_row(r))?;
                crate::gguf::release_mapped(&self.map, self.start, view.bytes());
                packed
            }
            None => PackedMatrix::pack_in_slabs(
                &view,
                |r| r,
                PACK_SLAB_ROWS,
                |done| {
                    crate::gguf::release_mapped(
                        &self.map,
                        self.start + done.start * row_bytes,
                        done.len() * row_bytes,
                    );
                },
            )?,
        };
        let _ = self.packed.set(packed);
        Ok(())
    }

    /// Whether the interleaved copy is made.
    pub fn is_packed(&self) -> bool {
        self.packed.get().is_some()
    }

    /// This matrix packed on its first product ([`Self::view`]) instead of
    /// now: until a token reads it, it takes no memory beyond the file's
    /// pages the system keeps.
    pub(crate) fn packed_on_first_use(mut self) -> Self {
        self.pack_on_use = true;
        self
    }

    /// The blocks as a kernel matrix: the interleaved copy (Hugging Face
    /// row order) once made, else the mapping (the file's row order). A
    /// matrix packed on first use is packed here the first time (left in
    /// the mapping if that fails).
    pub fn view(&self) -> QuantMatrix<'_> {
        let _ = self.pack_if_deferred();
        match self.packed.get() {
            Some(p) => p.view(),
            None => self.mapped_view(),
        }
    }

    /// The blocks in the mapping, in the file's row order.
    fn mapped_view(&self) -> QuantMatrix<'_> {
        let len = self.rows * self.format.row_bytes(self.cols).unwrap_or(0);
        // checked in `new`: the bytes lie inside the map and fill the rows
        QuantMatrix::new(
            self.format,
            &self.map[self.start..self.start + len],
            self.rows,
            self.cols,
        )
        .expect("checked when the matrix was made")
    }

    /// The block format.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// (rows, cols).
    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Bytes a product reads: the interleaved copy's where the matrix is
    /// packed or will be on its first product, else the mapping's. Asking
    /// does not pack it (a model's byte count leaves unread experts alone).
    pub fn bytes(&self) -> usize {
        if self.pack_on_use && !self.is_packed() {
            return quant::packed::packed_len(self.format, self.rows, self.cols)
                .unwrap_or_else(|_| self.mapped_view().bytes());
        }
        self.view().bytes()
    }

    /// Pack now a matrix left to be packed on its first product; whether
    /// this call packed it.
    pub fn pack_if_deferred(&self) -> Result<bool> {
        if !self.pack_on_use || self.is_packed() {
            return Ok(false);
        }
        self.pack()?;
        Ok(true)
    }

    /// The row of [`MappedMatrix::view`] that holds Hugging Face row `r`
    /// (the file's row while read in place).
    pub fn file_row(&self, r: usize) -> usize {
        match self.permuted_heads {
            _ if self.is_packed() => r,
            None => r,
            Some(heads) => {
                // llama.cpp stored Hugging Face row half * hd/2 + i of a head at 2 i + half
                let hd = self.rows / heads;
                let half = hd / 2;
                let (h, within) = (r / hd, r % hd);
                let (part, i) = (within / half, within % half);
                h * hd + 2 * i + part
            }
        }
    }

    /// Whether outputs need putting back in Hugging Face order.
    pub fn is_permuted(&self) -> bool {
        self.permuted_heads.is_some() && !self.is_packed()
    }

    /// Put one activation row's outputs `file` (file row order) into `out`
    /// in Hugging Face order.
    pub fn unpermute_into(&self, file: &[f32], out: &mut [f32]) {
        match &self.file_rows {
            Some(rows) if !self.is_packed() => {
                for (o, &r) in out.iter_mut().zip(rows.iter()) {
                    *o = file[r as usize];
                }
            }
            _ => out.copy_from_slice(&file[..out.len()]),
        }
    }

    /// The whole matrix in f32, rows in Hugging Face order (rows split
    /// across rayon's threads).
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        use rayon::prelude::*;
        let v = self.view();
        let mut out = vec![0f32; self.rows * self.cols];
        out.par_chunks_mut(self.cols * 64)
            .enumerate()
            .try_for_each(|(part, rows)| {
                for (i, row) in rows.chunks_exact_mut(self.cols).enumerate() {
                    v.dequantize_row(self.file_row(part * 64 + i), row)?;
                }
                Ok::<_, lcut_kernels::KernelError>(())
            })?;
        Ok(out)
    }

    /// `x W^T` for `x` [n, cols] in f32 on the CPU, by the rule of
    /// [`ProductPath::for_rows`].
    pub fn forward(&self, x: &Tensor, dequantize_rows: usize) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let n: usize = dims[..dims.len().saturating_sub(1)].iter().product();
        let mut out_dims = dims.clone();
        if let Some(last) = out_dims.last_mut() {
            *last = self.rows;
        }
        if ProductPath::for_rows(n, self.format, self.cols, dequantize_rows)
            == ProductPath::Dequantized
        {
            let w = Tensor::from_vec(self.dequantize()?, (self.rows, self.cols), &Device::Cpu)?;
            return Ok(x.broadcast_matmul(&w.t()?)?);
        }
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let (mut y, mut scratch) = (vec![0f32; n * self.rows], Vec::new());
        let mut input = ProductInput::new(&xs, n, self.cols);
        self.product(&mut input, dequantize_rows, &mut y, &mut scratch)?;
        Ok(Tensor::from_vec(y, out_dims, &Device::Cpu)?)
    }

    /// `x W^T` of `input`'s rows into `y` [n, rows] (Hugging Face row
    /// order), by the rule of [`ProductPath::for_rows`]; the activations
    /// are quantized once per kind for every matrix that reads `input`.
    pub(crate) fn product(
        &self,
        input: &mut ProductInput<'_>,
        dequantize_rows: usize,
        y: &mut [f32],
        scratch: &mut Vec<f32>,
    ) -> Result<()> {
        let n = input.n;
        let path = ProductPath::for_rows(n, self.format, self.cols, dequantize_rows);
        if path == ProductPath::Dequantized {
            let w = Tensor::from_vec(self.dequantize()?, (self.rows, self.cols), &Device::Cpu)?;
            let x = Tensor::from_slice(input.xs, (n, self.cols), &Device::Cpu)?;
            let out = x.matmul(&w.t()?)?.flatten_all()?.to_vec1::<f32>()?;
            y.copy_from_slice(&out);
            return Ok(());
        }
        let isa = Isa::detect();
        if path == ProductPath::Chunk && quant::takes_wide_activations(isa, self.format) {
            quant::matmul_wide(isa, &self.view(), input.wide()?, y, scratch)?;
        } else if path == ProductPath::Batched {
            quant::matvec(isa, &self.view(), input.narrow()?, y, scratch)?;
        } else {
            quant::matmul(isa, &self.view(), input.narrow()?, y, scratch)?;
        }
        if self.is_permuted() {
            let mut row = vec![0f32; self.rows];
            for out in y.chunks_exact_mut(self.rows) {
                self.unpermute_into(out, &mut row);
                out.copy_from_slice(&row);
            }
        }
        Ok(())
    }

    /// Rows `ids` dequantized, [ids.len(), cols] (an embedding lookup).
    pub fn rows_of(&self, ids: &[u32]) -> Result<Tensor> {
        let v = self.view();
        let mut out = vec![0f32; ids.len() * self.cols];
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            v.dequantize_row(self.file_row(id as usize), row)?;
        }
        Ok(Tensor::from_vec(out, (ids.len(), self.cols), &Device::Cpu)?)
    }
}

/// Activation rows [n, cols] in f32 and their quantized forms, each made
/// on the first product that reads it, so that matrices reading the same
/// rows (an MLP's gate and up) quantize them once.
pub(crate) struct ProductInput<'a> {
    xs: &'a [f32],
    n: usize,
    cols: usize,
    narrow: Option<Q8Rows>,
    wide: Option<Q16Rows>,
}

impl<'a> ProductInput<'a> {
    /// The rows `xs` [n, cols].
    pub(crate) fn new(xs: &'a [f32], n: usize, cols: usize) -> Self {
        Self {
            xs,
            n,
            cols,
            narrow: None,
            wide: None,
        }
    }

    /// The rows quantized to 8 bits.
    fn narrow(&mut self) -> Result<&Q8Rows> {
        if self.narrow.is_none() {
            let mut acts = Q8Rows::new();
            acts.quantize(self.xs, self.n, self.cols)?;
            self.narrow = Some(acts);
        }
        Ok(self.narrow.get_or_insert_with(Q8Rows::new))
    }

    /// The rows quantized to 16 bits.
    fn wide(&mut self) -> Result<&Q16Rows> {
        if self.wide.is_none() {
            let mut acts = Q16Rows::new();
            acts.quantize(self.xs, self.n, self.cols)?;
            self.wide = Some(acts);
        }
        Ok(self.wide.get_or_insert_with(Q16Rows::new))
    }
}
