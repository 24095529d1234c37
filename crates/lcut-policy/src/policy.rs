//! Visibility policies: which tokens exist at a layer, which keys a query
//! reads there, and which keys the cache keeps.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::phases::{Phase, TokenPhases};
use crate::slim::{SlimParams, SlimSpec};

/// The family of a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyKind {
    /// Every token at every layer: the unmodified model.
    Full,
    /// Shallow prefill, deep decode: above the cutoff, decode-phase queries
    /// read only anchors and decode-phase tokens.
    Speed,
    /// Ablation: above the cutoff a query reads only itself (and the anchors
    /// when kept).
    SelfOnly,
    /// SlimInfer: at a few cut layers only the prompt blocks the latest
    /// queries score highest continue; the policy's static rule is SPEED's
    /// above the first cut (sink and decode phase), and the blocks a run
    /// keeps come from the sequence's selection.
    Slim,
}

/// Which prompt tokens stay visible at every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Anchors {
    /// Anchor-free: no prompt token survives above the cutoff.
    None,
    /// The BoS token (position 0) alone: the paper's SPEED+BoS.
    Bos,
    /// The first `n` prompt tokens (e.g. a system prompt of known length).
    Prefix(usize),
    /// The system prompt as rendered by the chat template; its length is
    /// known only once a prompt is tokenised.
    System,
}

impl Anchors {
    /// Number of anchor tokens for a prompt whose system part (BoS included)
    /// spans `system_len` tokens, when known.
    pub fn len(&self, system_len: Option<usize>) -> Result<usize, PolicyError> {
        match self {
            Anchors::None => Ok(0),
            Anchors::Bos => Ok(1),
            Anchors::Prefix(n) => Ok(*n),
            Anchors::System => system_len.ok_or(PolicyError::SystemAnchorUnknown),
        }
    }
}

/// The cutoff as written by a user: a layer count or a fraction of depth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum CutSpec {
    /// Exactly this many lower layers keep the prefill tokens.
    Layers(usize),
    /// This fraction of the depth (in (0, 1]), rounded to the nearest layer.
    Fraction(f64),
}

impl CutSpec {
    /// The cutoff in layers for a model of `num_layers` layers.
    pub fn resolve(&self, num_layers: usize) -> Result<usize, PolicyError> {
        let l_cut = match *self {
            CutSpec::Layers(n) => n,
            CutSpec::Fraction(f) => (f * num_layers as f64).round() as usize,
        };
        if l_cut == 0 || l_cut > num_layers {
            return Err(PolicyError::CutOutOfRange { l_cut, num_layers });
        }
        Ok(l_cut)
    }
}

impl fmt::Display for CutSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CutSpec::Layers(n) => write!(f, "{n}"),
            CutSpec::Fraction(x) => write!(f, "{x}"),
        }
    }
}

/// Errors in writing or resolving a policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The policy string does not follow the grammar.
    #[error(
        "malformed policy {text:?}: {reason}; expected `full`, `speed:C`, `speed:C+bos`, \
         `speed:C+prefix:N`, `speed:C+system`, `selfonly:C`, `selfonly:C+bos`, \
         `slim:C1@K1[,C2@K2...][+block:B][+unit:u][+window:w][+swap:g][+sink:n][+score:unit|avg|max]` \
         or `slim:paper`, where C is a layer count (24), a fraction of depth (3/4) or a decimal \
         (0.75) and K a token count (8192, 8k) or a share of the prompt (25%)"
    )]
    Malformed {
        /// The text given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The cutoff is not in 1..=L.
    #[error(
        "L_cut {l_cut} is out of range for a model of {num_layers} layers (expected 1..={num_layers})"
    )]
    CutOutOfRange {
        /// The cutoff asked for.
        l_cut: usize,
        /// Depth of the model.
        num_layers: usize,
    },
    /// A SlimInfer cut layer is outside 1..L-1 or not after the previous one.
    #[error(
        "SlimInfer cut layer {cut} is out of range for a model of {num_layers} layers (expected \
         {previous} < cut < {num_layers}: each cut after the previous one and below the depth)"
    )]
    SlimCutOutOfRange {
        /// The cut layer as resolved.
        cut: usize,
        /// The previous cut (0 for the first).
        previous: usize,
        /// Depth of the model.
        num_layers: usize,
    },
    /// `+system` anchors were asked for but the prompt has no system part.
    #[error(
        "the policy keeps the system prompt as anchors, but the prompt's system span is unknown (no chat template or no system message)"
    )]
    SystemAnchorUnknown,
}

