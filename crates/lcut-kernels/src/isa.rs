//! Which instruction set the kernels use, chosen once at run time.
//!
//! Three levels: AVX-512 (F, BW, VL and VNNI, with FMA and F16C), AVX2
//! (with FMA and F16C) and portable Rust. A CPU with AVX-512 but without
//! VNNI runs the AVX2 level. The environment variable `LCUT_ISA`
//! (`portable`, `avx2` or `avx512`) caps the level, to compare paths on one
//! machine or to step around a suspected fault in one of them.

use std::sync::OnceLock;

/// An instruction-set level of the kernels, from the most portable up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Plain Rust, every CPU: the reference the other levels are held to.
    Portable,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// x86-64 with AVX-512 F, BW, VL and VNNI (and AVX2, FMA, F16C).
    Avx512,
}

/// Every level, from the most portable up.
pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

impl Isa {
    /// The best level this CPU runs, capped by `LCUT_ISA` when set; decided
    /// once per process.
    pub fn detect() -> Isa {
        static CHOSEN: OnceLock<Isa> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let best = ALL
                .into_iter()
                .rev()
                .find(|isa| isa.available())
                .unwrap_or(Isa::Portable);
            match std::env::var("LCUT_ISA").ok().and_then(|v| Isa::parse(&v)) {
                Some(cap) => best.min(cap),
                None => best,
            }
        })
    }

    /// Whether this process runs the level: the CPU has it and `LCUT_ISA`
    /// does not cap it off ([`Isa::detect`] is this level or above).
    pub fn enabled(self) -> bool {
        self.available() && self <= Isa::detect()
    }

    /// Whether this CPU can run the level.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2 => has_avx2(),
            Isa::Avx512 => has_avx512(),
        }
    }

    /// The level's name as `LCUT_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The level named `name` (as [`Isa::name`] spells it), if any.
    pub fn parse(name: &str) -> Option<Isa> {
        ALL.into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name.trim()))
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx512() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_detected_level_runs_here() {
        for isa in ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse(" AVX2 "), Some(Isa::Avx2));
        assert_eq!(Isa::parse("sse"), None);
        assert!(Isa::detect().available());
        assert!(Isa::Portable.available());
        assert!(Isa::detect().enabled() && Isa::Portable.enabled());
        assert!(
            ALL.into_iter()
                .all(|i| i.enabled() == (i.available() && i <= Isa::detect()))
        );
    }
}
