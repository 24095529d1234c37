//! Policies as written and as resolved against a model's depth: the family
//! (full, SPEED, SelfOnly, SlimInfer, projected prompt K/V, a press or a
//! registered family), its cutoff and
//! anchors, what it can do (capabilities), and the [`Visibility`] it gives
//! one sequence. Every visibility question goes through that interface.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::band::BandRule;
use crate::capabilities::Capabilities;
use crate::custom::{FamilyRef, family_names, find_family};
use crate::cut::{CutSpec, malformed, parse_cut};
use crate::error::PolicyError;
use crate::head_rule::HeadRule;
use crate::heads::{HeadChoice, HeadRanking, HeadSet, ModelDims};
use crate::layer_rule::{LayerRule, UpperReads};
use crate::phases::TokenPhases;
use crate::press::{PressName, PressParams, PressRun};
use crate::projected::{ProjectedKv, ProjectedName};
use crate::slim::{SlimParams, SlimSpec};
use crate::slim_run::SlimRun;
use crate::visibility::Visibility;

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
    /// queries score highest continue; the blocks a run keeps come from the
    /// sequence's own decisions.
    Slim,
    /// Projected prompt K/V (SwiftKV's SingleInputKV, POP): above the cutoff
    /// prompt tokens keep only K/V projected from the hidden state entering
    /// it; written `swiftkv:C` or `pop:C`, the name kept for display.
    Projected(ProjectedName),
    /// A family registered with [`crate::register_family`] (written
    /// `NAME:C[+anchors]` like SPEED).
    Custom(FamilyRef),
    /// Prompt knockout: the prompt (anchors kept) is invisible to
    /// decode-phase queries at layers `first..=last` (0-based) only;
    /// written `knockout:l` (one layer) or `band:a..b`.
    Band {
        /// The band's first layer.
        first: usize,
        /// The band's last layer.
        last: usize,
    },
    /// One of kvpress's presses (`snapkv:0.5`, ...): once the prompt has
    /// run at full depth, each layer keeps the prompt positions its press
    /// scores highest (per K/V head where the press is head-wise); its
    /// ratio and options are the policy's [`PressParams`].
    Press(PressName),
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
    /// Head exceptions above a SPEED cut (`+heads:..`, `+window:W`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<HeadChoice>,
    /// A press's ratio and options (`Press` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub press: Option<PressParams>,
}

impl PolicySpec {
    /// The full model.
    pub fn full() -> Self {
        Self {
            kind: PolicyKind::Full,
            cut: CutSpec::Fraction(1.0),
            anchors: Anchors::None,
            slim: None,
            heads: None,
            press: None,
        }
    }

    /// A SlimInfer policy.
    pub fn slim(spec: SlimSpec) -> Self {
        Self {
            kind: PolicyKind::Slim,
            cut: spec.cuts()[0],
            anchors: Anchors::None,
            slim: Some(spec),
            heads: None,
            press: None,
        }
    }

    /// A press.
    pub fn press(params: PressParams) -> Self {
        Self {
            kind: PolicyKind::Press(params.name),
            cut: CutSpec::Fraction(1.0),
            anchors: Anchors::None,
            slim: None,
            heads: None,
            press: Some(params),
        }
    }

    /// A one-cut policy of `kind` at `cut` with `anchors` (no options).
    pub fn at_cut(kind: PolicyKind, cut: CutSpec, anchors: Anchors) -> Self {
        Self {
            kind,
            cut,
            anchors,
            slim: None,
            heads: None,
            press: None,
        }
    }

    /// Parse a list of policies separated by `,` or `;`. A SlimInfer
    /// policy's own commas (`slim:4@2k,8@1k`) stay inside it: a part starts
    /// a new policy only when it names a family (`full`, `speed:`, ...).
    pub fn parse_list(text: &str) -> Result<Vec<Self>, PolicyError> {
        split_list(text).iter().map(|p| p.parse()).collect()
    }

    /// Fix the cutoff for a model of `num_layers` layers (head files are
    /// read and checked against the depth; see [`PolicySpec::resolve_for`]).
    pub fn resolve(&self, num_layers: usize) -> Result<Policy, PolicyError> {
        self.resolve_for(&ModelDims::depth(num_layers), None)
    }

