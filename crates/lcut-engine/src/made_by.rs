//! Which code is running: the build of lcut (named by its GNU build ID)
//! and the instruction-set level its kernels run at, as a [`MadeBy`] to
//! record with what it makes ([`current`]). The record and the notes that
//! name several are lcut-trace's ([`lcut_trace::made_by`]), re-exported
//! here.
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

pub use lcut_trace::made_by::{MadeBy, mixed_note, resume_note, several_note, union};

/// This process's build and the level its kernels run at.
pub fn current() -> MadeBy {
    MadeBy {
        build: build().to_string(),
        isa: lcut_kernels::Isa::detect().name().to_string(),
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
        let made = current();
        assert!(made.build.ends_with(&id[..16]), "{made}");
        assert_eq!(current(), made);
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
}
