//! A press's running state for one sequence, as a [`Visibility`]: while
//! the prompt runs, every prompt token exists at every layer and its
//! queries read every earlier key (the full model's prefill, as kvpress's
//! context prefill); the press sees the prompt queries it asks for; once
//! the prompt has run, each layer's decision from its prompt K/V says which
//! prompt positions each K/V head keeps, and decode-phase queries read
//! those and the decode phase. The K/V held is the press's formula, known
//! before any decision: each K/V head of layer `l` keeps `n_kept(l)` prompt
//! positions. A sliding-window layer the press leaves as the model holds it
//! (kvpress's rule for Gemma 3: its presses compress only the layers that
//! read every earlier key), so such a layer holds its window.

use super::expected::{self, QueryStats};
use super::math::top;
use super::memo::{ScoreMemo, Scoring};
use super::{PressName, PressParams, knorm, snapkv, streaming_llm, tova};
use crate::error::PolicyError;
use crate::phases::TokenPhases;
use crate::query_window::QueryWindow;
use crate::visibility::{DynamicRule, KvAccounting, PromptKv, Visibility};
use crate::window::{LayerWindows, held_positions, window_of};

/// What one layer keeps of the prompt: the same positions for every K/V
/// head, or each head its own (masks over the prompt's positions), or all
/// that the model holds (a sliding-window layer the press leaves whole).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kept {
    Layer(Vec<bool>),
    Heads(Vec<Vec<bool>>),
    Whole,
}

impl Kept {
    /// Whether K/V head `head` keeps prompt position `pos`.
    fn keeps(&self, head: usize, pos: usize) -> bool {
        match self {
            Kept::Layer(k) => k[pos],
            Kept::Heads(k) => k.get(head).is_some_and(|h| h[pos]),
            Kept::Whole => true,
        }
    }

    fn any_head(&self, pos: usize) -> bool {
        match self {
            Kept::Layer(k) => k[pos],
            Kept::Heads(k) => k.iter().any(|h| h[pos]),
            Kept::Whole => true,
        }
    }
}

/// One layer's state: what the press observes of its prompt queries, then
/// what it keeps.
#[derive(Debug, Clone, Default)]
struct LayerState {
    window: QueryWindow,
    stats: QueryStats,
    kept: Option<Kept>,
    /// Per K/V head (one entry when the layer decides for all), the
    /// positions whose score ties the lowest kept one at float precision.
    near_ties: Vec<Vec<usize>>,
}

/// Relative distance to the lowest kept score within which a score ties it
/// at float precision (kvpress scores in f32; lcut in f64 from keys that
/// differ from torch's in their last bits).
const TIE: f64 = 1e-5;

/// The positions of `scores` within [`TIE`] of the lowest of the `kept`
/// highest: among them, which are kept is decided by rounding.
fn near_ties(scores: &[f64], kept: usize) -> Vec<usize> {
    let mut finite: Vec<f64> = scores.iter().copied().filter(|x| x.is_finite()).collect();
    let forced = scores.len() - finite.len();
    if kept <= forced || kept >= scores.len() {
        return Vec::new();
    }
    finite.sort_by(|a, b| b.total_cmp(a));
    let bound = finite[kept - forced - 1];
    let near = |x: f64| (x - bound).abs() <= TIE * bound.abs().max(f64::MIN_POSITIVE);
    let ties: Vec<usize> = (0..scores.len()).filter(|&i| near(scores[i])).collect();
    if ties.len() > 1 { ties } else { Vec::new() }
}

/// What a press reads of the prompt's queries while the prompt runs: the
/// latest query rows of each layer, and the statistics of the queries
/// before RoPE from a first position on. The prompt's own run is the full
/// model's whatever the press, so one run observing the union of what
/// several presses read serves them all ([`PressRun::retarget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PressObservation {
    /// The latest query rows kept per layer (SnapKV's and PyramidKV's
    /// observation window, TOVA's last query).
    pub window: Option<usize>,
    /// Expected Attention's query statistics: the first position they
    /// count (`n_sink`) and whether they keep the covariance.
    pub stats: Option<(usize, bool)>,
}