    /// Fix the policy for the model `dims`: the cutoff, and the kept heads
    /// (a head file or ranking read and checked against the model; `+heads:N`
    /// without `+ranking:FILE` takes them from `ranking`).
    pub fn resolve_for(
        &self,
        dims: &ModelDims<'_>,
        ranking: Option<&HeadRanking>,
    ) -> Result<Policy, PolicyError> {
        let num_layers = dims.num_layers;
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
                rule: Resolved::Slim(params),
                l_cut: params.cuts()[0],
                num_layers,
                anchors: Anchors::Prefix(o.sink * o.block),
            });
        }
        if let (PolicyKind::Press(_), Some(params)) = (self.kind, self.press) {
            return Ok(Policy {
                rule: Resolved::Press(params),
                l_cut: num_layers,
                num_layers,
                anchors: Anchors::None,
            });
        }
        let l_cut = match self.kind {
            PolicyKind::Full => num_layers,
            PolicyKind::Band { first, last } => {
                if first > last || last >= num_layers {
                    return Err(PolicyError::BandOutOfRange {
                        policy: self.to_string(),
                        first,
                        last,
                        num_layers,
                    });
                }
                first
            }
            _ => self.cut.resolve(num_layers)?,
        };
        let rule = match self.kind {
            PolicyKind::Full => Resolved::Full,
            PolicyKind::Speed => Resolved::Speed {
                heads: match &self.heads {
                    Some(choice) => Some(HeadExceptions {
                        set: choice.resolve(l_cut, dims, ranking)?,
                        choice: *choice,
                        kv_heads: dims.kv_heads,
                    }),
                    None => None,
                },
            },
            PolicyKind::SelfOnly => Resolved::SelfOnly,
            PolicyKind::Projected(name) => Resolved::Projected(name),
            PolicyKind::Custom(family) => Resolved::Custom(family),
            PolicyKind::Band { first, last } => Resolved::Band { first, last },
            PolicyKind::Slim | PolicyKind::Press(_) => {
                return Err(malformed(
                    &self.to_string(),
                    "the policy's own parameters are missing",
                ));
            }
        };
        Ok(Policy {
            rule,
            l_cut,
            num_layers,
            anchors: self.anchors,
        })
    }
}

/// Split a list of policies written with `,` or `;` into one text per
/// policy (see [`PolicySpec::parse_list`]); empty parts are dropped.
pub fn split_list(text: &str) -> Vec<String> {
    let starts = |t: &str| {
        let t = t.trim_start().to_ascii_lowercase();
        t == "full"
            || family_names()
                .iter()
                .any(|name| t.starts_with(&format!("{name}:")))
    };
    let mut out: Vec<String> = Vec::new();
    for group in text.split(';') {
        let mut first = true;
        for part in group.split(',') {
            match out.last_mut() {
                Some(last) if !first && !starts(part) => {
                    last.push(',');
                    last.push_str(part.trim());
                }
                _ => out.push(part.trim().to_string()),
            }
            first = false;
        }
    }
    out.retain(|p| !p.is_empty());
    out
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
        "none" => Anchors::None,
        "system" => Anchors::System,
        s => match s.strip_prefix("prefix:") {
            Some(n) => Anchors::Prefix(
                n.parse()
                    .map_err(|_| malformed(text, format!("prefix length {n:?} is not a count")))?,
            ),
            None => return Err(malformed(text, format!("unknown anchor {s:?}"))),
        },
    };
    let bos_only = match kind {
        PolicyKind::SelfOnly => Some("selfonly"),
        PolicyKind::Projected(name) => Some(name.as_str()),
        _ => None,
    };
    match bos_only {
        Some(name) if anchors != Anchors::Bos => Err(malformed(
            text,
            format!("{name} keeps either no anchor or `+bos`"),
        )),
        _ => Ok(anchors),
    }
}

/// A knockout band as written: `knockout:l` or `band:a..b` (the part
/// after `:`, before any `+`).
fn parse_band(text: &str, head: &str, layers: &str) -> Result<PolicyKind, PolicyError> {
    let layer = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|_| malformed(text, format!("layer {v:?} is not a 0-based layer index")))
    };
    let (first, last) = match head {
        "knockout" => {
            let l = layer(layers)?;
            (l, l)
        }
        _ => {
            let (a, b) = layers
                .split_once("..")
                .ok_or_else(|| malformed(text, "a band is written `band:a..b`"))?;
            (layer(a)?, layer(b)?)
        }
    };
    if first > last {
        return Err(malformed(
            text,
            format!("band {first}..{last} runs backwards (a <= b)"),
        ));
    }
    Ok(PolicyKind::Band { first, last })
}

