//! The gated activations and the soft cap on AVX2 and AVX-512, written
//! once over the vector width ([`Lanes`]) with the vectorized `exp`: the
//! portable forms call libm's `tanh` and `exp` once per value, which on
//! Gemma 4 E2B's shape (GELU over 15 MLPs of 6144 and 20 of 12288, the soft
//! cap over 262144 logits) took 7% of a decode step.
//!
//! Each form is a logistic function of one exponential:
//! `0.5 (1 + tanh z) = 1 / (1 + e^(-2z))` for GELU's tanh approximation and
//! `tanh z = 1 - 2 / (1 + e^(2z))` for the soft cap, so they agree with the
//! portable forms to a few units in the last place of the result (the cap's
//! absolute error is a few ulps of the cap itself, where the portable
//! `tanh` keeps small values' relative precision). A row's tail shorter
//! than a vector runs through the same lanes from a padded copy, so a
//! value's result never depends on where it sits in the slice (a batch of
//! rows gives each row the bits it has alone), and both levels give the
//! same bits for arguments of `exp` within its range (-87.3 to 88.3).

#![allow(unsafe_code)]

use super::Lanes;
use super::avx2::Avx2;
use super::avx512::Avx512;
use crate::isa::Isa;
use crate::ops::GateActivation;

/// `gate[i] = act(gate[i]) * up[i]` on the best vector level the process
/// runs; `false` (nothing done) where it runs none. `gate` and `up` have
/// the same length (the caller checks).
pub(crate) fn gate_in_place(gate: &mut [f32], up: &[f32], act: GateActivation) -> bool {
    // SAFETY: each entry point runs only where its level is enabled.
    unsafe {
        if Isa::Avx512.enabled() {
            gate_avx512(gate, up, act);
        } else if Isa::Avx2.enabled() {
            gate_avx2(gate, up, act);
        } else {
            return false;
        }
    }
    true
}

