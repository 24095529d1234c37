//! Which code made a record: the build of lcut that ran it and the
//! instruction-set level its kernels ran at. Two runs with the same
//! [`MadeBy`] compute the same bits (whatever their thread counts); another
//! build or level rounds differently, which can tip a near-tie token. A
//! leaderboard journal records it per item, so that a run resumed with
//! another binary, or shards run on other CPUs, say so in their table.
//!
//! The build is named by the GNU build ID the linker writes into the ELF
//! file that holds this code (the `lcut` binary, or the Python extension
//! module): a hash of the linked file, the same for the same build and
//! different for any other. Read from the file itself, found through
//! `/proc/self/maps`; where there is none (not Linux, a linker that writes
//! none) the build is named by lcut's version alone, with "build ID
//! unknown".

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The build and instruction-set level a record was made with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MadeBy {
    /// `lcut <version> <build ID>` (the build ID's first 16 hex digits).
    pub build: String,
    /// The kernels' instruction-set level (`avx2`, `avx512`, ...), as
    /// `LCUT_ISA` may cap it.
    pub isa: String,
}

impl MadeBy {
    /// This process's build and the level its kernels run at.
    pub fn current() -> MadeBy {
        MadeBy {
            build: build().to_string(),
            isa: lcut_kernels::Isa::detect().name().to_string(),
        }
    }
}

impl std::fmt::Display for MadeBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {}", self.build, self.isa)
    }
}

/// This build's name, read once.
fn build() -> &'static str {
    static BUILD: OnceLock<String> = OnceLock::new();
    BUILD.get_or_init(|| {
        let version = env!("CARGO_PKG_VERSION");
        match own_file().and_then(|f| gnu_build_id(&f)) {
            Some(id) => format!("lcut {version} {}", &id[..id.len().min(16)]),
            None => format!("lcut {version} (build ID unknown)"),
        }
    })
}

/// The file mapped at the address of this function's code: the binary or
/// shared library lcut-engine is linked into. Opened through
/// `/proc/self/map_files`, which reaches the mapped file itself even when
/// its path has since been replaced (a rebuild while a run goes on); by its
/// path where that is not readable, and not at all when the path is gone.
fn own_file() -> Option<PathBuf> {
    let here = own_file as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        // range, perms, offset, device, inode, then the path (which may
        // hold spaces)
        let mut fields = line.splitn(6, ' ');
        let range = fields.next()?;
        let (lo, hi) = range.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        let path = fields.nth(4)?.trim_start();
        if !(lo <= here && here < hi && path.starts_with('/')) {
            return None;
        }
        let mapped = PathBuf::from(format!("/proc/self/map_files/{range}"));
        if std::fs::File::open(&mapped).is_ok() {
            return Some(mapped);
        }
        (!path.ends_with(" (deleted)")).then(|| PathBuf::from(path))
    })
}

/// The GNU build ID of the ELF file at `path`, in hex: the descriptor of
/// its `NT_GNU_BUILD_ID` note. `None` for a file that is not a 64-bit
/// little-endian ELF file, has no such note, or is cut short.
pub fn gnu_build_id(path: &Path) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut read_at = |offset: u64, len: usize| -> Option<Vec<u8>> {
        let mut buf = vec![0u8; len];
        file.seek(SeekFrom::Start(offset)).ok()?;
        file.read_exact(&mut buf).ok()?;
        Some(buf)
    };
    let header = read_at(0, 64)?;
    // "\x7fELF", 64-bit, little-endian
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u32_at =
        |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]));
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    let (ph_offset, ph_size, ph_count) = (
        u64_at(&header, 0x20),
        usize::from(u16_at(&header, 0x36)),
        usize::from(u16_at(&header, 0x38)),
    );
    if ph_size < 56 {
        return None;
    }
    let table = read_at(ph_offset, ph_size.checked_mul(ph_count)?)?;
    const PT_NOTE: u32 = 4;
    const NT_GNU_BUILD_ID: u32 = 3;
    for ph in table.chunks_exact(ph_size) {
        if u32_at(ph, 0) != PT_NOTE {
            continue;
        }
        let (offset, size) = (u64_at(ph, 8), u64_at(ph, 32));
        // a note segment is small; a huge one is a damaged file
        if size > 1 << 20 {
            continue;
        }
        let notes = read_at(offset, usize::try_from(size).ok()?)?;
        let mut at = 0usize;
        while at + 12 <= notes.len() {
            let name_len = u32_at(&notes, at) as usize;
            let desc_len = u32_at(&notes, at + 4) as usize;
            let kind = u32_at(&notes, at + 8);
            let name_at = at + 12;
            let desc_at = name_at.checked_add(name_len.checked_add(3)? & !3)?;
            let end = desc_at.checked_add(desc_len.checked_add(3)? & !3)?;
            if desc_at + desc_len > notes.len() {
                break;
            }
            if kind == NT_GNU_BUILD_ID
                && notes[name_at..name_at + name_len] == *b"GNU\0"
                && desc_len > 0
            {
                let desc = &notes[desc_at..desc_at + desc_len];
                return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
            }
            at = end;
        }
    }
    None
}

