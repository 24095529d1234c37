//! Q8_0's chunk product on 16-bit activations (`matmul_wide`): as close to
//! the product of the unquantized activations as the weights allow (far
//! closer than 8-bit activations), the same bits on AVX2 and AVX-512, no
//! saturation at the largest values, and an error, not a wrong answer,
//! where it does not run.

use lcut_kernels::isa::{ALL, Isa};
use lcut_kernels::quant::{
    PackedMatrix, Q8Rows, Q16Rows, QuantFormat, QuantMatrix, dequantize, matmul, matmul_wide,
    takes_wide_activations,
};
use lcut_kernels::testdata::{IsaChecks, Rng, random_blocks};

const Q8_0: QuantFormat = QuantFormat::Q8_0;

/// Row r of W dot activation row i in f64, and the sum of the terms'
/// magnitudes (the scale of rounding errors).
fn reference(w: &[f32], x: &[f32], cols: usize, r: usize, i: usize) -> (f64, f64) {
    let (wr, xr) = (&w[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
    wr.iter().zip(xr).fold((0.0, 0.0), |(s, m), (&a, &b)| {
        let t = f64::from(a) * f64::from(b);
        (s + t, m + t.abs())
    })
}

/// Activations with an all-zero block and a block with one outlier.
fn activations(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    let mut x = rng.normals(rows * cols, 1.0);
    x[..32].fill(0.0);
    x[40] = 50.0;
    x
}

/// The levels on which the wide product runs here (others counted as
/// skipped).
fn levels(checks: &mut IsaChecks) -> Vec<Isa> {
    ALL.into_iter()
        .filter(|&isa| isa >= Isa::Avx2 && checks.runs(isa))
        .filter(|&isa| takes_wide_activations(isa, Q8_0))
        .collect()
}

#[test]
fn sixteen_bit_activations_keep_the_product_of_the_unquantized_ones() {
    let mut checks = IsaChecks::new("quant_wide::sixteen_bit_activations_keep_the_product");
    let mut rng = Rng::new(21);
    for cols in [64, 576, 1056] {
        let (rows, n) = (150, 23);
        let data = random_blocks(Q8_0, rows * cols / 32, &mut rng);
        let m = QuantMatrix::new(Q8_0, &data, rows, cols).expect("whole blocks");
        let mut w = vec![0f32; rows * cols];
        dequantize(Q8_0, &data, &mut w).expect("sizes");
        let x = activations(&mut rng, n, cols);
        let mut wide = Q16Rows::new();
        wide.quantize(&x, n, cols).expect("whole blocks");
        let mut narrow = Q8Rows::new();
        narrow.quantize(&x, n, cols).expect("whole blocks");
        for isa in levels(&mut checks) {
            let (mut got, mut eight) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
            matmul_wide(isa, &m, &wide, &mut got, &mut Vec::new()).expect("shapes");
            matmul(isa, &m, &narrow, &mut eight, &mut Vec::new()).expect("shapes");
            let (mut err_wide, mut err_eight) = (0f64, 0f64);
            for r in 0..rows {
                for i in 0..n {
                    let (want, mag) = reference(&w, &x, cols, r, i);
                    // each activation moves at most half its block's step
                    let step: f64 = (0..cols)
                        .map(|j| {
                            f64::from(w[r * cols + j].abs()) * f64::from(wide.row(i).d[j / 32])
                        })
                        .sum();
                    let g = f64::from(got[i * rows + r]);
                    assert!(
                        (g - want).abs() <= 0.5 * step + 2e-6 * mag + 1e-6,
                        "{} cols {cols} row {r} act {i}: {g} vs {want}",
                        isa.name()
                    );
                    let scale = mag + 1e-6;
                    err_wide = err_wide.max((g - want).abs() / scale);
                    err_eight =
                        err_eight.max((f64::from(eight[i * rows + r]) - want).abs() / scale);
                }
            }
            // 16-bit rounding is 2^8 times finer than 8-bit rounding
            assert!(
                err_wide < err_eight / 20.0,
                "{} cols {cols}: 16-bit {err_wide} vs 8-bit {err_eight}",
                isa.name()
            );
        }
    }
}

#[test]
fn the_wide_tile_gives_the_same_bits_on_avx2_and_avx512() {
    let mut checks = IsaChecks::new("quant_wide::the_wide_tile_gives_the_same_bits");
    if !(checks.runs(Isa::Avx2) && checks.runs(Isa::Avx512)) {
        return;
    }
    let mut rng = Rng::new(22);
    for cols in [32, 544, 1056] {
        // a last tile of 5 rows, 1 to 4 activation rows in the last group
        for (rows, n) in [(37, 17), (16, 2), (5, 3)] {
            let data = random_blocks(Q8_0, rows * cols / 32, &mut rng);
            let m = QuantMatrix::new(Q8_0, &data, rows, cols).expect("whole blocks");
            let packed = PackedMatrix::pack(&m, |r| r).expect("packs");
            let mut q = Q16Rows::new();
            q.quantize(&rng.normals(n * cols, 1.0), n, cols)
                .expect("whole blocks");
            for view in [m, packed.view()] {
                let (mut two, mut five) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                matmul_wide(Isa::Avx2, &view, &q, &mut two, &mut Vec::new()).expect("shapes");
                matmul_wide(Isa::Avx512, &view, &q, &mut five, &mut Vec::new()).expect("shapes");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&two), bits(&five), "cols {cols} rows {rows}");
            }
        }
    }
}