/// A policy as written, before the model's depth is known.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PolicySpec {
    /// Policy family.
    pub kind: PolicyKind,
    /// Cutoff (ignored for `Full`).
    pub cut: CutSpec,
    /// Anchors kept at every layer (ignored for `Full` and `Slim`).
    pub anchors: Anchors,
    /// Cuts, budgets and options of a SlimInfer policy (`Slim` only).
    pub slim: Option<SlimSpec>,
}

impl PolicySpec {
    /// The full model.
    pub fn full() -> Self {
        Self {
            kind: PolicyKind::Full,
            cut: CutSpec::Fraction(1.0),
            anchors: Anchors::None,
            slim: None,
        }
    }

    /// A SlimInfer policy.
    pub fn slim(spec: SlimSpec) -> Self {
        Self {
            kind: PolicyKind::Slim,
            cut: spec.cuts()[0],
            anchors: Anchors::None,
            slim: Some(spec),
        }
    }

    /// Fix the cutoff for a model of `num_layers` layers.
    pub fn resolve(&self, num_layers: usize) -> Result<Policy, PolicyError> {
        if num_layers == 0 {
            return Err(PolicyError::CutOutOfRange {
                l_cut: 0,
                num_layers,
            });
        }
        if let (PolicyKind::Slim, Some(spec)) = (self.kind, &self.slim) {
            let params = spec.resolve(num_layers)?;
            let o = params.options;
            return Ok(Policy {
                kind: PolicyKind::Slim,
                l_cut: params.cuts()[0],
                num_layers,
                anchors: Anchors::Prefix(o.sink * o.block),
                slim: Some(params),
            });
        }
        let l_cut = match self.kind {
            PolicyKind::Full => num_layers,
            _ => self.cut.resolve(num_layers)?,
        };
        Ok(Policy {
            kind: self.kind,
            l_cut,
            num_layers,
            anchors: self.anchors,
            slim: None,
        })
    }
}

fn malformed(text: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError::Malformed {
        text: text.to_string(),
        reason: reason.into(),
    }
}

pub(crate) fn parse_cut(text: &str, cut: &str) -> Result<CutSpec, PolicyError> {
    if let Some((num, den)) = cut.split_once('/') {
        let num: f64 = num
            .trim()
            .parse()
            .map_err(|_| malformed(text, format!("numerator {num:?} is not a number")))?;
        let den: f64 = den
            .trim()
            .parse()
            .map_err(|_| malformed(text, format!("denominator {den:?} is not a number")))?;
        if den <= 0.0 || num <= 0.0 || num > den {
            return Err(malformed(text, format!("fraction {cut} is not in (0, 1]")));
        }
        return Ok(CutSpec::Fraction(num / den));
    }
    if let Ok(n) = cut.parse::<usize>() {
        return Ok(CutSpec::Layers(n));
    }
    match cut.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(CutSpec::Fraction(f)),
        Ok(_) => Err(malformed(text, format!("fraction {cut} is not in (0, 1]"))),
        Err(_) => Err(malformed(
            text,
            format!("cutoff {cut:?} is neither a layer count nor a fraction"),
        )),
    }
}

fn parse_anchors(
    text: &str,
    kind: PolicyKind,
    suffix: Option<&str>,
) -> Result<Anchors, PolicyError> {
    let Some(suffix) = suffix else {
        return Ok(Anchors::None);
    };
    let anchors = match suffix {
        "bos" => Anchors::Bos,
        "system" => Anchors::System,
        s => match s.strip_prefix("prefix:") {
            Some(n) => Anchors::Prefix(
                n.parse()
                    .map_err(|_| malformed(text, format!("prefix length {n:?} is not a count")))?,
            ),
            None => return Err(malformed(text, format!("unknown anchor {s:?}"))),
        },
    };
    if kind == PolicyKind::SelfOnly && !matches!(anchors, Anchors::Bos) {
        return Err(malformed(text, "selfonly keeps either no anchor or `+bos`"));
    }
    Ok(anchors)
}

impl FromStr for PolicySpec {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let t = text.trim().to_ascii_lowercase();
        if t == "full" {
            return Ok(Self::full());
        }
        let (head, rest) = t
            .split_once(':')
            .ok_or_else(|| malformed(text, "no `:` after the policy name"))?;
        let kind = match head {
            "slim" => return Ok(Self::slim(SlimSpec::parse(text, rest)?)),
            "speed" => PolicyKind::Speed,
            "selfonly" => PolicyKind::SelfOnly,
            other => return Err(malformed(text, format!("unknown policy {other:?}"))),
        };
        let (cut, suffix) = match rest.split_once('+') {
            Some((c, s)) => (c, Some(s)),
            None => (rest, None),
        };
        if cut.is_empty() {
            return Err(malformed(text, "the cutoff is missing"));
        }
        Ok(Self {
            kind,
            cut: parse_cut(text, cut)?,
            anchors: parse_anchors(text, kind, suffix)?,
            slim: None,
        })
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            PolicyKind::Full => write!(f, "full"),
            PolicyKind::Speed => write!(f, "speed:{}{}", self.cut, AnchorSuffix(self.anchors)),
            PolicyKind::SelfOnly => {
                write!(f, "selfonly:{}{}", self.cut, AnchorSuffix(self.anchors))
            }
            PolicyKind::Slim => match &self.slim {
                Some(spec) => spec.fmt(f),
                None => write!(f, "slim:?"),
            },
        }
    }
}

