//! Dense dot products in plain Rust, eight partial sums per row (the
//! compiler vectorizes them): the reference of the SIMD paths.

use super::DenseWeights;

/// Rows of `w` (`cols` values each) dot each row of `xs` into `out`
/// ([row][activation]).
pub(super) fn rows(w: DenseWeights<'_>, cols: usize, xs: &[&[f32]], out: &mut [f32]) {
    match w {
        DenseWeights::F32(w) => rows_with(w, cols, xs, out, |v| v),
        DenseWeights::Bf16(w) => rows_with(w, cols, xs, out, |v| v.to_f32()),
        DenseWeights::F16(w) => rows_with(w, cols, xs, out, |v| v.to_f32()),
    }
}

fn rows_with<T: Copy>(w: &[T], cols: usize, xs: &[&[f32]], out: &mut [f32], f: impl Fn(T) -> f32) {
    let n = xs.len();
    for (o, row) in out.chunks_exact_mut(n).zip(w.chunks_exact(cols)) {
        for (o, x) in o.iter_mut().zip(xs) {
            let mut lanes = [0f32; 8];
            let (wc, xc) = (row.chunks_exact(8), x.chunks_exact(8));
            let (wt, xt) = (wc.remainder(), xc.remainder());
            for (wv, xv) in wc.zip(xc) {
                for ((l, &a), &b) in lanes.iter_mut().zip(wv).zip(xv) {
                    *l += f(a) * b;
                }
            }
            let tail: f32 = wt.iter().zip(xt).map(|(&a, &b)| f(a) * b).sum();
            *o = lanes.iter().sum::<f32>() + tail;
        }
    }
}
