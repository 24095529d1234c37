//! A byte buffer whose start is aligned to a cache line, so that the
//! 32-byte loads of the interleaved kernels never straddle two lines.

#![allow(unsafe_code)]

/// One cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `len` bytes starting on a 64-byte boundary, zero-filled when made.
#[derive(Clone, Default)]
pub(crate) struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

impl std::fmt::Debug for AlignedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBytes")
            .field("len", &self.len)
            .finish()
    }
}

impl AlignedBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self {
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }

    /// `len` zero bytes in place of what was held, keeping the allocation.
    pub fn reset(&mut self, len: usize) {
        self.lines.clear();
        self.lines.resize(len.div_ceil(64), Line([0; 64]));
        self.len = len;
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `lines` holds `lines.len() * 64 >= len` initialised bytes
        // (a `Line` is a plain byte array with no padding), borrowed for the
        // lifetime of `&self`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    /// The bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, borrowed mutably and exclusively through
        // `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<u8>(), self.len) }
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_start_on_a_cache_line_and_keep_their_length() {
        for len in [0, 1, 63, 64, 65, 1000] {
            let mut b = AlignedBytes::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice()
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = i as u8);
            assert!(b.as_slice().iter().enumerate().all(|(i, &x)| x == i as u8));
            b.reset(len / 2);
            assert_eq!(b.len(), len / 2);
            assert_eq!(b.as_slice().as_ptr() as usize % 64, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
    }
}