impl PressObservation {
    /// What the press of `params` reads.
    pub fn of(params: &PressParams) -> Self {
        match params.name {
            PressName::SnapKv | PressName::PyramidKv => Self {
                window: Some(params.window),
                stats: None,
            },
            PressName::Tova => Self {
                window: Some(1),
                stats: None,
            },
            PressName::Expected => Self {
                window: None,
                stats: Some((params.sink, params.covariance)),
            },
            PressName::StreamingLlm | PressName::Knorm => Self::default(),
        }
    }

    /// One observation holding what both read (the wider window), or `None`
    /// where they count query statistics over other spans or settings.
    pub fn union(self, other: Self) -> Option<Self> {
        let stats = match (self.stats, other.stats) {
            (Some(a), Some(b)) if a != b => return None,
            (a, b) => a.or(b),
        };
        let window = match (self.window, other.window) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        Some(Self { window, stats })
    }

    /// Whether this observation holds everything `need` reads.
    pub fn covers(&self, need: &Self) -> bool {
        need.window
            .is_none_or(|w| self.window.is_some_and(|held| held >= w))
            && need.stats.is_none_or(|s| self.stats == Some(s))
    }
}

/// A press's state for one sequence.
#[derive(Debug, Clone)]
pub struct PressRun {
    params: PressParams,
    /// What the run reads of the prompt's queries (the press's own needs,
    /// or more for a run shared by several presses).
    observe: PressObservation,
    phases: TokenPhases,
    num_layers: usize,
    layers: Vec<LayerState>,
    decided: usize,
    /// The model's K/V heads (known from the first decision).
    kv_heads: usize,
    /// Scores shared with the runs forked or retargeted from this one.
    memo: ScoreMemo,
}

impl PressRun {
    /// A fresh run: every prompt position is kept until the prompt has run.
    pub fn new(params: PressParams, phases: TokenPhases, num_layers: usize) -> Self {
        Self {
            params,
            observe: PressObservation::of(&params),
            phases,
            num_layers,
            layers: vec![LayerState::default(); num_layers],
            decided: 0,
            kv_heads: 0,
            memo: ScoreMemo::default(),
        }
    }

    /// A fresh run of `params`' press that observes `observe` of the
    /// prompt's queries, so that its prompt run can [serve](Self::retarget)
    /// every press whose needs that covers; refused where it does not cover
    /// the press's own.
    pub fn observing(
        params: PressParams,
        observe: PressObservation,
        phases: TokenPhases,
        num_layers: usize,
    ) -> Result<Self, PolicyError> {
        let run = Self {
            observe,
            ..Self::new(params, phases, num_layers)
        };
        run.check_serves(&params)?;
        Ok(run)
    }

    /// Whether no layer has decided yet: until then the run holds what the
    /// full model's prefill holds.
    pub fn is_undecided(&self) -> bool {
        self.decided == 0
    }

    /// What this run observes of the prompt's queries.
    pub fn observation(&self) -> PressObservation {
        self.observe
    }

    /// The state `params`' press would have after the same prompt run: the
    /// prompt runs every layer whole for every press, so only what the press
    /// observed differs, and this run's observation holds it (the latest
    /// query rows it reads, the same query statistics). Valid before any
    /// layer has decided.
    pub fn retarget(&self, params: PressParams) -> Result<Self, PolicyError> {
        self.check_serves(&params)?;
        let need = PressObservation::of(&params);
        let layers = self
            .layers
            .iter()
            .map(|s| LayerState {
                window: need
                    .window
                    .map_or_else(Default::default, |w| s.window.latest(w)),
                stats: match need.stats {
                    Some(_) => s.stats.clone(),
                    None => QueryStats::default(),
                },
                kept: None,
                near_ties: Vec::new(),
            })
            .collect();
        Ok(Self {
            params,
            observe: need,
            phases: self.phases,
            num_layers: self.num_layers,
            layers,
            decided: 0,
            kv_heads: self.kv_heads,
            memo: self.memo.clone(),
        })
    }

