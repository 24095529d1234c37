//! Layers with a recurrence instead of attention (Qwen3.5's linear-attention
//! layers, Gated DeltaNet): a layer that keeps no K/V but a fixed-size state
//! every token it runs updates, and a short causal convolution over the
//! tokens before it.
//!
//! What a policy means on such a layer, in one place:
//!
//! - **A recurrent layer runs over the tokens that exist there, in order.**
//!   Masking cannot take a token out of a recurrence or a convolution, so a
//!   token a policy hides at a layer must not run it: at or above SPEED's
//!   cut a recurrent layer runs over the anchors and the decode-phase tokens
//!   only (its convolution and state never see a prompt token), so the
//!   prompt costs no compute there; below the cut it runs as the model does.
//!   The token that exists at a layer ([`crate::Visibility::token_exists`])
//!   is the one that runs it.
//! - **A token enters the state the later tokens read where those read it**
//!   ([`RecurrentLayers::enters_state`]): every token that exists there
//!   under the full model and SPEED; under SelfOnly above the cut only the
//!   anchors, and each decode-phase token runs the layer from the anchors'
//!   state, alone, and leaves it as it was (its own output reads the anchors
//!   and itself, as its attention would).
//! - **State, not K/V**: a recurrent layer holds a fixed number of values
//!   whatever the prompt's length (the convolution's last inputs and one
//!   key x value matrix per value head), counted apart from K/V
//!   ([`RecurrentLayers::state_bytes`]); K/V held counts the attention
//!   layers only. SPEED saves prompt compute on a recurrent layer above the
//!   cut but no memory: its state has the same size either way.
//! - **The decode phase reads the state of the tokens its queries see**
//!   ([`RecurrentLayers::decode_reads_anchors`]): where the first
//!   decode-phase query sees only the anchors of a prompt that ran the layer
//!   (a knockout band's recurrent layer: the prompt runs it for its own rows,
//!   as its attention layers' prompt rows read the whole prompt), the state
//!   the prompt left is set back to the anchors' at the decode start, so the
//!   prompt stays out of the decode tokens' state as it stays out of their
//!   attention. Two recurrences, one after the other: the prompt's, then the
//!   anchors' and the decode phase's. A run that may set a state back keeps
//!   the state as the first token left it ([`RecurrentLayers::keeps_first_state`]).
//! - **Which policies run** ([`RecurrentLayers::check`]): the full model,
//!   SPEED (with any anchors), SelfOnly and knockout bands. Kept heads (a
//!   recurrent layer has no K/V heads), SlimInfer and the presses (they
//!   choose a layer's K/V rows from its keys or queries), SwiftKV/POP (they
//!   project K/V into a layer a token leaves) and registered families (their
//!   rule is not known to be one of the above) are refused by name.

use crate::error::PolicyError;
use crate::policy::{Policy, PolicyKind};
use crate::visibility::Visibility;

/// Which layers of a model are recurrent, and the values each one's state
/// holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecurrentLayers {
    /// Per layer, the values of its state (0: an attention layer).
    state_values: Vec<usize>,
}

impl RecurrentLayers {
    /// No layer of `num_layers` is recurrent.
    pub fn none(num_layers: usize) -> Self {
        Self {
            state_values: vec![0; num_layers],
        }
    }

    /// Layer `l` is recurrent with a state of `state_values[l]` values
    /// where that is positive.
    pub fn new(state_values: Vec<usize>) -> Self {
        Self { state_values }
    }

    /// Whether layer `l` is recurrent.
    pub fn is_recurrent(&self, l: usize) -> bool {
        self.state_values.get(l).is_some_and(|&v| v > 0)
    }

    /// Whether any layer is recurrent.
    pub fn any(&self) -> bool {
        self.state_values.iter().any(|&v| v > 0)
    }

    /// Whether the token at `pos`, running recurrent layer `l`, enters the
    /// state that the later tokens there read: the next position's query
    /// reads it (every existing token under the full model and SPEED; only
    /// the anchors above SelfOnly's cut).
    pub fn enters_state(rule: &dyn Visibility, l: usize, pos: usize) -> bool {
        rule.key_visible(l, pos + 1, pos)
            // the prompt's last token at a band's layer: the decode phase
            // reads the anchors' state there whatever the prompt left, and a
            // prompt whose tokens all enter runs in chunks
            || (pos + 1 == rule.phases().decode_start()
                && Self::decode_reads_anchors(rule, l).is_some())
    }