/// Every weight at -128 and every activation at ±32767: the integer sums
/// at their largest neither saturate nor overflow.
#[test]
fn the_wide_tile_does_not_saturate_on_the_largest_values() {
    let mut checks = IsaChecks::new("quant_wide::the_wide_tile_does_not_saturate");
    let mut rng = Rng::new(23);
    let (rows, cols, n) = (19, 4096, 5);
    let mut data = random_blocks(Q8_0, rows * cols / 32, &mut rng);
    for blk in data.chunks_exact_mut(Q8_0.block_bytes()) {
        blk[2..34].fill(0x80);
    }
    let m = QuantMatrix::new(Q8_0, &data, rows, cols).expect("whole blocks");
    let mut w = vec![0f32; rows * cols];
    dequantize(Q8_0, &data, &mut w).expect("sizes");
    for sign in [1.0f32, -1.0] {
        let x = vec![32767.0 * sign; n * cols];
        let mut q = Q16Rows::new();
        q.quantize(&x, n, cols).expect("whole blocks");
        for isa in levels(&mut checks) {
            let mut got = vec![0f32; n * rows];
            matmul_wide(isa, &m, &q, &mut got, &mut Vec::new()).expect("shapes");
            for r in 0..rows {
                for i in 0..n {
                    let (want, mag) = reference(&w, &x, cols, r, i);
                    let g = f64::from(got[i * rows + r]);
                    assert!(
                        (g - want).abs() <= 1e-6 * mag,
                        "{} row {r}: {g} vs {want}",
                        isa.name()
                    );
                }
            }
        }
    }
}

#[test]
fn a_format_or_shape_the_wide_product_does_not_take_is_an_error() {
    let q4 = QuantMatrix::new(QuantFormat::Q4_1, &[0u8; 40], 1, 64).expect("fits");
    let mut q = Q16Rows::new();
    q.quantize(&[0.5; 128], 2, 64).expect("whole blocks");
    let err = matmul_wide(Isa::detect(), &q4, &q, &mut [0.0; 2], &mut Vec::new())
        .expect_err("Q4_1 has no 16-bit product");
    assert!(err.to_string().contains("Q4_1"), "{err}");
    assert!(
        matmul_wide(Isa::Portable, &q4, &q, &mut [0.0; 2], &mut Vec::new()).is_err(),
        "the portable level has no wide tile"
    );
    let q8 = QuantMatrix::new(Q8_0, &[0u8; 68], 1, 64).expect("fits");
    if takes_wide_activations(Isa::detect(), Q8_0) {
        assert!(matmul_wide(Isa::detect(), &q8, &q, &mut [0.0; 3], &mut Vec::new()).is_err());
        q.quantize(&[0.5; 96], 1, 96).expect("whole blocks");
        assert!(matmul_wide(Isa::detect(), &q8, &q, &mut [0.0; 1], &mut Vec::new()).is_err());
    }
    assert!(q.quantize(&[0.5; 48], 1, 48).is_err());
}
