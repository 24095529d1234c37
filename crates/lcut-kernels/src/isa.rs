//! Which instruction set the kernels use, chosen once at run time.
//!
//! Four levels: AMX (AMX-INT8 tiles beside the AVX-512 level, for the
//! prefill chunks' products), AVX-512 (F, BW, VL and VNNI, with FMA and
//! F16C), AVX2 (with FMA and F16C) and portable Rust. A CPU with AVX-512 but
//! without VNNI runs the AVX2 level. The environment variable `LCUT_ISA`
//! (`portable`, `avx2`, `avx512` or `amx`) caps the level, to compare paths
//! on one machine or to step around a suspected fault in one of them.
//!
//! AMX runs only where Linux grants the process the tiles' register state
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`, asked once, the first time the level
//! is considered and not capped off).

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
    /// The AVX-512 level with AMX-INT8 tile products (Linux, where the
    /// process is granted the tile state); only the prefill chunks' 8-bit
    /// tile uses it, every other kernel runs its AVX-512 path.
    Amx,
}

/// Every level, from the most portable up.
pub const ALL: [Isa; 4] = [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Amx];

impl Isa {
    /// The best level this CPU runs, capped by `LCUT_ISA` when set; decided
    /// once per process.
    pub fn detect() -> Isa {
        static CHOSEN: OnceLock<Isa> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            // the cap first: a level capped off is never asked for (AMX's
            // request changes the process's state)
            let cap = std::env::var("LCUT_ISA")
                .ok()
                .and_then(|v| Isa::parse(&v))
                .unwrap_or(Isa::Amx);
            ALL.into_iter()
                .rev()
                .find(|isa| *isa <= cap && isa.available())
                .unwrap_or(Isa::Portable)
        })
    }

    /// Whether this process runs the level: the CPU has it and `LCUT_ISA`
    /// does not cap it off ([`Isa::detect`] is this level or above).
    pub fn enabled(self) -> bool {
        self <= Isa::detect() && self.available()
    }

    /// Whether this CPU can run the level.
    pub fn available(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2 => has_avx2(),
            Isa::Avx512 => has_avx512(),
            Isa::Amx => has_avx512() && has_amx(),
        }
    }

    /// The level's name as `LCUT_ISA` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
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

/// Whether the CPU lists AMX-INT8 and Linux granted this process the tile
/// data state; asked once per process.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn has_amx() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| cpu_lists_amx_int8() && request_tile_data())
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn has_amx() -> bool {
    false
}

/// CPUID leaf 7: EDX bit 24 is AMX-TILE, bit 25 AMX-INT8.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn cpu_lists_amx_int8() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    #[allow(unused_unsafe, unsafe_code)]
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only where
    // leaf 0 lists it.
    let edx = unsafe {
        if __cpuid(0).eax < 7 {
            return false;
        }
        __cpuid_count(7, 0).edx
    };
    edx & (1 << 24) != 0 && edx & (1 << 25) != 0
}

/// Ask Linux for the AMX tile data state (XTILEDATA, state component 18)
/// for every thread of this process, and check that it was granted.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XTILEDATA: libc::c_long = 18;
    let mut granted: u64 = 0;
    #[allow(unsafe_code)]
    // SAFETY: arch_prctl with these codes reads its integer argument and
    // writes one u64 through the pointer, which lives on this stack.
    unsafe {
        libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA) == 0
            && libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_GET_XCOMP_PERM,
                &mut granted as *mut u64,
            ) == 0
            && granted & (1 << XTILEDATA) != 0
    }
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