    /// Refuse a press this run's prompt run cannot serve.
    fn check_serves(&self, params: &PressParams) -> Result<(), PolicyError> {
        let refuse = |reason: String| PolicyError::PressShare {
            observer: self.params.to_string(),
            policy: params.to_string(),
            reason,
        };
        if self.decided > 0 {
            return Err(refuse(format!(
                "{} of its layers have decided already",
                self.decided
            )));
        }
        let need = PressObservation::of(params);
        if !self.observe.covers(&need) {
            return Err(refuse(format!(
                "it observes {:?} of the prompt's queries, the press reads {need:?}",
                self.observe
            )));
        }
        Ok(())
    }

    /// The press.
    pub fn params(&self) -> &PressParams {
        &self.params
    }

    /// Prompt positions whose score ties, within a relative 1e-5, the
    /// lowest score K/V head `kv_head` of `layer` keeps (empty when there
    /// are fewer than two): which of them are kept is decided by rounding,
    /// so another implementation of the press may keep others of them
    /// (a layer's repeated tokens have keys of equal norm, for one).
    pub fn near_ties(&self, layer: usize, kv_head: usize) -> &[usize] {
        let ties = self.layers.get(layer).map_or(&[][..], |s| &s.near_ties[..]);
        match ties.len() {
            0 => &[],
            1 => &ties[0],
            _ => ties.get(kv_head).map_or(&[], Vec::as_slice),
        }
    }

    /// Prompt positions K/V head `kv_head` of `layer` keeps, ascending
    /// (`None` before the layer's decision, or for a head the layer does
    /// not have); a layer left whole keeps them all (its window aside).
    pub fn kept_positions(&self, layer: usize, kv_head: usize) -> Option<Vec<usize>> {
        let kept = self.layers.get(layer)?.kept.as_ref()?;
        if let Kept::Heads(heads) = kept
            && kv_head >= heads.len()
        {
            return None;
        }
        Some(
            (0..self.prompt_len())
                .filter(|&p| kept.keeps(kv_head, p))
                .collect(),
        )
    }

    /// Whether the press left `layer` as the model holds it (a sliding
    /// window; [`DynamicRule::leave_layer_whole`]).
    pub fn left_whole(&self, layer: usize) -> bool {
        matches!(self.kept(layer), Some(Kept::Whole))
    }

    fn prompt_len(&self) -> usize {
        self.phases.decode_start()
    }

    fn kept(&self, layer: usize) -> Option<&Kept> {
        self.layers.get(layer).and_then(|s| s.kept.as_ref())
    }

    /// The rule class of `layer` (of one of its K/V heads, `Some`): 0 until
    /// the layer decides, then one of its own.
    fn class(&self, layer: usize, head: Option<usize>) -> usize {
        let stride = self.kv_heads + 1;
        match (self.kept(layer), head) {
            (None, _) => 0,
            (Some(Kept::Heads(_)), Some(h)) => 1 + layer * stride + 1 + h,
            (Some(_), _) => 1 + layer * stride,
        }
    }

    /// The window of latest queries the press reads (SnapKV's observation
    /// window, TOVA's last query), if any.
    fn query_rows(&self) -> Option<usize> {
        self.observe.window
    }