struct AnchorSuffix(Anchors);

impl fmt::Display for AnchorSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Anchors::None => Ok(()),
            Anchors::Bos => write!(f, "+bos"),
            Anchors::Prefix(n) => write!(f, "+prefix:{n}"),
            Anchors::System => write!(f, "+system"),
        }
    }
}

/// A policy resolved against a model's depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    kind: PolicyKind,
    l_cut: usize,
    num_layers: usize,
    anchors: Anchors,
    slim: Option<SlimParams>,
}

impl Policy {
    /// The full model of `num_layers` layers.
    pub fn full(num_layers: usize) -> Self {
        Self {
            kind: PolicyKind::Full,
            l_cut: num_layers,
            num_layers,
            anchors: Anchors::None,
            slim: None,
        }
    }

    /// SPEED or SelfOnly at `l_cut` of `num_layers` with the given anchors.
    pub fn new(
        kind: PolicyKind,
        l_cut: usize,
        num_layers: usize,
        anchors: Anchors,
    ) -> Result<Self, PolicyError> {
        PolicySpec {
            kind,
            cut: CutSpec::Layers(l_cut),
            anchors,
            slim: None,
        }
        .resolve(num_layers)
    }

    /// SlimInfer's cuts, budgets and options (`None` for other policies).
    pub fn slim(&self) -> Option<&SlimParams> {
        self.slim.as_ref()
    }

    /// Number of anchor tokens for a prompt whose decode phase starts at
    /// `decode_start` and whose system part spans `system_len` tokens: the
    /// anchors as written, except that SlimInfer's sink is clamped to the
    /// decode start (a prompt shorter than the sink still runs).
    pub fn anchor_len(
        &self,
        system_len: Option<usize>,
        decode_start: usize,
    ) -> Result<usize, PolicyError> {
        match &self.slim {
            Some(slim) => Ok(slim.sink_len(decode_start)),
            None => self.anchors.len(system_len),
        }
    }

    /// Policy family.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// Number of lower layers in which prefill tokens exist (L for full).
    pub fn l_cut(&self) -> usize {
        self.l_cut
    }

    /// Depth of the model the policy was resolved for.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Anchors kept at every layer.
    pub fn anchors(&self) -> Anchors {
        self.anchors
    }

    /// True when the policy changes nothing (full, or a cutoff at full depth).
    pub fn is_full_depth(&self) -> bool {
        self.kind == PolicyKind::Full || self.l_cut >= self.num_layers
    }

    /// True when `layer` is at or above the cutoff of a non-full policy.
    pub fn is_upper(&self, layer: usize) -> bool {
        self.kind != PolicyKind::Full && layer >= self.l_cut
    }

    /// Whether the token at `pos` has a hidden state at `layer`.
    pub fn token_exists(&self, layer: usize, pos: usize, phases: &TokenPhases) -> bool {
        !self.is_upper(layer) || phases.phase(pos) != Phase::Prefill
    }

    /// Whether a query at `q` reads the key at `k` (k <= q) at `layer`, before
    /// the model's own sliding window is applied. Depends on `layer` only
    /// through [`Policy::is_upper`] (the decoder reuses masks on that basis).
    pub fn key_visible(&self, layer: usize, q: usize, k: usize, phases: &TokenPhases) -> bool {
        if !self.is_upper(layer) {
            return true;
        }
        match self.kind {
            PolicyKind::Full => true,
            PolicyKind::Speed | PolicyKind::Slim => phases.phase(k) != Phase::Prefill,
            PolicyKind::SelfOnly => k == q || phases.phase(k) == Phase::Anchor,
        }
    }

    /// Whether the cache at `layer` keeps the key/value of the token at `pos`
    /// (a key no later query will read is never stored).
    pub fn retains_kv(&self, layer: usize, pos: usize, phases: &TokenPhases) -> bool {
        self.retains_phase(layer, phases.phase(pos))
    }

    /// Whether the cache at `layer` keeps the keys/values of tokens of `phase`.
    pub fn retains_phase(&self, layer: usize, phase: Phase) -> bool {
        if !self.is_upper(layer) {
            return true;
        }
        match self.kind {
            PolicyKind::Full => true,
            PolicyKind::Speed | PolicyKind::Slim => phase != Phase::Prefill,
            PolicyKind::SelfOnly => phase == Phase::Anchor,
        }
    }

