//! K/V shared between layers (Gemma 4's `num_kv_shared_layers`): a layer
//! that stores no K/V of its own and reads an earlier layer's.
//!
//! What a policy means on such a model, in one place:
//!
//! - **A layer that reads another layer's K/V follows the rule of the layer
//!   that reads.** The keys a query at layer `l` reads are those
//!   [`crate::Visibility::key_visible`] shows at `l`, wherever they were
//!   computed: above the cut a decode-phase query reads no prompt key even
//!   when the layer it reads (below the cut) holds the whole prompt. The key
//!   planner therefore never takes a shared cache, checked against other
//!   layers' rules, as a layer's answer whole
//!   ([`crate::KeyQuery::own_rows`]).
//! - **The source layer keeps what any of its readers reads**: a row stays
//!   in its cache while the rule of the source or of one of the layers that
//!   read it retains it ([`KvSharing::retains`]), so no reader loses a key
//!   its own rule shows.
//! - **K/V held counts each stored tensor once**: a reading layer holds
//!   nothing ([`KvSharing::stores`]), and the cost model counts only the
//!   layers that store ([`KvSharing::stored_layers`]).
//! - **Which policies run** ([`KvSharing::check`]): the full model, SPEED,
//!   SelfOnly and knockout bands (each a rule of which keys a query reads,
//!   applied at the reading layer). Policies that decide per layer what a
//!   cache keeps from that layer's own keys or queries (presses, SlimInfer,
//!   kept heads), project K/V into a layer (SwiftKV, POP), or come from a
//!   registered family are refused by name: a shared cache holds one
//!   layer's K/V for several layers' rules, and their meaning there is not
//!   defined yet.

use crate::error::PolicyError;
use crate::policy::{Policy, PolicyKind};
use crate::visibility::Visibility;
use crate::window::{LayerWindows, held_positions, window_of};

/// One layer's K/V row: its K/V heads and head width (Gemma 4's layers
/// differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKvShape {
    /// K/V heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// Which layer's K/V each layer reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvSharing {
    /// Per layer, the earlier layer whose K/V it reads (`None`: its own).
    source: Vec<Option<usize>>,
}

impl KvSharing {
    /// Every one of `num_layers` layers reads its own K/V.
    pub fn none(num_layers: usize) -> Self {
        Self {
            source: vec![None; num_layers],
        }
    }

    /// Layer `l` reads the K/V of `sources[l]` where it is `Some`; each
    /// source must be an earlier layer that stores its own.
    pub fn new(sources: Vec<Option<usize>>) -> Result<Self, PolicyError> {
        for (l, s) in sources.iter().enumerate() {
            if let Some(s) = *s
                && (s >= l || sources[s].is_some())
            {
                return Err(PolicyError::SharedKv { layer: l, from: s });
            }
        }
        Ok(Self { source: sources })
    }

    /// Depth of the model.
    pub fn num_layers(&self) -> usize {
        self.source.len()
    }

    /// The layer whose cache layer `l` reads: its source, or itself.
    pub fn source(&self, l: usize) -> usize {
        self.source.get(l).copied().flatten().unwrap_or(l)
    }

    /// Whether layer `l` stores K/V of its own.
    pub fn stores(&self, l: usize) -> bool {
        self.source.get(l).is_none_or(Option::is_none)
    }

    /// Whether any layer reads another layer's K/V.
    pub fn any(&self) -> bool {
        self.source.iter().any(Option::is_some)
    }