    /// The decision of `layer` from its prompt K/V, and its near ties.
    fn decide(
        &mut self,
        layer: usize,
        kv: &PromptKv<'_>,
    ) -> Result<(Kept, Vec<Vec<usize>>), PolicyError> {
        let p = self.params;
        let n = self.prompt_len();
        let refuse = |reason: String| PolicyError::PromptLayer {
            policy: p.to_string(),
            layer,
            reason,
        };
        let keys = &kv.keys;
        if !keys.positions.iter().copied().eq(0..n) {
            return Err(refuse(format!(
                "it decides from every prompt position 0..{n}, but the layer holds {} of them",
                keys.positions.len()
            )));
        }
        if kv.heads == 0 || keys.kv_heads == 0 || !kv.heads.is_multiple_of(keys.kv_heads) {
            return Err(refuse(format!(
                "{} query heads do not group over {} K/V heads",
                kv.heads, keys.kv_heads
            )));
        }
        p.check_prompt(n, self.num_layers)?;
        let kept = p.kept_at(layer, self.num_layers, n);
        let state = &self.layers[layer];
        // the press's own window: the latest rows of what the run observed
        let own = PressObservation::of(&p).window;
        let seen: Vec<&[f32]> = state.window.rows().map(Vec::as_slice).collect();
        let window = &seen[seen.len().saturating_sub(own.unwrap_or(0))..];
        if let Some(w) = own
            && window.len() != w
        {
            return Err(refuse(format!(
                "it reads the last {w} prompt queries, but saw {}",
                window.len()
            )));
        }
        if p.name == PressName::Expected {
            let seen = state.stats.rows();
            if seen != n - p.sink {
                return Err(refuse(format!(
                    "it reads the queries of prompt positions {}..{n}, but saw {seen}",
                    p.sink
                )));
            }
        }
        let Some(scoring) = Scoring::of(&p) else {
            return Ok((Kept::Layer(streaming_llm::keep(&p, n, kept)), vec![]));
        };
        // the presses of one prompt run that score alike score once
        let scores =
            self.memo
                .get_or_compute::<PolicyError>((scoring, layer), keys.data, || {
                    Ok(match p.name {
                        PressName::SnapKv | PressName::PyramidKv => {
                            snapkv::scores(&p, keys, kv.heads, window)
                        }
                        PressName::Knorm => knorm::scores(keys),
                        PressName::Tova => vec![tova::scores(keys, kv.heads, window[0])],
                        PressName::Expected => expected::scores(&p, kv, &state.stats),
                        PressName::StreamingLlm => unreachable!("StreamingLLM keeps by position"),
                    })
                })?;
        Ok(match p.name {
            // TOVA decides for the whole layer
            PressName::Tova => (
                Kept::Layer(top(&scores[0], kept)),
                vec![near_ties(&scores[0], kept)],
            ),
            _ => (
                Kept::Heads(scores.iter().map(|s| top(s, kept)).collect()),
                scores.iter().map(|s| near_ties(s, kept)).collect(),
            ),
        })
    }
}

impl Visibility for PressRun {
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    fn token_exists(&self, _layer: usize, _pos: usize) -> bool {
        true
    }

    fn retains_kv(&self, layer: usize, pos: usize) -> bool {
        pos >= self.prompt_len() || self.kept(layer).is_none_or(|k| k.any_head(pos))
    }

    /// The prompt's own queries read every earlier key; a decode-phase
    /// query reads what the layer keeps.
    fn key_visible(&self, layer: usize, q: usize, k: usize) -> bool {
        q < self.prompt_len() || self.retains_kv(layer, k)
    }

    fn rule_class(&self, layer: usize) -> usize {
        self.class(layer, None)
    }

    /// The prompt runs every layer whole, as the full model's prefill.
    fn prompt_runs_whole(&self, _layer: usize) -> bool {
        true
    }

    fn heads_differ(&self, layer: usize) -> bool {
        matches!(self.kept(layer), Some(Kept::Heads(_)))
    }

    fn head_retains_kv(&self, layer: usize, kv_head: usize, pos: usize) -> bool {
        pos >= self.prompt_len() || self.kept(layer).is_none_or(|k| k.keeps(kv_head, pos))
    }

    fn head_key_visible(&self, layer: usize, kv_head: usize, q: usize, k: usize) -> bool {
        q < self.prompt_len() || self.head_retains_kv(layer, kv_head, k)
    }

    fn head_rule_class(&self, layer: usize, kv_head: usize) -> usize {
        self.class(layer, Some(kv_head))
    }

    /// A decode-phase query reads what each head keeps (the prompt rows it
    /// kept and every decode-phase row).
    fn reads_what_it_keeps(&self, _layer: usize, q: usize) -> bool {
        q >= self.prompt_len()
    }

