//! What a policy can do, asked instead of its kind.

use serde::{Deserialize, Serialize};

/// What a policy can do, asked instead of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Visibility follows from the token phases alone (no decisions taken
    /// while the sequence runs).
    pub is_static: bool,
    /// The whole prompt must pass some layers before any prompt token goes
    /// on (decisions at stage cuts).
    pub needs_staged_prefill: bool,
    /// A training mask exists: the adapters' trainer can train under it.
    pub trainable: bool,
    /// A full-depth prefill of the prompt restricted to what the policy
    /// keeps is this policy's own prefill (lower layers are the full
    /// model's, upper layers keep a subset): sweeps reuse one prefill.
    pub reuses_full_prefill: bool,
}

impl Capabilities {
    /// A static rule with a training mask whose upper layers keep a subset
    /// of the full model's keys (SPEED, SelfOnly, the full model).
    pub const STATIC_SUBSET: Self = Self {
        is_static: true,
        needs_staged_prefill: false,
        trainable: true,
        reuses_full_prefill: true,
    };
}
