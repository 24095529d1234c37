//! The quantized products: the portable path against the dequantized
//! weights and activations (computed in f64), and every SIMD path the CPU
//! has against the portable one, exactly where every float step is exact
//! and within rounding otherwise. A level this machine does not run is
//! counted and named on standard error (`IsaChecks`).

use lcut_kernels::isa::{ALL, Isa};
use lcut_kernels::quant::{
    FORMATS, MAX_BATCH, PackedMatrix, Q8Rows, QuantFormat, QuantMatrix, dequantize, matmul, matvec,
    matvec_rows,
};
use lcut_kernels::testdata::{IsaChecks, Rng, random_blocks};

/// Widths that exercise odd block counts, 16-block groups and their tails.
fn widths(format: QuantFormat) -> Vec<usize> {
    match format.block_len() {
        32 => vec![32, 64, 544, 576, 1056],
        _ => vec![256, 768, 1536],
    }
}

/// Activations with an all-zero block and a block with one outlier.
fn activations(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    let mut x = rng.normals(rows * cols, 1.0);
    if cols >= 64 {
        x[..32].fill(0.0);
        x[40] = 50.0;
    }
    x
}

/// Row r of W dot activation row i in f64 over dequantized values, and the
/// sum of the magnitudes of the terms (the scale of rounding errors).
fn reference(w: &[f32], a: &[f32], cols: usize, r: usize, i: usize) -> (f64, f64) {
    let (wr, ar) = (&w[r * cols..(r + 1) * cols], &a[i * cols..(i + 1) * cols]);
    wr.iter().zip(ar).fold((0.0, 0.0), |(s, m), (&x, &y)| {
        let t = f64::from(x) * f64::from(y);
        (s + t, m + t.abs())
    })
}

/// The activations as the kernels see them: quantized, then scaled back.
fn dequantized_acts(q: &Q8Rows) -> Vec<f32> {
    let mut out = Vec::new();
    for i in 0..q.rows() {
        let row = q.row(i);
        for (j, &v) in row.q.iter().enumerate() {
            out.push(f32::from(v) * row.d[j / 32]);
        }
    }
    out
}

#[test]
fn portable_products_equal_the_dequantized_ones() {
    let mut rng = Rng::new(1);
    for format in FORMATS {
        for cols in widths(format) {
            let rows = 37;
            let blocks = rows * cols / format.block_len();
            let data = random_blocks(format, blocks, &mut rng);
            let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
            let mut w = vec![0f32; rows * cols];
            dequantize(format, &data, &mut w).expect("sizes");
            let n = 3;
            let x = activations(&mut rng, n, cols);
            let mut q = Q8Rows::new();
            q.quantize(&x, n, cols).expect("whole blocks");
            let a = dequantized_acts(&q);
            let mut out = vec![0f32; rows * n];
            matvec_rows(Isa::Portable, &m, &q, 0..rows, &mut out).expect("shapes");
            for r in 0..rows {
                for i in 0..n {
                    let (want, mag) = reference(&w, &a, cols, r, i);
                    let got = f64::from(out[r * n + i]);
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-6,
                        "{} cols {cols} row {r} act {i}: {got} vs {want} (magnitude {mag})",
                        format.name()
                    );
                    // and against the unquantized activations: what 8-bit
                    // activations cost (at most half a step per value)
                    let (exact, _) = reference(&w, &x, cols, r, i);
                    let step: f64 = (0..cols)
                        .map(|j| f64::from(w[r * cols + j].abs()) * f64::from(q.row(i).d[j / 32]))
                        .sum();
                    assert!((got - exact).abs() <= 0.5 * step + 1e-4 * mag + 1e-6);
                }
            }
        }
    }
}