    /// Where the decode phase at recurrent layer `l` reads the state of the
    /// prompt's anchors only although the prompt ran the layer: `Some(n)`,
    /// the first decode-phase query seeing the first `n` tokens and no
    /// later prompt token while the prompt's last token ran the layer (a
    /// knockout band's layer: the state the prompt left is set back to the
    /// anchors' at the decode start); `None` where the decode phase reads the
    /// state as the prompt left it (the full model; SPEED and SelfOnly, whose
    /// prompt does not run a layer it hides).
    pub fn decode_reads_anchors(rule: &dyn Visibility, l: usize) -> Option<usize> {
        let start = rule.phases().decode_start();
        let last = start.checked_sub(1)?;
        if !rule.token_exists(l, last) || rule.key_visible(l, start, last) {
            return None;
        }
        Some(
            (0..start)
                .take_while(|&p| rule.key_visible(l, start, p))
                .count(),
        )
    }

    /// Whether a run of `policy` keeps each recurrent layer's state as the
    /// first token left it: a full-depth run (which a sweep may restrict to
    /// SPEED with BoS) and a knockout band (whose decode phase reads BoS's
    /// state at the band's layers, [`RecurrentLayers::decode_reads_anchors`]).
    pub fn keeps_first_state(policy: &Policy) -> bool {
        policy.is_full_depth() || matches!(policy.kind(), PolicyKind::Band { .. })
    }

    /// Refuse `policy` on a model with recurrent layers where its meaning
    /// there is not defined (module docs); every policy runs where no layer
    /// is recurrent.
    pub fn check(&self, policy: &Policy) -> Result<(), PolicyError> {
        match self.any() {
            true => Self::check_policy(policy),
            false => Ok(()),
        }
    }

    /// Why kept K/V heads are refused on a model with recurrent layers.
    pub const HEADS_REASON: &'static str = "a recurrent layer has no K/V heads to keep";

    /// Refuse kept K/V heads (a K/V budget's plans) on a model with
    /// recurrent layers, before any plan is made; `what` names the request.
    pub fn check_kept_heads(&self, what: &str) -> Result<(), PolicyError> {
        match self.any() {
            true => Err(PolicyError::RecurrentPolicy {
                policy: what.into(),
                reason: Self::HEADS_REASON.into(),
            }),
            false => Ok(()),
        }
    }

    /// Refuse `policy` where its meaning on a recurrent layer is not
    /// defined (module docs), for a model known to have one.
    pub fn check_policy(policy: &Policy) -> Result<(), PolicyError> {
        let why = match policy.kind() {
            _ if policy.heads().is_some() => Some(Self::HEADS_REASON),
            PolicyKind::Full
            | PolicyKind::Speed
            | PolicyKind::SelfOnly
            | PolicyKind::Band { .. } => None,
            PolicyKind::Slim => Some("SlimInfer chooses a layer's K/V rows from its keys"),
            PolicyKind::Projected(_) => Some("it projects K/V into layers a token leaves"),
            PolicyKind::Press(_) => Some("a press chooses what each layer's K/V cache keeps"),
            PolicyKind::Custom(_) => Some("a registered family's rule is not known to hold"),
        };
        match why {
            None => Ok(()),
            Some(reason) => Err(PolicyError::RecurrentPolicy {
                policy: policy.to_string(),
                reason: reason.into(),
            }),
        }
    }

    /// Bytes the recurrent layers' states hold once a token has run each
    /// (f32 values, `4` bytes each): `tokens_at(l)` says whether any token
    /// has run layer `l`.
    pub fn state_bytes(&self, tokens_at: impl Fn(usize) -> bool) -> u64 {
        self.state_values
            .iter()
            .enumerate()
            .filter(|&(l, &v)| v > 0 && tokens_at(l))
            .map(|(_, &v)| 4 * v as u64)
            .sum()
    }