impl FromStr for PolicySpec {
    type Err = PolicyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let t = text.trim();
        let lower = t.to_ascii_lowercase();
        if lower == "full" {
            return Ok(Self::full());
        }
        let (head, _) = lower
            .split_once(':')
            .ok_or_else(|| malformed(text, "no `:` after the policy name"))?;
        // file names in options keep their case
        let rest = &t[head.len() + 1..];
        let (cut, options) = match rest.split_once('+') {
            Some((c, s)) => (c, Some(s)),
            None => (rest, None),
        };
        let cut_lower = cut.to_ascii_lowercase();
        if let Some(name) = PressName::from_name(head) {
            let body = &lower[head.len() + 1..];
            return Ok(Self::press(PressParams::parse(text, name, body)?));
        }
        let kind = match head {
            "slim" => return Ok(Self::slim(SlimSpec::parse(text, &lower[5..])?)),
            "speed" => PolicyKind::Speed,
            "selfonly" => PolicyKind::SelfOnly,
            "knockout" | "band" => parse_band(text, head, cut)?,
            other => match (ProjectedName::from_name(other), find_family(other)) {
                (Some(name), _) => PolicyKind::Projected(name),
                (None, Some(family)) => PolicyKind::Custom(family),
                (None, None) => return Err(malformed(text, format!("unknown policy {other:?}"))),
            },
        };
        if cut.is_empty() {
            return Err(malformed(text, "the cutoff is missing"));
        }
        let mut spec = Self::at_cut(kind, CutSpec::Layers(0), Anchors::None);
        if let PolicyKind::Band { first, .. } = kind {
            spec.cut = CutSpec::Layers(first);
            spec.anchors = Anchors::Bos;
        } else {
            spec.cut = parse_cut(text, &cut_lower)?;
        }
        let mut anchors: Option<&str> = None;
        let mut heads = HeadChoice {
            source: None,
            window: None,
        };
        for part in options.into_iter().flat_map(|o| o.split('+')) {
            if kind == PolicyKind::Speed && heads.take(text, part)? {
                continue;
            }
            if anchors.is_some() {
                return Err(malformed(text, format!("a second anchor option {part:?}")));
            }
            anchors = Some(part);
        }
        let anchors_lower = anchors.map(str::to_ascii_lowercase);
        if anchors.is_some() || !matches!(kind, PolicyKind::Band { .. }) {
            spec.anchors = parse_anchors(text, kind, anchors_lower.as_deref())?;
        }
        if heads.source.is_some() || heads.window.is_some() {
            if let Some(crate::heads::HeadSource::Top {
                count: 0,
                ranking: Some(_),
            }) = heads.source
            {
                return Err(malformed(
                    text,
                    "`ranking:` needs `heads:N` (how many heads)",
                ));
            }
            spec.heads = Some(heads);
        }
        Ok(spec)
    }
}

impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let anchors = AnchorSuffix(self.anchors);
        match self.kind {
            PolicyKind::Full => write!(f, "full"),
            PolicyKind::Speed => {
                write!(f, "speed:{}{anchors}", self.cut)?;
                match &self.heads {
                    Some(h) => h.fmt(f),
                    None => Ok(()),
                }
            }
            PolicyKind::Band { first, last } => {
                match first == last {
                    true => write!(f, "knockout:{first}")?,
                    false => write!(f, "band:{first}..{last}")?,
                }
                match self.anchors {
                    Anchors::Bos => Ok(()),
                    Anchors::None => write!(f, "+none"),
                    other => AnchorSuffix(other).fmt(f),
                }
            }
            PolicyKind::SelfOnly => write!(f, "selfonly:{}{anchors}", self.cut),
            PolicyKind::Projected(name) => write!(f, "{name}:{}{anchors}", self.cut),
            PolicyKind::Custom(family) => write!(f, "{}:{}{anchors}", family.name(), self.cut),
            PolicyKind::Slim => match &self.slim {
                Some(spec) => spec.fmt(f),
                None => write!(f, "slim:?"),
            },
            PolicyKind::Press(name) => match &self.press {
                Some(params) => params.fmt(f),
                None => write!(f, "{name}:?"),
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

/// The kept heads of a SPEED policy as resolved: the set, how it was
/// written, and the model's K/V heads when known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadExceptions {
    /// The kept (layer, K/V head) pairs.
    pub set: HeadSet,
    /// How they were written.
    pub choice: HeadChoice,
    /// The model's K/V heads, when the policy was resolved knowing them.
    pub kv_heads: Option<usize>,
}

/// A policy resolved against a model's depth: one typed value, each kind
/// with its own parameters and no other's (a SlimInfer policy has its cuts
/// and budgets, a press its ratio and options, SPEED its kept heads), with
/// the cutoff and anchors every kind answers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "PolicyRecord", try_from = "PolicyRecord")]
pub struct Policy {
    rule: Resolved,
    l_cut: usize,
    num_layers: usize,
    anchors: Anchors,
}

/// What a resolved policy does, with the parameters of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolved {
    /// Every token at every layer.
    Full,
    /// SPEED, with the heads kept above the cut where it names them.
    Speed { heads: Option<HeadExceptions> },
    /// Above the cut a query reads only itself (and the anchors).
    SelfOnly,
    /// Projected prompt K/V (SwiftKV, POP).
    Projected(ProjectedName),
    /// A registered family.
    Custom(FamilyRef),
    /// A prompt knockout over layers `first..=last`.
    Band { first: usize, last: usize },
    /// SlimInfer's cuts, budgets and options.
    Slim(SlimParams),
    /// A press's name, ratio and options.
    Press(PressParams),
}

