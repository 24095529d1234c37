//! lcut's decoder checked against Hugging Face transformers, an outside
//! reference: the reference cases in `fixtures/oracle` (a tiny model, token
//! ids and transformers' logits at full depth and under SPEED policies),
//! how far our logits are from theirs, what "matches" means in each dtype,
//! and the check `lcut parity` runs on any device and dtype; and the
//! references of the policies defined by masks and of kvpress's presses.

pub mod check;
pub mod deviation;
mod error;
pub mod masked;
pub mod press;
pub mod reference;
pub mod tolerance;

pub use check::{CheckOptions, ParityReport, ParityRow, check_case};
pub use deviation::{Deviation, deviation};
pub use error::{ParityError, Result};
pub use masked::{MaskedPolicy, MaskedReference};
pub use press::{PressPolicy, PressReference};
pub use reference::{FULL_LOGITS, LogitPair, ReferenceCase, ReferencePolicy, STEPPED_LOGITS};
pub use tolerance::{SAME_DTYPE_FACTOR, Tolerance};
