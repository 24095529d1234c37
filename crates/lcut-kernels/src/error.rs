//! What can go wrong when a kernel is handed slices that do not fit together.

use thiserror::Error;

/// A shape or length that does not fit the kernel it was given to.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// A buffer's length is not the one its shape asks for.
    #[error("{what}: expected {expected} elements, got {got}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Elements (or bytes) the shape needs.
        expected: usize,
        /// Elements (or bytes) given.
        got: usize,
    },
    /// A row length that the format's blocks do not divide.
    #[error("{format}: a row of {cols} values is not a whole number of {block}-value blocks")]
    PartialBlock {
        /// The format's name.
        format: &'static str,
        /// Values per row.
        cols: usize,
        /// Values per block of the format.
        block: usize,
    },
    /// An inconsistent head layout (query heads not a multiple of K/V heads,
    /// a rotary width larger than the head, an odd rotary width...).
    #[error("head layout: {0}")]
    Heads(String),
    /// A list of cache rows that leaves the cache or is not ascending.
    #[error("cache rows {start}..{end} are not inside a cache of {len} rows in ascending order")]
    Rows {
        /// First row of the offending span.
        start: usize,
        /// End (exclusive) of the offending span.
        end: usize,
        /// Rows the cache holds.
        len: usize,
    },
    /// A product asked of a format or CPU that has no kernel for it.
    #[error("{0}")]
    Unsupported(String),
    /// More activation rows than a batched product takes.
    #[error("a batched product takes at most {max} activation rows, got {got}")]
    TooManyRows {
        /// Largest batch.
        max: usize,
        /// Rows given.
        got: usize,
    },
}

/// Results of the kernels' checked entry points.
pub type Result<T> = std::result::Result<T, KernelError>;

/// `Err(Length)` unless `got == expected`.
pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Length {
            what,
            expected,
            got,
        })
    }
}