/// A line saying which builds and levels made `items` (`None` where one
/// made them all): how many items each made, those made before records
/// named it counted apart. A table of items from more than one may hold,
/// on a near-tie item, a token that another build would have chosen.
pub fn mixed_note<'a>(made_by: impl Iterator<Item = Option<&'a MadeBy>>) -> Option<String> {
    let mut counts: Vec<(Option<&MadeBy>, usize)> = Vec::new();
    for m in made_by {
        match counts.iter_mut().find(|(k, _)| *k == m) {
            Some((_, n)) => *n += 1,
            None => counts.push((m, 1)),
        }
    }
    if counts.len() <= 1 {
        return None;
    }
    counts.sort();
    let parts: Vec<String> = counts
        .iter()
        .map(|(m, n)| match m {
            Some(m) => format!("{n} by {m}"),
            None => format!("{n} by a build that did not record itself"),
        })
        .collect();
    Some(format!(
        "Made by {} builds or instruction-set levels: {}. Each item is one build's whole \
         computation; another build or level rounds differently, which can change a token \
         where two were nearly tied.",
        counts.len(),
        parts.join(", ")
    ))
}

/// A line naming the builds and levels of `made_by` when there are several
/// (a result merged from shards that ran on other builds or CPUs); `None`
/// for one or none.
pub fn several_note(made_by: &[MadeBy]) -> Option<String> {
    (made_by.len() > 1).then(|| {
        let names: Vec<String> = made_by.iter().map(MadeBy::to_string).collect();
        format!(
            "Made by {} builds or instruction-set levels: {}. Shards of one run give its \
             result exactly only from one; another rounds differently, which can change a \
             token where two were nearly tied.",
            made_by.len(),
            names.join("; ")
        )
    })
}

/// Said when a run resumes a journal some of whose items `made_by` did not
/// make: how many, and what that means for the table. `None` when this
/// build and level made them all.
pub fn resume_note<'a>(
    made_by: impl Iterator<Item = Option<&'a MadeBy>>,
    current: &MadeBy,
) -> Option<String> {
    let (mut other, mut all) = (0, 0);
    for m in made_by {
        all += 1;
        other += usize::from(m != Some(current));
    }
    (other > 0).then(|| {
        format!(
            "{other} of the {all} items already journaled were made by another build or \
             instruction-set level than this one ({current}), or by one that did not record \
             itself: the table will say so; such an item rerun now could differ by a token \
             where two were nearly tied"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_build_is_named_by_its_build_id() {
        let file = own_file().expect("the test binary is mapped");
        let id = gnu_build_id(&file).expect("the linker writes a build ID");
        assert!(
            id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit()),
            "{id}"
        );
        let made = MadeBy::current();
        assert!(made.build.ends_with(&id[..16]), "{made}");
        assert_eq!(MadeBy::current(), made);
        eprintln!("this test binary: {made}");
    }

    #[test]
    fn files_that_are_not_elf_or_are_cut_short_have_no_build_id() {
        let dir = tempfile::tempdir().unwrap();
        let own = std::fs::read(own_file().unwrap()).unwrap();
        for (name, bytes) in [
            ("empty", Vec::new()),
            ("text", b"not an ELF file at all, just text".repeat(4)),
            ("header only", own[..64].to_vec()),
            ("cut", own[..200].to_vec()),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(gnu_build_id(&path), None, "{name}");
        }
        assert_eq!(gnu_build_id(&dir.path().join("missing")), None);
    }

    #[test]
    fn one_build_makes_no_note_and_several_are_counted() {
        let a = MadeBy {
            build: "lcut 0.1.0 aaaa".into(),
            isa: "avx2".into(),
        };
        let b = MadeBy {
            isa: "avx512".into(),
            ..a.clone()
        };
        assert_eq!(mixed_note([Some(&a), Some(&a)].into_iter()), None);
        assert_eq!(mixed_note(std::iter::empty()), None);
        let note = mixed_note([Some(&a), None, Some(&b), Some(&a)].into_iter()).unwrap();
        assert!(note.contains("Made by 3 builds"), "{note}");
        assert!(note.contains("2 by lcut 0.1.0 aaaa on avx2"), "{note}");
        assert!(note.contains("1 by lcut 0.1.0 aaaa on avx512"), "{note}");
        assert!(
            note.contains("1 by a build that did not record itself"),
            "{note}"
        );
    }

    #[test]
    fn several_builds_of_a_merged_result_are_named() {
        let a = MadeBy::current();
        let b = MadeBy {
            isa: "portable".into(),
            ..a.clone()
        };
        assert_eq!(several_note(&[]), None);
        assert_eq!(several_note(std::slice::from_ref(&a)), None);
        let note = several_note(&[a.clone(), b.clone()]).unwrap();
        assert!(note.starts_with("Made by 2 builds"), "{note}");
        assert!(
            note.contains(&a.to_string()) && note.contains(&b.to_string()),
            "{note}"
        );
        assert!(!note.contains("  "), "{note}");
    }

    #[test]
    fn a_resume_names_the_items_another_build_made() {
        let here = MadeBy::current();
        let other = MadeBy {
            build: "lcut 0.0.9 0123456789abcdef".into(),
            ..here.clone()
        };
        assert_eq!(resume_note([Some(&here)].into_iter(), &here), None);
        let note = resume_note([Some(&here), Some(&other), None].into_iter(), &here).unwrap();
        assert!(note.starts_with("2 of the 3 items"), "{note}");
        assert!(note.contains(&here.to_string()), "{note}");
        assert!(!note.contains("  "), "{note}");
    }
}