/// Blocks whose scales are one power of two per matrix (and small K-quant
/// sub-block scales) and activations whose blocks reach +-127 exactly: the
/// activation scales are 1, every product and partial sum is an integer
/// times one power of two below 2^24, so every path must give the same bits.
fn exact_case(format: QuantFormat, rows: usize, cols: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let mut data = random_blocks(format, rows * cols / format.block_len(), rng);
    let d = (2f32).powi(-((rng.next_u64() % 4) as i32));
    let put = |blk: &mut [u8], at: usize, v: f32| {
        blk[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
    };
    for blk in data.chunks_exact_mut(format.block_bytes()) {
        match format {
            QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => put(blk, 0, d),
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                put(blk, 0, d);
                put(blk, 2, -d);
            }
            QuantFormat::Q4K | QuantFormat::Q5K => {
                put(blk, 0, d);
                put(blk, 2, d);
                // 6-bit scales and mins of at most 15
                blk[4..16].iter_mut().for_each(|b| *b &= 0x0F);
            }
            // 2^(e - 128) = d
            QuantFormat::Mxfp4 => blk[0] = (128 + d.log2() as i32) as u8,
            QuantFormat::Q6K => {
                put(blk, 208, d);
                // 8-bit scales in -4..=4
                for b in &mut blk[192..208] {
                    *b = ((rng.next_u64() % 9) as i8 - 4) as u8;
                }
            }
        }
    }
    let n = MAX_BATCH;
    let mut x: Vec<f32> = (0..n * cols)
        .map(|_| (rng.next_u64() % 255) as f32 - 127.0)
        .collect();
    for b in x.chunks_exact_mut(32) {
        b[(rng.next_u64() % 32) as usize] = 127.0;
    }
    (data, x)
}

