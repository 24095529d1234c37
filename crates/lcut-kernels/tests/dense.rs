//! Dense products over f32, bf16 and f16 weights: the portable path against
//! an f64 reference, every SIMD path the CPU has against the portable one
//! (a level this machine does not run is named on standard error), threads against one.

use half::{bf16, f16};
use lcut_kernels::dense::{DenseMatrix, DenseWeights, matvec, matvec_rows};
use lcut_kernels::isa::{ALL, Isa};
use lcut_kernels::testdata::{IsaChecks, Rng};

/// The three storage types of the same random matrix, and its f32 values
/// as each type rounds them.
struct Weights {
    f32s: Vec<f32>,
    bf16s: Vec<bf16>,
    f16s: Vec<f16>,
}

impl Weights {
    fn random(rng: &mut Rng, n: usize) -> Self {
        let f32s = rng.normals(n, 0.1);
        Self {
            bf16s: f32s.iter().map(|&v| bf16::from_f32(v)).collect(),
            f16s: f32s.iter().map(|&v| f16::from_f32(v)).collect(),
            f32s,
        }
    }

    /// Each type's matrix and its values widened to f32.
    fn each(&self) -> Vec<(&'static str, DenseWeights<'_>, Vec<f32>)> {
        vec![
            ("f32", DenseWeights::F32(&self.f32s), self.f32s.clone()),
            (
                "bf16",
                DenseWeights::Bf16(&self.bf16s),
                self.bf16s.iter().map(|v| v.to_f32()).collect(),
            ),
            (
                "f16",
                DenseWeights::F16(&self.f16s),
                self.f16s.iter().map(|v| v.to_f32()).collect(),
            ),
        ]
    }
}

fn reference(w: &[f32], x: &[f32], cols: usize, r: usize, i: usize) -> (f64, f64) {
    let (wr, xr) = (&w[r * cols..(r + 1) * cols], &x[i * cols..(i + 1) * cols]);
    wr.iter().zip(xr).fold((0.0, 0.0), |(s, m), (&a, &b)| {
        let t = f64::from(a) * f64::from(b);
        (s + t, m + t.abs())
    })
}

#[test]
fn every_path_equals_the_f64_product_of_the_stored_values() {
    let mut checks = IsaChecks::new("dense::every_path_equals_the_f64_product");
    let mut rng = Rng::new(11);
    for cols in [8, 40, 64, 576, 1000] {
        let rows = 23;
        let w = Weights::random(&mut rng, rows * cols);
        for n in [1, 2, 3, 4, 7] {
            let x = rng.normals(n * cols, 1.0);
            for (name, data, widened) in w.each() {
                let m = DenseMatrix::new(data, rows, cols).expect("sizes");
                let mut portable = vec![0f32; rows * n];
                matvec_rows(Isa::Portable, &m, &x, n, 0..rows, &mut portable).expect("shapes");
                for isa in ALL {
                    if !checks.runs(isa) {
                        continue;
                    }
                    let mut got = vec![0f32; rows * n];
                    matvec_rows(isa, &m, &x, n, 0..rows, &mut got).expect("shapes");
                    for r in 0..rows {
                        for i in 0..n {
                            let (want, mag) = reference(&widened, &x, cols, r, i);
                            let (g, p) = (got[r * n + i], portable[r * n + i]);
                            let what = format!("{} {name} cols {cols} row {r} act {i}", isa.name());
                            assert!((f64::from(p) - want).abs() <= 1e-5 * mag + 1e-7, "{what}");
                            assert!(
                                (g - p).abs() as f64 <= 2e-6 * mag + 1e-7,
                                "{what}: {g} vs {p}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_threaded_product_equals_one_row_at_a_time() {
    let mut rng = Rng::new(12);
    let (rows, cols) = (1500, 576);
    let w = Weights::random(&mut rng, rows * cols);
    for n in [1, 3] {
        let x = rng.normals(n * cols, 1.0);
        for (name, data, _) in w.each() {
            let m = DenseMatrix::new(data, rows, cols).expect("sizes");
            let mut threaded = vec![0f32; n * rows];
            matvec(Isa::detect(), &m, &x, n, &mut threaded, &mut Vec::new()).expect("shapes");
            for r in (0..rows).step_by(7) {
                let mut one = vec![0f32; n];
                matvec_rows(Isa::detect(), &m, &x, n, r..r + 1, &mut one).expect("shapes");
                for i in 0..n {
                    assert_eq!(threaded[i * rows + r], one[i], "{name} row {r} act {i}");
                }
            }
        }
    }
}

#[test]
fn shapes_that_do_not_fit_are_errors() {
    let w = vec![0f32; 12];
    assert!(DenseMatrix::new(DenseWeights::F32(&w), 3, 5).is_err());
    let m = DenseMatrix::new(DenseWeights::F32(&w), 3, 4).expect("fits");
    let mut out = [0f32; 3];
    assert!(matvec_rows(Isa::Portable, &m, &[0.0; 5], 1, 0..3, &mut out).is_err());
    assert!(matvec_rows(Isa::Portable, &m, &[0.0; 4], 1, 0..4, &mut [0.0; 4]).is_err());
    assert!(matvec_rows(Isa::Portable, &m, &[0.0; 4], 1, 0..3, &mut out[..2]).is_err());
    assert!(matvec_rows(Isa::Portable, &m, &[0.0; 36], 9, 0..1, &mut [0.0; 9]).is_err());
}