    /// Back to the written form with the cutoff as a layer count.
    pub fn spec(&self) -> PolicySpec {
        if let Some(slim) = &self.slim {
            return PolicySpec::slim(slim.spec());
        }
        PolicySpec {
            kind: self.kind,
            cut: CutSpec::Layers(self.l_cut),
            anchors: self.anchors,
            slim: None,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.spec().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> PolicySpec {
        s.parse().unwrap()
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(parse("full").kind, PolicyKind::Full);
        let p = parse("speed:24+bos");
        assert_eq!(
            (p.kind, p.cut, p.anchors),
            (PolicyKind::Speed, CutSpec::Layers(24), Anchors::Bos)
        );
        assert_eq!(parse("speed:24").anchors, Anchors::None);
        assert_eq!(parse("selfonly:24+bos").kind, PolicyKind::SelfOnly);
        assert_eq!(parse("speed:3/4+bos").cut, CutSpec::Fraction(0.75));
        assert_eq!(parse("speed:0.5").cut, CutSpec::Fraction(0.5));
        assert_eq!(parse("speed:4+prefix:12").anchors, Anchors::Prefix(12));
        assert_eq!(parse("speed:4+system").anchors, Anchors::System);
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "full",
            "speed:24+bos",
            "speed:24",
            "selfonly:3+bos",
            "speed:5+prefix:7",
        ] {
            assert_eq!(parse(s).to_string(), s);
        }
    }

    #[test]
    fn fractions_resolve_against_depth() {
        assert_eq!(parse("speed:3/4+bos").resolve(32).unwrap().l_cut(), 24);
        assert_eq!(parse("speed:0.75").resolve(12).unwrap().l_cut(), 9);
        assert_eq!(parse("full").resolve(7).unwrap().l_cut(), 7);
    }

    #[test]
    fn malformed_policies_are_named() {
        for bad in [
            "",
            "speed",
            "speed:",
            "speed:x",
            "fast:3",
            "speed:3+eos",
            "speed:3/0",
            "speed:5/4",
            "speed:1.5",
            "selfonly:3+system",
            "speed:3+prefix:x",
        ] {
            let err = bad.parse::<PolicySpec>().unwrap_err();
            assert!(matches!(err, PolicyError::Malformed { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn cutoff_out_of_range_is_an_error() {
        assert_eq!(
            parse("speed:0+bos").resolve(6),
            Err(PolicyError::CutOutOfRange {
                l_cut: 0,
                num_layers: 6
            })
        );
        assert_eq!(
            parse("speed:7+bos").resolve(6),
            Err(PolicyError::CutOutOfRange {
                l_cut: 7,
                num_layers: 6
            })
        );
        assert!(parse("speed:1/100").resolve(6).is_err());
        assert!(parse("speed:6").resolve(6).is_ok());
    }

    #[test]
    fn speed_rule_matches_the_design() {
        let ph = TokenPhases::new(10, 7, 1).unwrap();
        let p = Policy::new(PolicyKind::Speed, 2, 4, Anchors::Bos).unwrap();
        // lower layers: everything
        assert!(p.key_visible(1, 8, 3, &ph));
        assert!(p.token_exists(1, 3, &ph));
        // upper layers: anchors and decode-phase tokens only
        assert!(!p.token_exists(2, 3, &ph));
        assert!(p.token_exists(2, 0, &ph));
        assert!(p.token_exists(3, 7, &ph));
        assert!(!p.key_visible(2, 8, 3, &ph));
        assert!(p.key_visible(2, 8, 0, &ph));
        assert!(p.key_visible(2, 8, 7, &ph));
        assert!(!p.retains_kv(3, 5, &ph));
        assert!(p.retains_kv(3, 9, &ph));
    }

    #[test]
    fn selfonly_reads_itself_and_anchor() {
        let ph = TokenPhases::new(10, 7, 1).unwrap();
        let p = Policy::new(PolicyKind::SelfOnly, 2, 4, Anchors::Bos).unwrap();
        assert!(p.key_visible(2, 8, 8, &ph));
        assert!(p.key_visible(2, 8, 0, &ph));
        assert!(!p.key_visible(2, 8, 7, &ph));
        assert!(!p.retains_kv(2, 8, &ph));
        assert!(p.retains_kv(2, 0, &ph));
    }

    #[test]
    fn cut_at_depth_is_full() {
        let p = Policy::new(PolicyKind::Speed, 4, 4, Anchors::None).unwrap();
        assert!(p.is_full_depth());
        assert!(!p.is_upper(3));
    }
}