#[test]
fn simd_paths_give_the_portable_bits_when_every_step_is_exact() {
    let mut checks = IsaChecks::new("quant::simd_paths_give_the_portable_bits");
    let mut rng = Rng::new(2);
    for isa in ALL.into_iter().filter(|&i| i != Isa::Portable) {
        if !checks.runs(isa) {
            continue;
        }
        for format in FORMATS {
            for cols in widths(format) {
                let rows = 21;
                let (data, x) = exact_case(format, rows, cols, &mut rng);
                let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
                for n in 1..=MAX_BATCH {
                    let mut q = Q8Rows::new();
                    q.quantize(&x[..n * cols], n, cols).expect("whole blocks");
                    let (mut want, mut got) = (vec![0f32; rows * n], vec![0f32; rows * n]);
                    matvec_rows(Isa::Portable, &m, &q, 0..rows, &mut want).expect("shapes");
                    matvec_rows(isa, &m, &q, 0..rows, &mut got).expect("shapes");
                    assert_eq!(
                        got,
                        want,
                        "{} {} cols {cols} batch {n}",
                        isa.name(),
                        format.name()
                    );
                    // the chunk product ([act][row]) too, its micro-kernel included
                    let mut chunk = vec![0f32; rows * n];
                    matmul(isa, &m, &q, &mut chunk, &mut Vec::new()).expect("shapes");
                    for r in 0..rows {
                        for i in 0..n {
                            let (c, w) = (chunk[i * rows + r], want[r * n + i]);
                            assert_eq!(c, w, "{} {} chunk", isa.name(), format.name());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn simd_paths_equal_the_portable_one_within_rounding() {
    let mut checks = IsaChecks::new("quant::simd_paths_equal_the_portable_one");
    let mut rng = Rng::new(3);
    for isa in ALL.into_iter().filter(|&i| i != Isa::Portable) {
        if !checks.runs(isa) {
            continue;
        }
        for format in FORMATS {
            for cols in widths(format) {
                let rows = 19;
                let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
                let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
                let mut w = vec![0f32; rows * cols];
                dequantize(format, &data, &mut w).expect("sizes");
                for n in [1, 2, 3, 5, 8] {
                    let x = activations(&mut rng, n, cols);
                    let mut q = Q8Rows::new();
                    q.quantize(&x, n, cols).expect("whole blocks");
                    let a = dequantized_acts(&q);
                    let (mut want, mut got) = (vec![0f32; rows * n], vec![0f32; rows * n]);
                    matvec_rows(Isa::Portable, &m, &q, 0..rows, &mut want).expect("shapes");
                    matvec_rows(isa, &m, &q, 0..rows, &mut got).expect("shapes");
                    for r in 0..rows {
                        for i in 0..n {
                            let (_, mag) = reference(&w, &a, cols, r, i);
                            let (g, p) = (got[r * n + i], want[r * n + i]);
                            assert!(
                                f64::from((g - p).abs()) <= 2e-6 * mag + 1e-6,
                                "{} {} cols {cols} row {r} act {i}: {g} vs {p}",
                                isa.name(),
                                format.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_threaded_product_equals_row_ranges_on_one_thread() {
    let mut rng = Rng::new(4);
    let (rows, cols) = (1000, 576);
    let format = QuantFormat::Q4_1;
    let data = random_blocks(format, rows * cols / 32, &mut rng);
    let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
    for n in [1, 3] {
        let x = activations(&mut rng, n, cols);
        let mut q = Q8Rows::new();
        q.quantize(&x, n, cols).expect("whole blocks");
        let isa = Isa::detect();
        let mut threaded = vec![0f32; n * rows];
        matvec(isa, &m, &q, &mut threaded, &mut Vec::new()).expect("shapes");
        // one row at a time: [row][act] -> compare with [act][row]
        for r in 0..rows {
            let mut one = vec![0f32; n];
            matvec_rows(isa, &m, &q, r..r + 1, &mut one).expect("shapes");
            for i in 0..n {
                assert_eq!(threaded[i * rows + r], one[i], "row {r} act {i}");
            }
        }
    }
}

/// Whether the chunk product runs the tile micro-kernel over unpacked
/// weight rows (within rounding of the batched product, not its bits).
fn tiled(isa: Isa, format: QuantFormat) -> bool {
    isa >= Isa::Avx2 && format != QuantFormat::Q8_0
}

/// The chunk product against the f64 reference on the portable path, and
/// on every path against that path's own batched product, bit for bit
/// (tiles, activation blocks, threads and the transpose only move outputs)
/// but for the tile micro-kernel, which sums in another order.
#[test]
fn the_chunk_product_equals_the_batched_one_and_the_reference() {
    let mut checks = IsaChecks::new("quant::the_chunk_product_equals_the_batched_one");
    let mut rng = Rng::new(5);
    for format in FORMATS {
        let cols = widths(format)[1];
        // more weight rows than one tile, more activation rows than a block
        let (rows, n) = (150, 7 + 2 * (131_072 / cols).max(MAX_BATCH));
        let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
        let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
        let mut w = vec![0f32; rows * cols];
        dequantize(format, &data, &mut w).expect("sizes");
        let x = activations(&mut rng, n, cols);
        let mut q = Q8Rows::new();
        q.quantize(&x, n, cols).expect("whole blocks");
        let a = dequantized_acts(&q);
        for isa in ALL {
            if !checks.runs(isa) {
                continue;
            }
            let mut got = vec![f32::NAN; n * rows];
            matmul(isa, &m, &q, &mut got, &mut Vec::new()).expect("shapes");
            for start in (0..n).step_by(MAX_BATCH) {
                let end = n.min(start + MAX_BATCH);
                let mut one = Q8Rows::new();
                one.quantize(&x[start * cols..end * cols], end - start, cols)
                    .expect("whole blocks");
                let mut want = vec![0f32; rows * (end - start)];
                matvec_rows(isa, &m, &one, 0..rows, &mut want).expect("shapes");
                for r in 0..rows {
                    for i in start..end {
                        let (g, w_) = (got[i * rows + r], want[r * (end - start) + i - start]);
                        if tiled(isa, format) {
                            let (_, mag) = reference(&w, &a, cols, r, i);
                            assert!(
                                f64::from((g - w_).abs()) <= 2e-6 * mag + 1e-6,
                                "{} {} row {r} act {i}: {g} vs {w_}",
                                isa.name(),
                                format.name()
                            );
                        } else {
                            assert_eq!(g, w_, "{} {} row {r} act {i}", isa.name(), format.name());
                        }
                        if isa == Isa::Portable {
                            let (want, mag) = reference(&w, &a, cols, r, i);
                            assert!((f64::from(g) - want).abs() <= 1e-5 * mag + 1e-6);
                        }
                    }
                }
            }
        }
    }
    // an empty chunk, a width or an output that does not fit
    let m = QuantMatrix::new(QuantFormat::Q4_1, &[0u8; 40], 1, 64).expect("fits");
    let mut q = Q8Rows::new();
    q.quantize(&[], 0, 64).expect("no rows");
    matmul(Isa::detect(), &m, &q, &mut [], &mut Vec::new()).expect("nothing to do");
    q.quantize(&[0.5; 128], 2, 64).expect("whole blocks");
    assert!(matmul(Isa::detect(), &m, &q, &mut [0.0; 3], &mut Vec::new()).is_err());
    q.quantize(&[0.5; 96], 1, 96).expect("whole blocks");
    assert!(matmul(Isa::detect(), &m, &q, &mut [0.0; 1], &mut Vec::new()).is_err());
}

/// Every weight at its format's largest value and every activation at 127
/// or -127: the AVX2 tile's and the interleaved products' 16-bit sums at
/// their worst case still give the portable path's exact bits (a saturated
/// sum would not).
#[test]
fn the_tile_and_the_interleaved_products_do_not_saturate_on_the_largest_values() {
    let mut checks = IsaChecks::new(
        "quant::the_tile_and_the_interleaved_products_do_not_saturate_on_the_largest_values",
    );
    let mut rng = Rng::new(9);
    for format in FORMATS {
        let (rows, cols) = (19, widths(format)[1]);
        let (mut data, _) = exact_case(format, rows, cols, &mut rng);
        let values = match format {
            QuantFormat::Q4_0 => 2..18,
            QuantFormat::Q4_1 => 4..20,
            QuantFormat::Q5_0 => 2..22,
            QuantFormat::Q5_1 => 4..24,
            QuantFormat::Q8_0 => 2..34,
            QuantFormat::Q4K => 16..144,
            // the fifth bits and the nibbles
            QuantFormat::Q5K => 16..176,
            QuantFormat::Q6K => 0..192,
            QuantFormat::Mxfp4 => 1..17,
        };
        for blk in data.chunks_exact_mut(format.block_bytes()) {
            // Q8_0's largest magnitude is -128; MXFP4's tile value (code
            // value + 12) is largest at code 7 (+12); the others' all ones
            let top = match format {
                QuantFormat::Q8_0 => 0x80,
                QuantFormat::Mxfp4 => 0x77,
                _ => 0xFF,
            };
            blk[values.clone()].fill(top);
        }
        let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
        let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
        for sign in [1.0f32, -1.0] {
            let n = 5;
            let x = vec![127.0 * sign; n * cols];
            let mut q = Q8Rows::new();
            q.quantize(&x, n, cols).expect("whole blocks");
            let mut want = vec![0f32; rows * n];
            matvec_rows(Isa::Portable, &m, &q, 0..rows, &mut want).expect("shapes");
            for isa in ALL {
                if !checks.runs(isa) {
                    continue;
                }
                let mut chunk = vec![0f32; rows * n];
                matmul(isa, &m, &q, &mut chunk, &mut Vec::new()).expect("shapes");
                for r in 0..rows {
                    for i in 0..n {
                        let (c, w) = (chunk[i * rows + r], want[r * n + i]);
                        assert_eq!(c, w, "{} {} row {r} act {i}", isa.name(), format.name());
                    }
                }
                let mut got = vec![0f32; rows * n];
                matvec_rows(isa, &packed.view(), &q, 0..rows, &mut got).expect("shapes");
                assert_eq!(got, want, "{} {} interleaved", isa.name(), format.name());
            }
        }
    }
}

/// A prefill chunk gives the same logits on an AVX2-only CPU as on one with
/// AVX-512, and with AMX: every tile sums the same integers and scales them
/// lane by lane in the same order.
#[test]
fn the_tile_gives_the_same_bits_on_avx2_avx512_and_amx() {
    let mut checks = IsaChecks::new("quant::the_tile_gives_the_same_bits_on_avx2_avx512_and_amx");
    if !(checks.runs(Isa::Avx2) && checks.runs(Isa::Avx512)) {
        return;
    }
    // AMX where this machine runs it (counted as skipped otherwise)
    let levels: Vec<Isa> = [Isa::Avx2, Isa::Avx512, Isa::Amx]
        .into_iter()
        .filter(|&isa| checks.runs(isa))
        .collect();
    let mut rng = Rng::new(8);
    for format in FORMATS.into_iter().filter(|&f| tiled(Isa::Avx2, f)) {
        // and rows as wide as the AMX tiles take (2048 values, from a 1B
        // model up)
        for cols in widths(format).into_iter().chain([2048]) {
            // a last tile of 5 rows; every size of a last group of
            // activation rows (up to 4 on AVX2, 8 on AVX-512); one, two and
            // three whole groups of sixteen for AMX, with and without rows
            // left over for AVX-512
            for (rows, n) in [
                (37, 17),
                (16, 2),
                (5, 3),
                (21, 12),
                (9, 15),
                (24, 13),
                (8, 6),
                (19, 16),
                (16, 32),
                (40, 55),
            ] {
                let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
                let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
                let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
                let mut q = Q8Rows::new();
                q.quantize(&activations(&mut rng, n, cols), n, cols)
                    .expect("whole blocks");
                // the file's rows and the interleaved copy (whose tiles are
                // filled from its group blocks directly) on both levels
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let mut all = Vec::new();
                for view in [m, packed.view()] {
                    for &isa in &levels {
                        let mut got = vec![0f32; n * rows];
                        matmul(isa, &view, &q, &mut got, &mut Vec::new()).expect("shapes");
                        all.push(bits(&got));
                    }
                }
                assert!(
                    all.iter().all(|b| *b == all[0]),
                    "{} cols {cols}",
                    format.name()
                );
            }
        }
    }
}

#[test]
fn shapes_that_do_not_fit_are_errors() {
    let data = vec![0u8; 20 * 4];
    assert!(QuantMatrix::new(QuantFormat::Q4_1, &data, 2, 64).is_ok());
    assert!(QuantMatrix::new(QuantFormat::Q4_1, &data, 3, 64).is_err());
    assert!(QuantMatrix::new(QuantFormat::Q4_1, &data, 4, 40).is_err());
    let m = QuantMatrix::new(QuantFormat::Q4_1, &data, 2, 64).expect("fits");
    let mut q = Q8Rows::new();
    q.quantize(&[0.0; 96], 1, 96).expect("whole blocks");
    let mut out = [0f32; 2];
    assert!(matvec_rows(Isa::Portable, &m, &q, 0..2, &mut out).is_err());
    q.quantize(&[0.0; 64], 1, 64).expect("whole blocks");
    assert!(matvec_rows(Isa::Portable, &m, &q, 0..3, &mut [0f32; 3]).is_err());
    assert!(matvec_rows(Isa::Portable, &m, &q, 0..2, &mut out[..1]).is_err());
    q.quantize(&[0.0; 64 * 9], 9, 64).expect("whole blocks");
    assert!(matvec_rows(Isa::Portable, &m, &q, 0..2, &mut [0f32; 18]).is_err());
}

/// The interleaved layout: on every level, the products of a packed matrix
/// equal the portable products of the file's rows, bit for bit where every
/// step is exact and within rounding otherwise, for every format, row
/// counts that leave a group part-filled and row ranges that start and end
/// inside groups; the portable path of the packed matrix is the portable
/// path of the file's rows.
#[test]
fn interleaved_products_equal_the_portable_ones_of_the_file_rows() {
    let mut checks = IsaChecks::new("quant::interleaved_products_equal_the_portable_ones");
    let mut rng = Rng::new(8);
    for format in FORMATS {
        for cols in widths(format) {
            for rows in [8, 21] {
                let (data, x) = exact_case(format, rows, cols, &mut rng);
                let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
                let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
                let p = packed.view();
                for n in 1..=MAX_BATCH {
                    let mut q = Q8Rows::new();
                    q.quantize(&x[..n * cols], n, cols).expect("whole blocks");
                    let mut want = vec![0f32; rows * n];
                    matvec_rows(Isa::Portable, &m, &q, 0..rows, &mut want).expect("shapes");
                    for isa in ALL {
                        if !checks.runs(isa) {
                            continue;
                        }
                        let mut got = vec![0f32; rows * n];
                        matvec_rows(isa, &p, &q, 0..rows, &mut got).expect("shapes");
                        assert_eq!(
                            got,
                            want,
                            "{} {} cols {cols} batch {n}",
                            isa.name(),
                            format.name()
                        );
                        // a range inside groups
                        let (lo, hi) = (3, rows - 2);
                        let mut part = vec![0f32; (hi - lo) * n];
                        matvec_rows(isa, &p, &q, lo..hi, &mut part).expect("shapes");
                        assert_eq!(part, want[lo * n..hi * n]);
                    }
                }
            }
            // random scales: within rounding of the portable path
            let rows = 19;
            let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
            let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
            let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
            let mut w = vec![0f32; rows * cols];
            dequantize(format, &data, &mut w).expect("sizes");
            for n in [1, 3, 8] {
                let x = activations(&mut rng, n, cols);
                let mut q = Q8Rows::new();
                q.quantize(&x, n, cols).expect("whole blocks");
                let a = dequantized_acts(&q);
                let mut want = vec![0f32; rows * n];
                matvec_rows(Isa::Portable, &m, &q, 0..rows, &mut want).expect("shapes");
                for isa in ALL {
                    if !checks.runs(isa) {
                        continue;
                    }
                    let mut got = vec![0f32; rows * n];
                    matvec_rows(isa, &packed.view(), &q, 0..rows, &mut got).expect("shapes");
                    for r in 0..rows {
                        for i in 0..n {
                            let (_, mag) = reference(&w, &a, cols, r, i);
                            let (g, p) = (got[r * n + i], want[r * n + i]);
                            let tol = if isa == Isa::Portable {
                                0.0
                            } else {
                                2e-6 * mag + 1e-6
                            };
                            assert!(
                                f64::from((g - p).abs()) <= tol,
                                "{} {} cols {cols} row {r} act {i}: {g} vs {p}",
                                isa.name(),
                                format.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// A row's outputs are the same bits whichever activation rows share its
/// pass (what keeps batched decoding bit for bit one-at-a-time decoding),
/// on the file's rows and on the interleaved copy, and the chunk product
/// of the interleaved copy equals its batched product.
#[test]
fn a_rows_products_do_not_depend_on_the_rows_beside_it() {
    let mut checks = IsaChecks::new("quant::a_rows_products_do_not_depend_on_the_rows_beside_it");
    let mut rng = Rng::new(9);
    for format in FORMATS {
        let cols = widths(format)[1];
        let rows = 40;
        let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
        let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
        let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
        let x = activations(&mut rng, MAX_BATCH, cols);
        let mut all = Q8Rows::new();
        all.quantize(&x, MAX_BATCH, cols).expect("whole blocks");
        for isa in ALL {
            if !checks.runs(isa) {
                continue;
            }
            for view in [m, packed.view()] {
                let mut batch = vec![0f32; rows * MAX_BATCH];
                matvec_rows(isa, &view, &all, 0..rows, &mut batch).expect("shapes");
                for i in 0..MAX_BATCH {
                    let mut one = Q8Rows::new();
                    one.quantize(&x[i * cols..(i + 1) * cols], 1, cols)
                        .expect("whole blocks");
                    let mut alone = vec![0f32; rows];
                    matvec_rows(isa, &view, &one, 0..rows, &mut alone).expect("shapes");
                    for r in 0..rows {
                        assert_eq!(
                            batch[r * MAX_BATCH + i].to_bits(),
                            alone[r].to_bits(),
                            "{} {} {:?} row {r} act {i}",
                            isa.name(),
                            format.name(),
                            view.layout()
                        );
                    }
                }
            }
            // the chunk product reads the interleaved copy too
            let n = 3 * MAX_BATCH + 5;
            let x = activations(&mut rng, n, cols);
            let mut q = Q8Rows::new();
            q.quantize(&x, n, cols).expect("whole blocks");
            let (mut raw, mut pk) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            matmul(isa, &m, &q, &mut raw, &mut Vec::new()).expect("shapes");
            matmul(isa, &packed.view(), &q, &mut pk, &mut Vec::new()).expect("shapes");
            let mut w = vec![0f32; rows * cols];
            dequantize(format, &data, &mut w).expect("sizes");
            let a = dequantized_acts(&q);
            for i in 0..n {
                for r in 0..rows {
                    let (_, mag) = reference(&w, &a, cols, r, i);
                    let (g, p) = (pk[i * rows + r], raw[i * rows + r]);
                    assert!(
                        f64::from((g - p).abs()) <= 2e-6 * mag + 1e-6,
                        "{} {} chunk row {r} act {i}: {g} vs {p}",
                        isa.name(),
                        format.name()
                    );
                }
            }
        }
    }
}

/// Packing in slabs (as a mapped matrix is, releasing each slab's pages
/// once done) gives the same interleaved matrix as packing it whole, and
/// tells its caller every row once, in order, slab by slab.
#[test]
fn packing_in_slabs_is_packing_whole() {
    let mut rng = Rng::new(21);
    for format in FORMATS {
        let cols = widths(format)[0];
        let rows = 83;
        let data = random_blocks(format, rows * cols / format.block_len(), &mut rng);
        let m = QuantMatrix::new(format, &data, rows, cols).expect("whole blocks");
        let whole = PackedMatrix::pack(&m, |r| r).expect("packs");
        for slab in [1, 8, 13, 64, 4096] {
            let mut told = Vec::new();
            let slabs = PackedMatrix::pack_in_slabs(&m, |r| r, slab, |done| told.push(done))
                .expect("packs");
            let covered: Vec<usize> = told.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(
                covered,
                (0..rows).collect::<Vec<_>>(),
                "{format:?} slabs of {slab}"
            );
            assert!(
                told.iter().all(|r| !r.is_empty()),
                "{format:?}: an empty slab told"
            );
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                whole.view().dequantize_row(r, &mut a).expect("row");
                slabs.view().dequantize_row(r, &mut b).expect("row");
                assert_eq!(a, b, "{format:?} slabs of {slab}: row {r}");
            }
        }
    }
}