impl Resolved {
    /// The family.
    fn kind(&self) -> PolicyKind {
        match *self {
            Self::Full => PolicyKind::Full,
            Self::Speed { .. } => PolicyKind::Speed,
            Self::SelfOnly => PolicyKind::SelfOnly,
            Self::Projected(name) => PolicyKind::Projected(name),
            Self::Custom(family) => PolicyKind::Custom(family),
            Self::Band { first, last } => PolicyKind::Band { first, last },
            Self::Slim(_) => PolicyKind::Slim,
            Self::Press(p) => PolicyKind::Press(p.name),
        }
    }
}

/// A policy as reports and traces have always stored it: the family, the
/// cutoff and anchors, and the parameters of the kinds that have them
/// (only theirs; [`Policy`]'s deserialisation refuses any other mix).
#[derive(Serialize, Deserialize)]
struct PolicyRecord {
    kind: PolicyKind,
    l_cut: usize,
    num_layers: usize,
    anchors: Anchors,
    slim: Option<SlimParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    heads: Option<HeadExceptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    press: Option<PressParams>,
}

impl From<Policy> for PolicyRecord {
    fn from(p: Policy) -> Self {
        let (slim, heads, press) = match p.rule {
            Resolved::Slim(params) => (Some(params), None, None),
            Resolved::Speed { heads } => (None, heads, None),
            Resolved::Press(params) => (None, None, Some(params)),
            _ => (None, None, None),
        };
        Self {
            kind: p.rule.kind(),
            l_cut: p.l_cut,
            num_layers: p.num_layers,
            anchors: p.anchors,
            slim,
            heads,
            press,
        }
    }
}

impl TryFrom<PolicyRecord> for Policy {
    type Error = String;

    fn try_from(r: PolicyRecord) -> Result<Self, String> {
        let mismatch = |what: &str| {
            format!(
                "a {:?} policy with {what}, which only other kinds have",
                r.kind
            )
        };
        let rule = match (r.kind, r.slim, r.heads, r.press) {
            (_, Some(_), _, _) if r.kind != PolicyKind::Slim => {
                return Err(mismatch("SlimInfer's parameters"));
            }
            (_, _, Some(_), _) if r.kind != PolicyKind::Speed => {
                return Err(mismatch("kept heads"));
            }
            (PolicyKind::Press(name), _, _, Some(p)) if p.name != name => {
                return Err(format!(
                    "a {name:?} policy with the parameters of {:?}",
                    p.name
                ));
            }
            (_, _, _, Some(_)) if !matches!(r.kind, PolicyKind::Press(_)) => {
                return Err(mismatch("a press's parameters"));
            }
            (PolicyKind::Full, ..) => Resolved::Full,
            (PolicyKind::Speed, _, heads, _) => Resolved::Speed { heads },
            (PolicyKind::SelfOnly, ..) => Resolved::SelfOnly,
            (PolicyKind::Projected(name), ..) => Resolved::Projected(name),
            (PolicyKind::Custom(family), ..) => Resolved::Custom(family),
            (PolicyKind::Band { first, last }, ..) => Resolved::Band { first, last },
            (PolicyKind::Slim, Some(params), ..) => Resolved::Slim(params),
            (PolicyKind::Slim, None, ..) => {
                return Err("a SlimInfer policy without its parameters".into());
            }
            (PolicyKind::Press(_), _, _, Some(params)) => Resolved::Press(params),
            (PolicyKind::Press(name), _, _, None) => {
                return Err(format!("a {name:?} press without its parameters"));
            }
        };
        if r.num_layers == 0 || r.l_cut > r.num_layers {
            return Err(format!(
                "a cutoff of {} layers in a model of {}",
                r.l_cut, r.num_layers
            ));
        }
        Ok(Policy {
            rule,
            l_cut: r.l_cut,
            num_layers: r.num_layers,
            anchors: r.anchors,
        })
    }
}

impl Policy {
    /// The full model of `num_layers` layers.
    pub fn full(num_layers: usize) -> Self {
        Self {
            rule: Resolved::Full,
            l_cut: num_layers,
            num_layers,
            anchors: Anchors::None,
        }
    }

    /// A one-cut policy (SPEED, SelfOnly or a registered family) at `l_cut`
    /// of `num_layers` with the given anchors.
    pub fn new(
        kind: PolicyKind,
        l_cut: usize,
        num_layers: usize,
        anchors: Anchors,
    ) -> Result<Self, PolicyError> {
        PolicySpec::at_cut(kind, CutSpec::Layers(l_cut), anchors).resolve(num_layers)
    }