    fn dynamic(&self) -> Option<&dyn DynamicRule> {
        Some(self)
    }

    fn dynamic_mut(&mut self) -> Option<&mut dyn DynamicRule> {
        Some(self)
    }
}

impl KvAccounting for PressRun {
    /// The press's formula: each layer `l` holds `n_kept(l)` prompt
    /// positions (per K/V head) and the decode phase.
    fn held_token_layers(&self, decode: usize) -> usize {
        let n = self.prompt_len();
        (0..self.num_layers)
            .map(|l| self.params.kept_at(l, self.num_layers, n) + decode)
            .sum()
    }

    fn held_head_rows(&self, decode: usize, kv_heads: usize) -> usize {
        kv_heads * self.held_token_layers(decode)
    }

    /// The formula where layers slide: a sliding-window layer is left
    /// whole and holds its window, the others `n_kept(l)` prompt positions
    /// and the decode phase.
    fn held_head_rows_windowed(
        &self,
        decode: usize,
        kv_heads: usize,
        windows: &LayerWindows,
    ) -> usize {
        let n = self.prompt_len();
        let rows: usize = (0..self.num_layers)
            .map(|l| match window_of(windows, l) {
                Some(w) => held_positions(Some(w), n + decode).len(),
                None => self.params.kept_at(l, self.num_layers, n) + decode,
            })
            .sum();
        kv_heads * rows
    }

    /// A press sets nothing aside: decode reads what it holds.
    fn resident_head_rows_windowed(
        &self,
        decode: usize,
        kv_heads: usize,
        windows: &LayerWindows,
    ) -> usize {
        self.held_head_rows_windowed(decode, kv_heads, windows)
    }
}

impl DynamicRule for PressRun {
    fn press_run(&self) -> Option<&PressRun> {
        Some(self)
    }

    fn is_decided(&self) -> bool {
        self.decided == self.num_layers
    }

    fn query_window(&self, layer: usize) -> Option<usize> {
        self.kept(layer)
            .is_none()
            .then(|| self.query_rows())
            .flatten()
    }

    fn observe_queries(&mut self, layer: usize, rows: Vec<Vec<f32>>) {
        if let (Some(w), Some(state)) = (self.query_rows(), self.layers.get_mut(layer)) {
            state.window.push(rows, w);
        }
    }

    fn decides_at_prompt_end(&self) -> bool {
        true
    }

    fn wants_unrotated_queries(&self, layer: usize) -> bool {
        self.observe.stats.is_some() && self.kept(layer).is_none()
    }

    fn observe_unrotated_queries(
        &mut self,
        layer: usize,
        heads: usize,
        positions: &[usize],
        rows: &[f32],
    ) {
        let Some((sink, covariance)) = self.observe.stats else {
            return;
        };
        let span = (sink, self.prompt_len());
        if let Some(state) = self.layers.get_mut(layer) {
            state.stats.push(positions, rows, span, (heads, covariance));
        }
    }

    fn decide_at_prompt_end(&mut self, layer: usize, kv: &PromptKv<'_>) -> Result<(), PolicyError> {
        if layer >= self.num_layers || self.kept(layer).is_some() {
            return Ok(());
        }
        let (kept, ties) = self.decide(layer, kv)?;
        self.kv_heads = kv.keys.kv_heads;
        self.settle(layer, kept, ties);
        Ok(())
    }

    fn leave_layer_whole(&mut self, layer: usize) {
        if layer < self.num_layers && self.kept(layer).is_none() {
            self.settle(layer, Kept::Whole, Vec::new());
        }
    }
}