    /// The layers that read the cache of layer `src`: `src` itself (when it
    /// stores) and every layer that shares it.
    pub fn readers(&self, src: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.source.len()).filter(move |&l| self.source(l) == src && self.stores(src))
    }

    /// Whether layer `l` reads a cache kept by its own rule alone: its own,
    /// read by no other layer.
    pub fn kept_by_own_rule(&self, l: usize) -> bool {
        self.stores(l) && self.readers(l).count() == 1
    }

    /// How many layers store K/V.
    pub fn stored_layers(&self) -> usize {
        (0..self.source.len()).filter(|&l| self.stores(l)).count()
    }

    /// Whether the cache of layer `src` keeps the row at `pos`: the rule of
    /// `src` or of a layer that reads it retains it.
    pub fn retains(&self, rule: &dyn Visibility, src: usize, pos: usize) -> bool {
        self.readers(src).any(|l| rule.retains_kv(l, pos))
    }

    /// [`Self::retains`] for K/V head `kv_head`.
    pub fn head_retains(
        &self,
        rule: &dyn Visibility,
        src: usize,
        kv_head: usize,
        pos: usize,
    ) -> bool {
        self.readers(src)
            .any(|l| rule.head_retains_kv(l, kv_head, pos))
    }

    /// Why kept K/V heads are refused on a model whose layers share K/V.
    pub const HEADS_REASON: &'static str = "it keeps K/V heads per layer";

    /// Refuse kept K/V heads (a K/V budget's plans) on a model whose layers
    /// share K/V, before any plan is made; `what` names the request.
    pub fn check_kept_heads(&self, what: &str) -> Result<(), PolicyError> {
        match self.any() {
            true => Err(PolicyError::SharedKvPolicy {
                policy: what.into(),
                reason: Self::HEADS_REASON.into(),
            }),
            false => Ok(()),
        }
    }

    /// Refuse `policy` on a model whose layers share K/V where its meaning
    /// there is not defined (module docs); every policy runs where no layer
    /// shares.
    pub fn check(&self, policy: &Policy) -> Result<(), PolicyError> {
        if !self.any() {
            return Ok(());
        }
        let why = match policy.kind() {
            _ if policy.heads().is_some() => Some(Self::HEADS_REASON),
            PolicyKind::Full | PolicyKind::Speed | PolicyKind::SelfOnly => None,
            PolicyKind::Band { .. } => None,
            PolicyKind::Slim => Some("SlimInfer decides at its cuts from one layer's keys"),
            PolicyKind::Projected(_) => Some("it projects K/V into layers that store none"),
            PolicyKind::Press(_) => Some("a press decides what each layer's cache keeps"),
            PolicyKind::Custom(_) => Some("a registered family's rule is not known to hold"),
        };
        match why {
            None => Ok(()),
            Some(reason) => Err(PolicyError::SharedKvPolicy {
                policy: policy.to_string(),
                reason: reason.into(),
            }),
        }
    }

    /// Bytes of K/V the caches hold under `rule` once `len` tokens have run,
    /// for layers of `shapes` (one per layer) and `windows`, stored in
    /// `dtype_bytes`: each storing layer's rows (those it or a layer that
    /// reads it retains, within its window; per K/V head where the heads
    /// keep different rows) times its own row's bytes, each stored tensor
    /// once. The cost model of a model whose layers differ in shape or share
    /// K/V (Gemma 4); on any other it is the uniform formula's count.
    pub fn held_bytes(
        &self,
        rule: &dyn Visibility,
        len: usize,
        shapes: &[LayerKvShape],
        windows: &LayerWindows,
        dtype_bytes: usize,
    ) -> u64 {
        (0..self.num_layers())
            .filter(|&l| self.stores(l))
            .map(|l| {
                let shape = shapes.get(l).copied().unwrap_or(LayerKvShape {
                    kv_heads: 0,
                    head_dim: 0,
                });
                let positions = held_positions(window_of(windows, l), len);
                let rows = match self.heads_differ(rule, l) {
                    true => (0..shape.kv_heads)
                        .map(|h| {
                            positions
                                .clone()
                                .filter(|&p| self.head_retains(rule, l, h, p))
                                .count()
                        })
                        .sum(),
                    false => {
                        positions.filter(|&p| self.retains(rule, l, p)).count() * shape.kv_heads
                    }
                };
                (rows * 2 * shape.head_dim * dtype_bytes) as u64
            })
            .sum()
    }

    /// Whether the K/V heads of layer `src`'s cache keep different rows:
    /// those of any of its readers do.
    pub fn heads_differ(&self, rule: &dyn Visibility, src: usize) -> bool {
        self.readers(src).any(|l| rule.heads_differ(l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TokenPhases;
    use crate::policy::{Anchors, Policy, PolicyKind};

    fn speed(l_cut: usize) -> Box<dyn Visibility> {
        // 12 prompt tokens, the decode phase from 10, BoS kept
        let phases = TokenPhases::new(12, 10, 1).unwrap();
        Policy::new(PolicyKind::Speed, l_cut, 6, Anchors::Bos)
            .unwrap()
            .visibility(phases)
    }

    /// Gemma 4's tiny layout: layers 4 and 5 read layers 3 and 2.
    fn shared() -> KvSharing {
        KvSharing::new(vec![None, None, None, None, Some(3), Some(2)]).unwrap()
    }

    #[test]
    fn masks_run_and_per_layer_decisions_are_refused_by_name() {
        let s = shared();
        for ok in ["full", "speed:4+bos", "selfonly:2", "band:1..3"] {
            let p: Policy = ok.parse::<crate::PolicySpec>().unwrap().resolve(6).unwrap();
            s.check(&p).expect(ok);
        }
        for bad in ["snapkv:0.5", "swiftkv:3", "slim:2@50%"] {
            let p: Policy = bad
                .parse::<crate::PolicySpec>()
                .unwrap()
                .resolve(6)
                .unwrap();
            let err = s.check(&p).expect_err(bad).to_string();
            assert!(err.contains("share K/V"), "{bad}: {err}");
            KvSharing::none(6).check(&p).expect(bad);
        }
    }

    #[test]
    fn held_bytes_count_each_stored_tensor_once_at_its_own_width() {
        let s = shared();
        let narrow = LayerKvShape {
            kv_heads: 2,
            head_dim: 16,
        };
        let wide = LayerKvShape {
            kv_heads: 1,
            head_dim: 32,
        };
        let shapes = [narrow, narrow, wide, narrow, narrow, wide];
        let windows = vec![Some(4), Some(4), None, Some(4), Some(4), None];
        // 12 tokens, full model: sliding layers 0, 1, 3 hold 3 rows (a
        // window of 4 once 12 have run), layer 2 all 12; layers 4, 5 nothing
        let full = Policy::full(6).visibility(TokenPhases::all_decode());
        let row = 2 * 16 * 2 * 4;
        assert_eq!(
            s.held_bytes(full.as_ref(), 12, &shapes, &windows, 4),
            (3 * 3 * row + 12 * 2 * 32 * 4) as u64
        );
        // SPEED at 2 of 6 with BoS (prompt 0..10, decode from 10): layer 2
        // (above the cut, read by layer 5 also above it) keeps BoS and the
        // two decode-phase tokens
        let low = speed(2);
        let held = s.held_bytes(low.as_ref(), 12, &shapes, &windows, 4);
        // layers 0, 1: 3 rows each; layer 3 (above the cut, window 4): the
        // decode-phase rows 10, 11 in its window; layer 2: rows 0, 10, 11
        assert_eq!(held, (2 * 3 * row + 2 * row + 3 * 2 * 32 * 4) as u64);
    }

    #[test]
    fn readers_and_stored_layers() {
        let s = shared();
        assert_eq!(s.readers(2).collect::<Vec<_>>(), vec![2, 5]);
        assert_eq!(s.readers(3).collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(s.readers(5).count(), 0);
        assert_eq!((s.stored_layers(), s.source(4), s.source(1)), (4, 3, 1));
        assert!(s.kept_by_own_rule(1) && !s.kept_by_own_rule(2) && !s.kept_by_own_rule(4));
        assert!(s.any() && !KvSharing::none(6).any());
    }

    #[test]
    fn a_source_must_be_an_earlier_storing_layer() {
        for bad in [
            vec![None, Some(1)],
            vec![None, Some(2), None],
            vec![None, Some(0), Some(1)],
        ] {
            let err = KvSharing::new(bad.clone()).expect_err("refused");
            assert!(err.to_string().contains("reads the K/V"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_source_keeps_what_its_readers_read_and_the_reader_follows_its_own_rule() {
        // SPEED at 4 of 6 with BoS: layer 3 (below the cut) keeps the
        // prompt, layer 4 reads it but shows a decode query no prompt key
        let rule = speed(4);
        let s = shared();
        assert!(s.retains(rule.as_ref(), 3, 5));
        assert!(!rule.key_visible(4, 12, 5) && rule.key_visible(4, 12, 0));
        // above the cut the source keeps only anchors and the decode phase
        let low = speed(2);
        assert!(!s.retains(low.as_ref(), 2, 5) && s.retains(low.as_ref(), 2, 0));
        assert!(s.retains(low.as_ref(), 2, 11));
    }
}