    /// The visibility this policy gives one sequence with these phases:
    /// what exists, what is kept and what is read at each layer, and (for a
    /// policy that decides while it runs) its decisions.
    pub fn visibility(&self, phases: TokenPhases) -> Box<dyn Visibility> {
        let (l_cut, layers) = (self.l_cut, self.num_layers);
        let one_cut = |upper| {
            let l_cut = if self.is_full_depth() { layers } else { l_cut };
            Box::new(LayerRule::new(l_cut, layers, upper, phases))
        };
        match self.rule {
            Resolved::Press(params) => Box::new(PressRun::new(params, phases, layers)),
            Resolved::Slim(params) => Box::new(SlimRun::new(params, phases, layers)),
            Resolved::Custom(family) => family.visibility(l_cut, layers, phases),
            Resolved::Projected(_) => Box::new(ProjectedKv::new(l_cut, layers, phases)),
            Resolved::Band { first, last } => Box::new(BandRule::new(first, last, layers, phases)),
            Resolved::Speed { heads: Some(h) } if !self.is_full_depth() => Box::new(HeadRule::new(
                l_cut,
                layers,
                phases,
                h.set,
                h.choice.window,
                h.kv_heads,
            )),
            Resolved::SelfOnly => one_cut(UpperReads::SelfAndAnchors),
            Resolved::Full | Resolved::Speed { .. } => one_cut(UpperReads::AnchorsAndDecode),
        }
    }

    /// What the policy can do.
    pub fn capabilities(&self) -> Capabilities {
        match self.rule {
            Resolved::Speed { heads: Some(_) } | Resolved::Band { .. } => Capabilities {
                trainable: false,
                ..Capabilities::STATIC_SUBSET
            },
            Resolved::Full | Resolved::Speed { .. } | Resolved::SelfOnly => {
                Capabilities::STATIC_SUBSET
            }
            Resolved::Slim(_) => Capabilities {
                is_static: false,
                needs_staged_prefill: true,
                trainable: false,
                reuses_full_prefill: false,
            },
            Resolved::Projected(_) => Capabilities {
                is_static: true,
                needs_staged_prefill: false,
                trainable: false,
                reuses_full_prefill: false,
            },
            // a press decides from its own prefill's queries
            Resolved::Press(_) => Capabilities {
                is_static: false,
                needs_staged_prefill: false,
                trainable: false,
                reuses_full_prefill: false,
            },
            Resolved::Custom(family) => family.capabilities(),
        }
    }

    /// Visibility follows from the token phases alone.
    pub fn is_static(&self) -> bool {
        self.capabilities().is_static
    }

    /// The prompt is prefilled in stages (decisions at stage cuts).
    pub fn needs_staged_prefill(&self) -> bool {
        self.capabilities().needs_staged_prefill
    }

    /// The adapters' trainer can train under this policy's mask.
    pub fn trainable(&self) -> bool {
        self.capabilities().trainable
    }

    /// A full-depth prefill restricted to what the policy keeps is this
    /// policy's own prefill (see [`Capabilities::reuses_full_prefill`]).
    pub fn reuses_full_prefill(&self) -> bool {
        self.capabilities().reuses_full_prefill
    }

    /// SlimInfer's cuts, budgets and options (`None` for other policies).
    pub fn slim(&self) -> Option<&SlimParams> {
        match &self.rule {
            Resolved::Slim(params) => Some(params),
            _ => None,
        }
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
        match self.slim() {
            Some(slim) => Ok(slim.sink_len(decode_start)),
            None => self.anchors.len(system_len),
        }
    }

    /// Policy family.
    pub fn kind(&self) -> PolicyKind {
        self.rule.kind()
    }

    /// Number of lower layers in which every prompt token exists (L for
    /// full; SlimInfer's first cut).
    pub fn l_cut(&self) -> usize {
        self.l_cut
    }

    /// How many lower layers this policy runs exactly as the full model
    /// does, for every token and every query: every token exists there and
    /// every query reads every key the full model's would. A run under the
    /// policy computes there what the full model's run of the same tokens
    /// computes, so it may start above them from the full run's states
    /// (the sweep's teacher-forced runs do). SPEED, SelfOnly and projected
    /// K/V: the cut; a knockout band: the layers below it; the full model:
    /// every layer; a policy that decides as it runs (SlimInfer, a press) or
    /// a registered family: none.
    pub fn full_depth_below(&self) -> usize {
        let below = match self.rule {
            Resolved::Full => self.num_layers,
            Resolved::Speed { .. } | Resolved::SelfOnly | Resolved::Projected(_) => self.l_cut,
            Resolved::Band { first, .. } => first,
            Resolved::Slim(_) | Resolved::Press(_) | Resolved::Custom(_) => 0,
        };
        below.min(self.num_layers)
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
        match self.rule {
            Resolved::Full => true,
            Resolved::Band { .. } | Resolved::Press(_) => false,
            _ => self.l_cut >= self.num_layers,
        }
    }