impl PressRun {
    /// Record `layer`'s decision and drop what it observed to take it.
    fn settle(&mut self, layer: usize, kept: Kept, near_ties: Vec<Vec<usize>>) {
        let state = &mut self.layers[layer];
        state.kept = Some(kept);
        state.near_ties = near_ties;
        state.window.clear();
        state.stats = QueryStats::default();
        self.decided += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::visibility::HostKeys;

    fn run(name: PressName, ratio: f64) -> PressRun {
        let p = PressParams {
            sink: 2,
            window: 2,
            kernel: 1,
            ..PressParams::new(name, ratio)
        };
        PressRun::new(p, TokenPhases::new(12, 8, 0).expect("phases"), 3)
    }

    /// Keys of 2 K/V heads, d = 2, positions 0..8: head 0's norms grow
    /// with the position, head 1's shrink.
    fn keys() -> Vec<f32> {
        let mut data = Vec::new();
        for h in 0..2 {
            for p in 0..8 {
                let x = if h == 0 {
                    p as f32 + 1.0
                } else {
                    8.0 - p as f32
                };
                data.extend([x, 0.0]);
            }
        }
        data
    }

    fn decide_all(r: &mut PressRun) -> Result<(), PolicyError> {
        decide_layers(r, &[0, 1, 2])
    }

    /// Hand `layers` of `r` the [`keys`] as their prompt K/V.
    fn decide_layers(r: &mut PressRun, layers: &[usize]) -> Result<(), PolicyError> {
        let data = keys();
        let positions: Vec<usize> = (0..8).collect();
        let kv = PromptKv {
            keys: HostKeys {
                kv_heads: 2,
                head_dim: 2,
                positions: &positions,
                data: &data,
            },
            values: &data,
            heads: 4,
            rope_inv_freq: &[0.5],
        };
        for &l in layers {
            r.decide_at_prompt_end(l, &kv)?;
        }
        Ok(())
    }

    #[test]
    fn knorm_keeps_each_heads_smallest_keys_and_holds_its_formula() {
        let mut r = run(PressName::Knorm, 0.5);
        // before the decision every prompt row is kept and read
        assert!(!r.is_decided() && r.retains_kv(1, 3) && !r.heads_differ(1));
        assert_eq!(r.rule_class(1), 0);
        let formula = r.held_head_rows(4, 2);
        decide_all(&mut r).unwrap();
        assert!(r.is_decided() && r.heads_differ(0));
        assert_eq!(r.kept_positions(0, 0), Some(vec![0, 1, 2, 3]));
        assert_eq!(r.kept_positions(2, 1), Some(vec![4, 5, 6, 7]));
        // the prompt's own queries still read everything; decode reads the kept
        assert!(r.head_key_visible(0, 0, 7, 6));
        assert!(!r.head_key_visible(0, 0, 8, 6) && r.head_key_visible(0, 1, 8, 6));
        assert!(r.head_key_visible(0, 0, 9, 8));
        // counted by position, the rows held are the formula:
        // 3 layers x 2 heads x (4 kept + 4 decode)
        let by_position: usize = (0..3)
            .map(|l| {
                (0..2)
                    .map(|h| (0..12).filter(|&p| r.head_retains_kv(l, h, p)).count())
                    .sum::<usize>()
            })
            .sum();
        assert_eq!((formula, by_position), (48, 48));
        assert_ne!(r.head_rule_class(0, 0), r.head_rule_class(0, 1));
        assert_ne!(r.head_rule_class(0, 0), r.head_rule_class(1, 0));
    }

    #[test]
    fn a_sliding_layer_left_whole_holds_its_window_and_the_formula_says_so() {
        // layer 1 slides over 4 positions (Gemma 3's pattern, kvpress skips it)
        let windows = [None, Some(4), None];
        let mut r = run(PressName::Knorm, 0.5);
        let formula = r.held_head_rows_windowed(4, 2, &windows);
        decide_layers(&mut r, &[0]).unwrap();
        r.leave_layer_whole(1);
        assert!(!r.is_decided());
        decide_layers(&mut r, &[2]).unwrap();
        assert!(r.is_decided() && r.left_whole(1) && !r.left_whole(0));
        // the layer left whole keeps every prompt position (the window drops
        // the old ones), for every head, and its decode queries read them
        assert_eq!(r.kept_positions(1, 1), Some((0..8).collect()));
        assert!(r.head_key_visible(1, 0, 9, 0) && !r.heads_differ(1));
        // 2 heads x [(4 kept + 4 decode) + 3 rows in the window + (4 + 4)]
        let by_position: usize = (0..3)
            .map(|l| {
                (0..2)
                    .map(|h| {
                        held_positions(window_of(&windows, l), 12)
                            .filter(|&p| r.head_retains_kv(l, h, p))
                            .count()
                    })
                    .sum::<usize>()
            })
            .sum();
        assert_eq!((formula, by_position), (38, 38));
        assert_eq!(r.resident_head_rows_windowed(4, 2, &windows), 38);
        // without windows the formula is the unwindowed one
        assert_eq!(r.held_head_rows_windowed(4, 2, &[]), r.held_head_rows(4, 2));
    }

    #[test]
    fn near_ties_are_the_scores_rounding_decides_between() {
        // keep 2 of [5, 3, 3 + 1e-9, 1]: 3 and 3 + 1e-9 tie at the boundary
        assert_eq!(near_ties(&[5.0, 3.0, 3.0 + 1e-9, 1.0], 2), vec![1, 2]);
        assert!(near_ties(&[5.0, 3.0, 2.0, 1.0], 2).is_empty());
        // forced positions (infinite scores) never tie
        assert!(near_ties(&[f64::INFINITY, f64::INFINITY, 1.0], 2).is_empty());
        assert_eq!(near_ties(&[f64::INFINITY, 1.0, 1.0, 0.5], 2), vec![1, 2]);
        let mut r = run(PressName::Knorm, 0.5);
        decide_all(&mut r).unwrap();
        assert!(r.near_ties(0, 0).is_empty());
    }

    #[test]
    fn the_share_removed_is_the_ratio_where_the_prompt_divides() {
        let r = run(PressName::Knorm, 0.5);
        assert_eq!(r.prompt_share_removed(2), 0.5);
        // int(8 * 0.25) = 2 kept of 8: 0.75 removed; 0.7 keeps int(2.4) = 2
        assert_eq!(run(PressName::Knorm, 0.75).prompt_share_removed(2), 0.75);
        assert_eq!(run(PressName::Knorm, 0.7).prompt_share_removed(2), 0.75);
        let phases = TokenPhases::new(12, 8, 1).expect("phases");
        let speed = crate::LayerRule::new(1, 4, crate::UpperReads::AnchorsAndDecode, phases);
        // 8 prompt positions at 4 layers; the cut keeps 8 at layer 0 and the
        // anchor above: 11 of 32 held
        assert!((speed.prompt_share_removed(2) - 21.0 / 32.0).abs() < 1e-12);
    }

    #[test]
    fn streamingllm_keeps_the_same_positions_at_every_head() {
        let mut r = run(PressName::StreamingLlm, 0.5);
        decide_all(&mut r).unwrap();
        assert!(!r.heads_differ(1));
        assert_eq!(r.kept_positions(1, 1), Some(vec![0, 1, 6, 7]));
        assert_eq!(r.held_token_layers(0), 12);
    }

    #[test]
    fn a_press_without_its_queries_refuses_to_decide() {
        let mut r = run(PressName::SnapKv, 0.5);
        let err = decide_all(&mut r).unwrap_err().to_string();
        assert!(err.contains("last 2 prompt queries, but saw 0"), "{err}");
        let mut r = run(PressName::Expected, 0.5);
        let err = decide_all(&mut r).unwrap_err().to_string();
        assert!(
            err.contains("queries of prompt positions 2..8, but saw 0"),
            "{err}"
        );
    }

    #[test]
    fn snapkv_decides_from_its_window_and_stops_asking() {
        let mut r = run(PressName::SnapKv, 0.5);
        for l in 0..3 {
            assert_eq!(r.query_window(l), Some(2));
            // 4 query heads of d = 2
            r.observe_queries(l, vec![vec![1.0; 8]; 3]);
        }
        decide_all(&mut r).unwrap();
        assert_eq!(r.query_window(0), None);
        // the window (6, 7) is kept by every head
        for h in 0..2 {
            let kept = r.kept_positions(0, h).unwrap();
            assert!(kept.len() == 4 && kept.ends_with(&[6, 7]), "{kept:?}");
        }
        // head 0's largest keys are its latest
        assert_eq!(r.kept_positions(0, 0), Some(vec![4, 5, 6, 7]));
    }

    /// Feed `r` what the model shows a press while 8 prompt positions run
    /// at 3 layers (4 query heads of d = 2, every row its own values).
    fn feed_prompt(r: &mut PressRun) {
        let row = |p: usize, l: usize| -> Vec<f32> {
            (0..8).map(|i| ((p * 8 + i + l) % 7) as f32 - 3.0).collect()
        };
        let positions: Vec<usize> = (0..8).collect();
        for l in 0..3 {
            if let Some(w) = r.query_window(l) {
                r.observe_queries(l, (8 - w.min(8)..8).map(|p| row(p, l)).collect());
            }
            if r.wants_unrotated_queries(l) {
                let flat: Vec<f32> = positions.iter().flat_map(|&p| row(p, l + 1)).collect();
                r.observe_unrotated_queries(l, 4, &positions, &flat);
            }
        }
    }

    fn kept_everywhere(r: &PressRun) -> Vec<Option<Vec<usize>>> {
        (0..3)
            .flat_map(|l| (0..2).map(move |h| (l, h)))
            .map(|(l, h)| r.kept_positions(l, h))
            .collect()
    }

    #[test]
    fn one_observing_prompt_run_serves_every_press_as_its_own_run_would() {
        let phases = TokenPhases::new(12, 8, 0).expect("phases");
        let mut presses: Vec<PressParams> = crate::press::PRESSES
            .iter()
            .flat_map(|&name| [0.25, 0.5].map(|ratio| PressParams::new(name, ratio)))
            .map(|p| PressParams {
                sink: 2,
                window: 3,
                kernel: 1,
                ..p
            })
            .collect();
        presses.push(PressParams {
            window: 2,
            ..presses[2]
        });
        let observe = presses
            .iter()
            .map(PressObservation::of)
            .try_fold(PressObservation::default(), PressObservation::union)
            .expect("one observation serves them all");
        assert_eq!(observe.window, Some(3));
        let mut shared = PressRun::observing(presses[0], observe, phases, 3).unwrap();
        feed_prompt(&mut shared);
        for p in presses {
            let mut own = PressRun::new(p, phases, 3);
            feed_prompt(&mut own);
            decide_all(&mut own).unwrap();
            let mut served = shared.retarget(p).unwrap();
            decide_all(&mut served).unwrap();
            assert_eq!(kept_everywhere(&served), kept_everywhere(&own), "{p}");
            assert!(kept_everywhere(&own).iter().all(Option::is_some), "{p}");
        }
    }

    #[test]
    fn a_prompt_run_serves_only_presses_whose_queries_it_observed() {
        let phases = TokenPhases::new(12, 8, 0).expect("phases");
        let params = |name| PressParams {
            sink: 2,
            window: 2,
            kernel: 1,
            ..PressParams::new(name, 0.5)
        };
        let snap = PressRun::new(params(PressName::SnapKv), phases, 3);
        let err = snap.retarget(params(PressName::Expected)).unwrap_err();
        assert!(matches!(err, PolicyError::PressShare { .. }), "{err}");
        let wider = PressParams {
            window: 4,
            ..params(PressName::SnapKv)
        };
        assert!(snap.retarget(wider).is_err());
        // query statistics over other spans do not join
        let expected = PressObservation::of(&params(PressName::Expected));
        let other = PressObservation {
            stats: Some((3, true)),
            window: None,
        };
        assert_eq!(expected.union(other), None);
        // once a layer has decided the run serves no other press
        let mut knorm = PressRun::new(params(PressName::Knorm), phases, 3);
        decide_all(&mut knorm).unwrap();
        assert!(knorm.retarget(params(PressName::StreamingLlm)).is_err());
    }
}