/// `x[i] = cap tanh(x[i] / cap)` on the best vector level the process runs;
/// `false` (nothing done) where it runs none.
pub(crate) fn softcap_in_place(x: &mut [f32], cap: f32) -> bool {
    // SAFETY: as in `gate_in_place`.
    unsafe {
        if Isa::Avx512.enabled() {
            softcap_avx512(x, cap);
        } else if Isa::Avx2.enabled() {
            softcap_avx2(x, cap);
        } else {
            return false;
        }
    }
    true
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gate_avx2(gate: &mut [f32], up: &[f32], act: GateActivation) {
    // SAFETY: the features `Avx2` needs are enabled here.
    unsafe { gate_rows::<Avx2>(gate, up, act) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gate_avx512(gate: &mut [f32], up: &[f32], act: GateActivation) {
    // SAFETY: the features `Avx512` needs are enabled here.
    unsafe { gate_rows::<Avx512>(gate, up, act) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softcap_avx2(x: &mut [f32], cap: f32) {
    // SAFETY: the features `Avx2` needs are enabled here.
    unsafe { softcap_rows::<Avx2>(x, cap) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn softcap_avx512(x: &mut [f32], cap: f32) {
    // SAFETY: the features `Avx512` needs are enabled here.
    unsafe { softcap_rows::<Avx512>(x, cap) }
}

/// The widest vector of any level: the padded tail's buffer.
const MAX_WIDTH: usize = 16;

/// What a vector pass computes from a vector of `x` (and one of `y`).
#[derive(Debug, Clone, Copy)]
enum Form {
    /// `act(x) * y`.
    Gate(GateActivation),
    /// `cap tanh(x / cap)`, `y` unused.
    SoftCap(f32),
}

/// `x / (1 + e^(-k x))`: `x` times the logistic of `k x`.
///
/// # Safety
/// The CPU runs `L`'s features.
#[inline(always)]
unsafe fn logistic_times<L: Lanes>(x: L::V, k: L::V) -> L::V {
    // SAFETY: the caller runs `L`'s features.
    unsafe {
        let e = L::exp(L::mul(L::sub(L::zero(), k), x));
        L::div(x, L::add(L::splat(1.0), e))
    }
}

/// `form` on one vector of `x` and `y`. A plain function, not a closure,
/// so that it inlines into the level's entry point with its features (a
/// closure's body did not, and called each intrinsic out of line).
///
/// # Safety
/// The CPU runs `L`'s features.
#[inline(always)]
unsafe fn apply<L: Lanes>(form: Form, x: L::V, y: L::V) -> L::V {
    // SAFETY: the caller runs `L`'s features.
    unsafe {
        let one = L::splat(1.0);
        match form {
            Form::Gate(GateActivation::Silu) => L::mul(logistic_times::<L>(x, one), y),
            Form::Gate(GateActivation::GeluTanh) => {
                // 0.5 x (1 + tanh(c (x + 0.044715 x^3)))
                //   = x / (1 + e^(-2c (1 + 0.044715 x^2) x))
                let cubic = L::mul(L::splat(0.044_715), x);
                let k = L::mul(L::splat(2.0 * 0.797_884_6), L::fmadd(cubic, x, one));
                L::mul(logistic_times::<L>(x, k), y)
            }
            Form::Gate(GateActivation::ClampedSwiGlu { limit, alpha }) => {
                let g = L::min(x, L::splat(limit));
                let u = L::min(L::max(y, L::splat(-limit)), L::splat(limit));
                L::mul(L::add(u, one), logistic_times::<L>(g, L::splat(alpha)))
            }
            Form::SoftCap(cap) => {
                // cap tanh(x / cap) = cap (1 - 2 / (1 + e^(2x / cap)))
                let e = L::exp(L::mul(L::splat(2.0 / cap), x));
                let two = L::splat(2.0);
                L::mul(L::splat(cap), L::sub(one, L::div(two, L::add(one, e))))
            }
        }
    }
}

/// `xs[i] = form(xs[i], ys[i])` (`ys` empty: zeros) a vector at a time,
/// the tail from a copy padded with zeros.
///
/// # Safety
/// The CPU runs `L`'s features.
#[inline(always)]
unsafe fn by_vectors<L: Lanes>(xs: &mut [f32], ys: &[f32], form: Form) {
    let w = L::WIDTH;
    let whole = xs.len() / w * w;
    // SAFETY: the caller runs `L`'s features; loads and stores are
    // bounds-checked.
    unsafe {
        for at in (0..whole).step_by(w) {
            let y = if ys.is_empty() {
                L::zero()
            } else {
                L::load(ys, at)
            };
            L::store(xs, at, apply::<L>(form, L::load(xs, at), y));
        }
        let n = xs.len() - whole;
        if n > 0 {
            let (mut xt, mut yt) = ([0f32; MAX_WIDTH], [0f32; MAX_WIDTH]);
            xt[..n].copy_from_slice(&xs[whole..]);
            if !ys.is_empty() {
                yt[..n].copy_from_slice(&ys[whole..]);
            }
            let v = apply::<L>(form, L::load(&xt, 0), L::load(&yt, 0));
            L::store(&mut xt, 0, v);
            xs[whole..].copy_from_slice(&xt[..n]);
        }
    }
}

/// [`gate_in_place`] at level `L`.
///
/// # Safety
/// The CPU runs `L`'s features.
#[inline(always)]
unsafe fn gate_rows<L: Lanes>(gate: &mut [f32], up: &[f32], act: GateActivation) {
    // SAFETY: the caller runs `L`'s features.
    unsafe { by_vectors::<L>(gate, up, Form::Gate(act)) }
}

/// [`softcap_in_place`] at level `L`.
///
/// # Safety
/// The CPU runs `L`'s features.
#[inline(always)]
unsafe fn softcap_rows<L: Lanes>(x: &mut [f32], cap: f32) {
    // SAFETY: the caller runs `L`'s features.
    unsafe { by_vectors::<L>(x, &[], Form::SoftCap(cap)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    type GateFn = unsafe fn(&mut [f32], &[f32], GateActivation);
    type CapFn = unsafe fn(&mut [f32], f32);

    /// The levels this CPU runs, with their entry points.
    fn levels() -> Vec<(&'static str, GateFn, CapFn)> {
        let mut out: Vec<(&'static str, GateFn, CapFn)> = vec![];
        if Isa::Avx2.available() {
            out.push(("avx2", gate_avx2, softcap_avx2));
        }
        if Isa::Avx512.available() {
            out.push(("avx512", gate_avx512, softcap_avx512));
        }
        out
    }

    /// Values from -12 to 12 (and a few far out), deterministic.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8;
                let v = (h as f32 / (1u32 << 24) as f32) * 24.0 - 12.0;
                match i % 37 {
                    5 => v * 9.0,
                    11 => 0.0,
                    _ => v,
                }
            })
            .collect()
    }

    const ACTS: [GateActivation; 3] = [
        GateActivation::Silu,
        GateActivation::GeluTanh,
        GateActivation::ClampedSwiGlu {
            limit: 7.0,
            alpha: 1.702,
        },
    ];

    /// The portable form, one value.
    fn portable_gate(g: f32, u: f32, act: GateActivation) -> f32 {
        let (mut gs, us) = ([g], [u]);
        crate::ops::portable_gate_in_place(&mut gs, &us, act);
        gs[0]
    }

    #[test]
    fn gates_agree_with_the_portable_form_on_every_level() {
        let (g, u) = (values(6144 + 13, 1), values(6144 + 13, 2));
        for (level, gate, _) in levels() {
            for act in ACTS {
                let mut out = g.clone();
                // SAFETY: the level is available.
                unsafe { gate(&mut out, &u, act) };
                for i in 0..g.len() {
                    let want = portable_gate(g[i], u[i], act);
                    let tol = 4e-6 * want.abs().max(1.0);
                    assert!(
                        (out[i] - want).abs() <= tol,
                        "{level} {act:?} at {}: {} against {want}",
                        g[i],
                        out[i]
                    );
                }
            }
        }
    }

    #[test]
    fn the_soft_cap_agrees_with_tanh_on_every_level() {
        let x: Vec<f32> = values(1000, 3).iter().map(|v| v * 8.0).collect();
        for (level, _, softcap) in levels() {
            for cap in [30.0f32, 50.0] {
                let mut out = x.clone();
                // SAFETY: the level is available.
                unsafe { softcap(&mut out, cap) };
                for (&v, &o) in x.iter().zip(&out) {
                    let want = cap * (v / cap).tanh();
                    assert!(
                        (o - want).abs() <= 4e-7 * cap,
                        "{level} cap {cap} at {v}: {o} against {want}"
                    );
                    assert!(o.abs() <= cap);
                }
            }
        }
    }

    /// A value's result does not depend on where it sits: every prefix of a
    /// row (tails of every length) gives the bits the whole row gives, and
    /// both levels give the same bits.
    #[test]
    fn results_do_not_depend_on_the_position_or_the_level() {
        let (g, u) = (values(41, 4), values(41, 5));
        let mut by_level: Vec<Vec<Vec<u32>>> = vec![];
        for (level, gate, softcap) in levels() {
            let mut results = vec![];
            for act in ACTS {
                let mut whole = g.clone();
                // SAFETY: the level is available.
                unsafe { gate(&mut whole, &u, act) };
                for n in 0..g.len() {
                    let mut part = g[..n].to_vec();
                    // SAFETY: as above.
                    unsafe { gate(&mut part, &u[..n], act) };
                    assert_eq!(part, whole[..n], "{level} {act:?} prefix {n}");
                }
                results.push(whole.iter().map(|v| v.to_bits()).collect());
            }
            let mut whole = g.clone();
            // SAFETY: as above.
            unsafe { softcap(&mut whole, 30.0) };
            for n in 0..g.len() {
                let mut part = g[..n].to_vec();
                // SAFETY: as above.
                unsafe { softcap(&mut part, 30.0) };
                assert_eq!(part, whole[..n], "{level} soft cap prefix {n}");
            }
            results.push(whole.iter().map(|v| v.to_bits()).collect());
            by_level.push(results);
        }
        for other in by_level.iter().skip(1) {
            assert_eq!(other, &by_level[0], "the levels differ");
        }
    }
}