    /// Bytes the recurrent layers' states hold under `rule` once `len`
    /// tokens have run: each recurrent layer where one of them exists.
    pub fn held_bytes(&self, rule: &dyn Visibility, len: usize) -> u64 {
        self.state_bytes(|l| (0..len).any(|p| rule.token_exists(l, p)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TokenPhases;

    fn parse(text: &str) -> Policy {
        text.parse::<crate::PolicySpec>()
            .unwrap()
            .resolve(8)
            .unwrap()
    }

    /// Qwen3.5's tiny layout: layers 3 and 7 attend, the others recur.
    fn hybrid() -> RecurrentLayers {
        RecurrentLayers::new(vec![10, 10, 10, 0, 10, 10, 10, 0])
    }

    #[test]
    fn speed_and_selfonly_run_and_the_others_are_refused_by_name() {
        let r = hybrid();
        for ok in [
            "full",
            "speed:4+bos",
            "speed:2",
            "selfonly:5+bos",
            "speed:3+system",
            "band:1..3",
            "knockout:2",
        ] {
            r.check(&parse(ok)).expect(ok);
        }
        for bad in ["snapkv:0.5", "swiftkv:3", "slim:2@50%"] {
            let p = parse(bad);
            let err = r.check(&p).expect_err(bad).to_string();
            assert!(
                err.contains("recurrent") && err.contains(bad),
                "{bad}: {err}"
            );
            RecurrentLayers::none(8).check(&p).expect(bad);
        }
        // a K/V budget's kept heads are refused before any plan is made
        let err = r.check_kept_heads("--kv-budget").unwrap_err().to_string();
        assert!(err.contains("--kv-budget") && err.contains(RecurrentLayers::HEADS_REASON));
        RecurrentLayers::none(8)
            .check_kept_heads("--kv-budget")
            .unwrap();
    }

    #[test]
    fn which_tokens_enter_the_state() {
        // 12 prompt tokens, the decode phase from 10, BoS kept
        let phases = TokenPhases::new(12, 10, 1).unwrap();
        let speed = parse("speed:4+bos").visibility(phases);
        // below the cut every token; above, the anchors and the decode phase
        assert!(RecurrentLayers::enters_state(speed.as_ref(), 2, 5));
        assert!(RecurrentLayers::enters_state(speed.as_ref(), 5, 0));
        assert!(RecurrentLayers::enters_state(speed.as_ref(), 5, 10));
        assert!(!speed.token_exists(5, 5));
        // above SelfOnly's cut a decode-phase token leaves the state as it was
        let selfonly = parse("selfonly:4+bos").visibility(phases);
        assert!(RecurrentLayers::enters_state(selfonly.as_ref(), 5, 0));
        assert!(!RecurrentLayers::enters_state(selfonly.as_ref(), 5, 10));
        assert!(RecurrentLayers::enters_state(selfonly.as_ref(), 2, 10));
    }

    #[test]
    fn a_band_s_decode_phase_reads_the_anchors_state_and_the_others_what_the_prompt_left() {
        // 12 prompt tokens, the decode phase from 10, BoS kept
        let phases = TokenPhases::new(12, 10, 1).unwrap();
        let reads = |text: &str, l: usize| {
            RecurrentLayers::decode_reads_anchors(parse(text).visibility(phases).as_ref(), l)
        };
        // in the band BoS alone; below and above it, the whole prompt
        assert_eq!(reads("band:2..4", 3), Some(1));
        assert_eq!(reads("knockout:5", 5), Some(1));
        assert_eq!(reads("band:2..4", 1), None);
        assert_eq!(reads("band:2..4", 5), None);
        // no anchor: the state starts from zero
        let bare = TokenPhases::new(12, 10, 0).unwrap();
        let band = parse("band:2..4").visibility(bare);
        assert_eq!(
            RecurrentLayers::decode_reads_anchors(band.as_ref(), 3),
            Some(0)
        );
        // SPEED and SelfOnly's prompt never ran a layer it hides; full reads it all
        for other in ["full", "speed:4+bos", "speed:4", "selfonly:4+bos"] {
            for l in 0..8 {
                assert_eq!(reads(other, l), None, "{other} at {l}");
            }
        }
        // no prompt, nothing to set back
        let all = parse("band:2..4").visibility(TokenPhases::all_decode());
        assert_eq!(RecurrentLayers::decode_reads_anchors(all.as_ref(), 3), None);
        assert!(RecurrentLayers::keeps_first_state(&parse("band:2..4")));
        assert!(RecurrentLayers::keeps_first_state(&parse("full")));
        assert!(!RecurrentLayers::keeps_first_state(&parse("speed:4+bos")));
    }

    #[test]
    fn state_bytes_are_fixed_per_layer_that_ran() {
        let r = hybrid();
        let full = Policy::full(8).visibility(TokenPhases::all_decode());
        assert_eq!(r.held_bytes(full.as_ref(), 1), 6 * 40);
        assert_eq!(r.held_bytes(full.as_ref(), 100), 6 * 40);
        assert_eq!(r.held_bytes(full.as_ref(), 0), 0);
        // anchor-free SPEED before the decode phase: no token above the cut
        let phases = TokenPhases::new(12, 10, 0).unwrap();
        let speed = parse("speed:4").visibility(phases);
        assert_eq!(r.held_bytes(speed.as_ref(), 10), 3 * 40);
        assert_eq!(r.held_bytes(speed.as_ref(), 11), 6 * 40);
    }
}