    /// A press's ratio and options (`None` for other policies).
    pub fn press(&self) -> Option<&PressParams> {
        match &self.rule {
            Resolved::Press(params) => Some(params),
            _ => None,
        }
    }

    /// Refuse a sequence of these phases the policy cannot run: a prompt a
    /// press cannot compress as kvpress does (too short for its window or
    /// sinks, or a budget below them). Every other policy runs any phases.
    pub fn check_phases(&self, phases: &TokenPhases) -> Result<(), PolicyError> {
        match self.press() {
            Some(p) => p.check_prompt(phases.decode_start(), self.num_layers),
            None => Ok(()),
        }
    }

    /// The kept heads above a SPEED cut, when the policy has head exceptions.
    pub fn heads(&self) -> Option<&HeadExceptions> {
        match &self.rule {
            Resolved::Speed { heads } => heads.as_ref(),
            _ => None,
        }
    }

    /// Back to the written form with the cutoff as a layer count.
    pub fn spec(&self) -> PolicySpec {
        match self.rule {
            Resolved::Slim(params) => PolicySpec::slim(params.spec()),
            Resolved::Press(params) => PolicySpec::press(params),
            _ => PolicySpec {
                heads: self.heads().map(|h| h.choice),
                ..PolicySpec::at_cut(self.kind(), CutSpec::Layers(self.l_cut), self.anchors)
            },
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
            "swiftkv:4+bos",
            "swiftkv:2",
            "pop:4+bos",
            "pop:3",
        ] {
            assert_eq!(parse(s).to_string(), s);
        }
    }

    /// A resolved policy is stored as reports and traces have always
    /// stored it (family, cutoff, anchors, and only its own kind's
    /// parameters) and read back as the same value.
    #[test]
    fn resolved_policies_keep_their_stored_form() {
        for text in [
            "full",
            "speed:3+bos",
            "selfonly:2",
            "swiftkv:2+bos",
            "band:1..2",
            "slim:2@1+block:1+unit:1",
            "snapkv:0.5",
        ] {
            let policy = parse(text).resolve(6).unwrap();
            let stored = serde_json::to_value(policy).unwrap();
            let mut keys: Vec<&str> = stored
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            keys.sort();
            let mut expected = vec!["anchors", "kind", "l_cut", "num_layers", "slim"];
            if policy.press().is_some() {
                expected.push("press");
            }
            expected.sort();
            assert_eq!(keys, expected, "{text}");
            assert_eq!(stored["slim"].is_null(), policy.slim().is_none(), "{text}");
            assert_eq!(serde_json::from_value::<Policy>(stored).unwrap(), policy);
        }
    }

    /// A stored policy whose parameters belong to another kind, that lacks
    /// its own kind's, or whose cut lies past its depth is refused when
    /// read, not run as some other policy.
    #[test]
    fn a_stored_policy_with_another_kinds_parameters_is_refused() {
        let stored = |text: &str| serde_json::to_value(parse(text).resolve(6).unwrap()).unwrap();
        let (speed, slim, press) = (
            stored("speed:3"),
            stored("slim:2@1+block:1+unit:1"),
            stored("snapkv:0.5"),
        );
        let with = |base: &serde_json::Value, key: &str, value: &serde_json::Value| {
            let mut v = base.clone();
            v[key] = value.clone();
            v
        };
        let null = serde_json::Value::Null;
        let mut other_press = press.clone();
        other_press["press"]["name"] = serde_json::json!("Tova");
        for (bad, says) in [
            (
                with(&speed, "slim", &slim["slim"]),
                "SlimInfer's parameters",
            ),
            (
                with(&speed, "press", &press["press"]),
                "a press's parameters",
            ),
            (with(&slim, "slim", &null), "without its parameters"),
            (with(&press, "press", &null), "without its parameters"),
            (other_press, "with the parameters of"),
            (
                with(&speed, "l_cut", &serde_json::json!(7)),
                "a cutoff of 7 layers",
            ),
        ] {
            let err = serde_json::from_value::<Policy>(bad.clone()).unwrap_err();
            assert!(err.to_string().contains(says), "{bad}: {err}");
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
            "swiftkv:3+system",
            "pop:3+prefix:2",
            "swiftkv",
            "pop:",
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
    fn lists_keep_slim_cut_lists_whole() {
        assert_eq!(
            split_list("full,speed:3/4+bos,slim:4@2k,8@1k+block:16;slim:paper, selfonly:2"),
            vec![
                "full",
                "speed:3/4+bos",
                "slim:4@2k,8@1k+block:16",
                "slim:paper",
                "selfonly:2"
            ]
        );
        assert_eq!(split_list(""), Vec::<String>::new());
        let list = PolicySpec::parse_list("full, speed:2+bos").unwrap();
        assert_eq!(list, vec![PolicySpec::full(), parse("speed:2+bos")]);
        assert!(PolicySpec::parse_list("full,fast:2").is_err());
    }

    #[test]
    fn capabilities_replace_kind_checks() {
        let slim = parse("slim:1@50%").resolve(4).unwrap();
        assert!(!slim.is_static() && slim.needs_staged_prefill() && !slim.trainable());
        let speed = parse("speed:2+bos").resolve(4).unwrap();
        assert!(speed.is_static() && speed.trainable() && speed.reuses_full_prefill());
        assert!(!speed.needs_staged_prefill());
    }

    #[test]
    fn projected_kv_parses_under_both_names() {
        let swift = parse("swiftkv:24+bos");
        let pop = parse("POP:24+bos");
        assert_eq!(swift.kind, PolicyKind::Projected(ProjectedName::SwiftKv));
        assert_eq!(pop.kind, PolicyKind::Projected(ProjectedName::Pop));
        assert_eq!((pop.cut, pop.anchors), (CutSpec::Layers(24), Anchors::Bos));
        assert_eq!(pop.to_string(), "pop:24+bos");
        let p = parse("swiftkv:1/2").resolve(6).unwrap();
        assert_eq!((p.l_cut(), p.to_string()), (3, "swiftkv:3".to_string()));
        assert_eq!(
            split_list("full,swiftkv:3+bos;pop:2,speed:2"),
            vec!["full", "swiftkv:3+bos", "pop:2", "speed:2"]
        );
        let err = parse("swiftkv:7").resolve(6).unwrap_err();
        assert_eq!(
            err,
            PolicyError::CutOutOfRange {
                l_cut: 7,
                num_layers: 6
            }
        );
        let msg = "pop:3+system"
            .parse::<PolicySpec>()
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("pop keeps either no anchor or `+bos`"),
            "{msg}"
        );
    }

    #[test]
    fn projected_kv_is_static_untrained_and_prefills_on_its_own() {
        let p = parse("swiftkv:2+bos").resolve(4).unwrap();
        assert!(p.is_static() && !p.needs_staged_prefill());
        assert!(!p.trainable() && !p.reuses_full_prefill());
        let phases = TokenPhases::new(10, 7, 1).unwrap();
        assert_eq!(p.visibility(phases).kv_projected_at(3), Some(2));
        let at_depth = parse("pop:4").resolve(4).unwrap();
        assert!(at_depth.is_full_depth());
        assert_eq!(at_depth.visibility(phases).kv_projected_at(3), None);
    }

    #[test]
    fn knockout_and_bands_parse_print_and_check_their_layers() {
        assert_eq!(
            parse("knockout:4").kind,
            PolicyKind::Band { first: 4, last: 4 }
        );
        assert_eq!(parse("knockout:4").anchors, Anchors::Bos);
        assert_eq!(
            parse("band:2..5").kind,
            PolicyKind::Band { first: 2, last: 5 }
        );
        for s in [
            "knockout:4",
            "band:2..5",
            "knockout:0+prefix:3",
            "knockout:1+none",
        ] {
            assert_eq!(parse(s).to_string(), s);
        }
        let p = parse("band:2..5").resolve(6).unwrap();
        assert!(!p.is_full_depth() && p.reuses_full_prefill() && !p.trainable());
        assert_eq!(p.to_string(), "band:2..5");
        let err = parse("knockout:6").resolve(6).unwrap_err();
        assert!(matches!(err, PolicyError::BandOutOfRange { .. }), "{err}");
        assert!(err.to_string().contains("0 <= a <= b <= 5"), "{err}");
        for bad in [
            "band:5..2",
            "band:3",
            "knockout:x",
            "band:1..y",
            "knockout:",
        ] {
            let err = bad.parse::<PolicySpec>().unwrap_err();
            assert!(matches!(err, PolicyError::Malformed { .. }), "{bad}: {err}");
        }
        assert_eq!(
            split_list("full,knockout:3;band:1..2,speed:2"),
            vec!["full", "knockout:3", "band:1..2", "speed:2"]
        );
    }

    #[test]
    fn head_exceptions_parse_and_print_with_their_file_names() {
        let p = parse("speed:20+bos+heads:runs/Heads.json");
        assert_eq!(p.anchors, Anchors::Bos);
        assert_eq!(p.to_string(), "speed:20+bos+heads:runs/Heads.json");
        for s in [
            "speed:20+heads:6+ranking:r.json",
            "speed:20+bos+heads:6+ranking:r.json+window:64",
            "speed:20+system+window:32",
            "speed:0.75+prefix:2+heads:h.json",
        ] {
            assert_eq!(parse(s).to_string(), s);
        }
        for bad in [
            "speed:20+bos+heads:",
            "speed:20+ranking:r.json",
            "speed:20+heads:h.json+ranking:r.json",
            "speed:20+window:x",
            "speed:20+bos+bos",
            "selfonly:20+heads:4",
        ] {
            assert!(bad.parse::<PolicySpec>().is_err(), "{bad}");
        }
        // no ranking to take `heads:N` from
        let err = parse("speed:2+bos+heads:3").resolve(4).unwrap_err();
        assert_eq!(err, PolicyError::RankingMissing { count: 3 });
        // zero kept heads is SPEED itself, as a head policy
        let ranking = HeadRanking::default();
        let spec = parse("speed:2+bos+heads:3");
        let p = spec
            .resolve_for(&ModelDims::depth(4), Some(&ranking))
            .unwrap();
        assert_eq!(p.heads().map(|h| h.set.pairs().len()), Some(0));
        assert!(p.reuses_full_prefill() && !p.trainable());
    }

    #[test]
    fn presses_parse_resolve_and_list_as_policies() {
        let p = parse("SnapKV:0.5+window:4");
        assert_eq!(p.kind, PolicyKind::Press(PressName::SnapKv));
        assert_eq!(p.to_string(), "snapkv:0.5+window:4");
        let r = p.resolve(30).unwrap();
        assert_eq!(r.press().map(|x| x.window), Some(4));
        assert_eq!(r.to_string(), "snapkv:0.5+window:4");
        assert!(!r.is_static() && !r.is_full_depth() && !r.reuses_full_prefill());
        assert!(!r.trainable() && !r.needs_staged_prefill());
        assert_eq!(
            split_list("full,knorm:0.5;expected:0.25+sink:2,streamingllm:0.875"),
            vec![
                "full",
                "knorm:0.5",
                "expected:0.25+sink:2",
                "streamingllm:0.875"
            ]
        );
        // the prompt is checked against the press
        let phases = TokenPhases::new(20, 12, 0).unwrap();
        assert!(r.check_phases(&phases).is_ok());
        let short = TokenPhases::new(20, 4, 0).unwrap();
        let err = r.check_phases(&short).unwrap_err();
        assert!(matches!(err, PolicyError::PressPrompt { .. }), "{err}");
        let vis = r.visibility(phases);
        assert!(
            vis.dynamic()
                .is_some_and(|d| d.decides_at_prompt_end() && !d.is_decided())
        );
        // 30 layers x 6 of the 12 prompt positions
        assert_eq!(vis.accounting().held_token_layers(0), 180);
        assert!("knorm:2".parse::<PolicySpec>().is_err());
    }

    #[test]
    fn cut_at_depth_is_full() {
        let p = Policy::new(PolicyKind::Speed, 4, 4, Anchors::None).unwrap();
        assert!(p.is_full_depth());
    }

    #[test]
    fn full_depth_below_is_where_the_rule_first_parts_from_the_full_model() {
        // 12 prompt tokens (decode phase from 8) and 4 generated
        let phases = TokenPhases::new(12, 8, 1).unwrap();
        let total = 16;
        let as_full = |vis: &dyn Visibility, l: usize| {
            (0..total).all(|q| vis.token_exists(l, q) && (0..=q).all(|k| vis.key_visible(l, q, k)))
        };
        let cases = [
            ("full", 6),
            ("speed:3+bos", 3),
            ("speed:3", 3),
            ("speed:6", 6),
            ("selfonly:2", 2),
            ("swiftkv:4+bos", 4),
            ("band:2..3", 2),
            ("knockout:5", 5),
        ];
        for (spec, below) in cases {
            let p = parse(spec).resolve(6).unwrap();
            assert_eq!(p.full_depth_below(), below, "{spec}");
            let vis = p.visibility(phases);
            assert!((0..below).all(|l| as_full(vis.as_ref(), l)), "{spec}");
            // the first layer above is where the policy parts
            assert!(below == 6 || !as_full(vis.as_ref(), below), "{spec}");
        }
        // a policy that decides as it runs claims no layer
        for spec in ["slim:2@50%", "snapkv:0.5"] {
            assert_eq!(
                parse(spec).resolve(6).unwrap().full_depth_below(),
                0,
                "{spec}"
            );
        }
    }
}
