//! SlimInfer as a policy value: cut layers, token budgets and the scorer's
//! options, as written (`slim:9@50%,18@25%+block:8`) and resolved against a
//! model's depth. The blocks a run keeps depend on the prompt, so they live
//! with the running sequence ([`crate::SlimSelection`]), not here.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::cut::{CutSpec, parse_cut};
use crate::error::PolicyError;

/// Most cut layers one SlimInfer policy may have (keeps the policy `Copy`).
pub const MAX_SLIM_CUTS: usize = 8;

/// How many prompt tokens a cut keeps (sink included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Budget {
    /// An absolute token count (`8192`, `8k`).
    Tokens(usize),
    /// A share of the prompt before the decode start, in hundredths of a
    /// percent (`25%` is 2500).
    Share(u32),
}

impl Budget {
    /// The budget in tokens for a prompt whose decode phase starts at
    /// `decode_start` (a share rounds up).
    pub fn tokens(&self, decode_start: usize) -> usize {
        match *self {
            Budget::Tokens(n) => n,
            Budget::Share(bp) => (decode_start as u64 * bp as u64).div_ceil(10_000) as usize,
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Budget::Tokens(n) if n >= 1024 && n % 1024 == 0 => write!(f, "{}k", n / 1024),
            Budget::Tokens(n) => write!(f, "{n}"),
            Budget::Share(bp) if bp % 100 == 0 => write!(f, "{}%", bp / 100),
            Budget::Share(bp) => write!(f, "{}%", bp as f64 / 100.0),
        }
    }
}

/// How a block's keys are summarised for scoring (the paper's Table 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScoreMode {
    /// Mean key per unit of `u` tokens; a block scores its best unit.
    Unit,
    /// One mean key per block (AvgPooling).
    Avg,
    /// The element-wise maximum key per block (MaxPooling).
    Max,
}

impl ScoreMode {
    fn name(&self) -> &'static str {
        match self {
            ScoreMode::Unit => "unit",
            ScoreMode::Avg => "avg",
            ScoreMode::Max => "max",
        }
    }
}

/// The scorer's and the KV manager's options, shared by the written and
/// the resolved form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlimOptions {
    /// Block size B in tokens.
    pub block: usize,
    /// Token unit u (divides B).
    pub unit: usize,
    /// Query window w: the mean query of the last w tokens scores the blocks.
    pub window: usize,
    /// Swap threshold γ in millionths: a decode step adopts its candidate
    /// blocks when their overlap with the active ones is below γ.
    pub swap_ppm: u32,
    /// Attention-sink blocks kept at every layer (a prefix of `sink·B` tokens).
    pub sink: usize,
    /// Block summary used by the scorer.
    pub score: ScoreMode,
}

impl Default for SlimOptions {
    fn default() -> Self {
        Self {
            block: 64,
            unit: 8,
            window: 4,
            swap_ppm: 900_000,
            sink: 1,
            score: ScoreMode::Unit,
        }
    }
}

impl SlimOptions {
    /// The swap threshold γ in [0, 1].
    pub fn gamma(&self) -> f64 {
        self.swap_ppm as f64 / 1e6
    }
}

/// A SlimInfer policy as written, before the model's depth is known.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SlimSpec {
    cuts: [CutSpec; MAX_SLIM_CUTS],
    budgets: [Budget; MAX_SLIM_CUTS],
    len: usize,
    /// Written as `slim:paper`: cuts that resolve to the depth or repeat
    /// are dropped on shallow models instead of refused.
    preset: bool,
    /// Options.
    pub options: SlimOptions,
}

/// The paper's LLaMA-3.1 configuration as fractions of depth.
const PAPER: [(f64, usize); 3] = [(5.0 / 16.0, 8192), (5.0 / 8.0, 4096), (15.0 / 16.0, 2048)];

impl SlimSpec {
    /// The cut layers as written.
    pub fn cuts(&self) -> &[CutSpec] {
        &self.cuts[..self.len]
    }

    /// The budgets as written, one per cut.
    pub fn budgets(&self) -> &[Budget] {
        &self.budgets[..self.len]
    }

    /// A spec from cuts and budgets (as the parser builds it).
    pub fn new(pairs: &[(CutSpec, Budget)], options: SlimOptions) -> Result<Self, String> {
        if pairs.is_empty() || pairs.len() > MAX_SLIM_CUTS {
            return Err(format!(
                "{} cut layers given; expected 1..={MAX_SLIM_CUTS}",
                pairs.len()
            ));
        }
        let mut cuts = [CutSpec::Layers(1); MAX_SLIM_CUTS];
        let mut budgets = [Budget::Tokens(0); MAX_SLIM_CUTS];
        for (i, (c, b)) in pairs.iter().enumerate() {
            cuts[i] = *c;
            budgets[i] = *b;
        }
        let spec = Self {
            cuts,
            budgets,
            len: pairs.len(),
            preset: false,
            options,
        };
        spec.check()?;
        Ok(spec)
    }

    /// `slim:paper`: cuts at 5/16, 5/8 and 15/16 of depth keeping 8K, 4K and
    /// 2K prompt tokens (LLaMA-3.1's 10/20/30 of 32 layers).
    pub fn paper(options: SlimOptions) -> Self {
        let pairs: Vec<(CutSpec, Budget)> = PAPER
            .iter()
            .map(|&(f, k)| (CutSpec::Fraction(f), Budget::Tokens(k)))
            .collect();
        let mut spec = Self::new(&pairs, SlimOptions::default()).expect("the preset is valid");
        spec.preset = true;
        spec.options = options;
        spec
    }

    fn check(&self) -> Result<(), String> {
        let o = &self.options;
        if o.block == 0 {
            return Err("block size must be at least 1".into());
        }
        if o.unit == 0 || !o.block.is_multiple_of(o.unit) {
            return Err(format!(
                "unit {} must divide the block size {}",
                o.unit, o.block
            ));
        }
        if o.window == 0 {
            return Err("the query window must be at least 1 token".into());
        }
        if o.swap_ppm > 1_000_000 {
            return Err(format!("swap threshold {} is not in [0, 1]", o.gamma()));
        }
        for (i, b) in self.budgets().iter().enumerate() {
            match *b {
                Budget::Tokens(0) => return Err(format!("budget {} of cut {} is zero", b, i + 1)),
                Budget::Share(bp) if bp == 0 || bp > 10_000 => {
                    return Err(format!("budget {b} of cut {} is not in (0%, 100%]", i + 1));
                }
                _ => {}
            }
        }
        for w in self.budgets().windows(2) {
            let increasing = match (w[0], w[1]) {
                (Budget::Tokens(a), Budget::Tokens(b)) => b > a,
                (Budget::Share(a), Budget::Share(b)) => b > a,
                _ => false,
            };
            if increasing {
                return Err(format!(
                    "budgets must not increase with depth ({} then {})",
                    w[0], w[1]
                ));
            }
        }
        Ok(())
    }

    /// Fix the cut layers for a model of `num_layers` layers.
    pub fn resolve(&self, num_layers: usize) -> Result<SlimParams, PolicyError> {
        let mut cuts = [0usize; MAX_SLIM_CUTS];
        let mut budgets = [Budget::Tokens(0); MAX_SLIM_CUTS];
        let mut len = 0;
        for (c, b) in self.cuts().iter().zip(self.budgets()) {
            let cut = match *c {
                CutSpec::Layers(n) => n,
                CutSpec::Fraction(f) => (f * num_layers as f64).round() as usize,
            };
            let previous = if len == 0 { 0 } else { cuts[len - 1] };
            let in_range = (1..num_layers).contains(&cut) && cut > previous;
            if !in_range {
                if self.preset {
                    continue;
                }
                return Err(PolicyError::SlimCutOutOfRange {
                    cut,
                    previous,
                    num_layers,
                });
            }
            cuts[len] = cut;
            budgets[len] = *b;
            len += 1;
        }
        if len == 0 {
            return Err(PolicyError::SlimCutOutOfRange {
                cut: 0,
                previous: 0,
                num_layers,
            });
        }
        Ok(SlimParams {
            cuts,
            budgets,
            len,
            options: self.options,
        })
    }

    /// Parse the part after `slim:` (cuts and budgets, then `+options`).
    pub(crate) fn parse(text: &str, body: &str) -> Result<Self, PolicyError> {
        let bad = |reason: String| PolicyError::Malformed {
            text: text.to_string(),
            reason,
        };
        let mut parts = body.split('+');
        let head = parts.next().unwrap_or_default();
        let mut options = SlimOptions::default();
        let mut unit_given = false;
        for opt in parts {
            unit_given |= opt.starts_with("unit:");
            parse_option(opt, &mut options).map_err(bad)?;
        }
        // a block smaller than the default unit gets units that divide it
        if !unit_given && options.block > 0 && options.block % options.unit != 0 {
            options.unit = gcd(options.block, options.unit);
        }
        if head == "paper" {
            let spec = Self::paper(options);
            spec.check().map_err(bad)?;
            return Ok(spec);
        }
        if head.is_empty() {
            return Err(bad("the cut layers are missing (write `slim:C@K`)".into()));
        }
        let mut pairs = Vec::new();
        for pair in head.split(',') {
            let (cut, budget) = pair
                .split_once('@')
                .ok_or_else(|| bad(format!("cut {pair:?} has no `@budget`")))?;
            if cut.is_empty() {
                return Err(bad(format!("cut {pair:?} has no layer before `@`")));
            }
            pairs.push((parse_cut(text, cut)?, parse_budget(budget).map_err(bad)?));
        }
        Self::new(&pairs, options).map_err(bad)
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn parse_budget(text: &str) -> Result<Budget, String> {
    if let Some(share) = text.strip_suffix('%') {
        let x: f64 = share
            .parse()
            .map_err(|_| format!("budget share {text:?} is not a percentage"))?;
        if !(x > 0.0 && x <= 100.0) {
            return Err(format!("budget share {text:?} is not in (0%, 100%]"));
        }
        return Ok(Budget::Share((x * 100.0).round() as u32));
    }
    let (digits, scale) = match text.strip_suffix('k') {
        Some(d) => (d, 1024),
        None => (text, 1),
    };
    let n: usize = digits.parse().map_err(|_| {
        format!("budget {text:?} is neither a token count (8192, 8k) nor a share (25%)")
    })?;
    n.checked_mul(scale)
        .map(Budget::Tokens)
        .ok_or_else(|| format!("budget {text:?} is too large"))
}

fn parse_option(text: &str, o: &mut SlimOptions) -> Result<(), String> {
    let (name, value) = text
        .split_once(':')
        .ok_or_else(|| format!("option {text:?} has no `:value`"))?;
    let count = |what: &str| -> Result<usize, String> {
        value
            .parse()
            .map_err(|_| format!("{what} {value:?} is not a count"))
    };
    match name {
        "block" => o.block = count("block size")?,
        "unit" => o.unit = count("unit")?,
        "window" => o.window = count("window")?,
        "sink" => o.sink = count("sink")?,
        "swap" => {
            let g: f64 = value
                .parse()
                .map_err(|_| format!("swap threshold {value:?} is not a number"))?;
            if !(0.0..=1.0).contains(&g) {
                return Err(format!("swap threshold {value} is not in [0, 1]"));
            }
            o.swap_ppm = (g * 1e6).round() as u32;
        }
        "score" => {
            o.score = match value {
                "unit" => ScoreMode::Unit,
                "avg" => ScoreMode::Avg,
                "max" => ScoreMode::Max,
                _ => return Err(format!("score {value:?} is not unit, avg or max")),
            }
        }
        _ => {
            return Err(format!(
                "unknown option {name:?} (expected block, unit, window, swap, sink or score)"
            ));
        }
    }
    Ok(())
}

impl fmt::Display for SlimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slim:")?;
        if self.preset {
            write!(f, "paper")?;
        } else {
            for (i, (c, b)) in self.cuts().iter().zip(self.budgets()).enumerate() {
                let sep = if i == 0 { "" } else { "," };
                write!(f, "{sep}{c}@{b}")?;
            }
        }
        write!(f, "{}", OptionSuffix(self.options))
    }
}

/// The options that differ from the defaults, as `+name:value`.
struct OptionSuffix(SlimOptions);

impl fmt::Display for OptionSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (o, d) = (self.0, SlimOptions::default());
        if o.block != d.block {
            write!(f, "+block:{}", o.block)?;
        }
        if o.unit != d.unit {
            write!(f, "+unit:{}", o.unit)?;
        }
        if o.window != d.window {
            write!(f, "+window:{}", o.window)?;
        }
        if o.swap_ppm != d.swap_ppm {
            write!(f, "+swap:{}", o.gamma())?;
        }
        if o.sink != d.sink {
            write!(f, "+sink:{}", o.sink)?;
        }
        if o.score != d.score {
            write!(f, "+score:{}", o.score.name())?;
        }
        Ok(())
    }
}

/// A SlimInfer policy resolved against a model's depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SlimParams {
    cuts: [usize; MAX_SLIM_CUTS],
    budgets: [Budget; MAX_SLIM_CUTS],
    len: usize,
    /// Options.
    pub options: SlimOptions,
}

impl SlimParams {
    /// The cut layers c_1 < c_2 < ...: layer c_i is the first that holds
    /// only cut i's kept blocks.
    pub fn cuts(&self) -> &[usize] {
        &self.cuts[..self.len]
    }

    /// The budgets, one per cut.
    pub fn budgets(&self) -> &[Budget] {
        &self.budgets[..self.len]
    }

    /// Which segment `layer` is in: 0 below c_1, i for c_i <= layer < c_{i+1}.
    pub fn segment(&self, layer: usize) -> usize {
        self.cuts().partition_point(|&c| c <= layer)
    }

    /// Number of sink tokens for a prompt whose decode phase starts at
    /// `decode_start` (`sink·B`, clamped to it).
    pub fn sink_len(&self, decode_start: usize) -> usize {
        (self.options.sink * self.options.block).min(decode_start)
    }

    /// Number of non-sink blocks cut `i` (0-based) keeps at most: the budget
    /// in blocks (`max(sink, ⌈K/B⌉)`) less the sink.
    pub fn kept_blocks(&self, i: usize, decode_start: usize) -> usize {
        let k = self.budgets()[i].tokens(decode_start);
        let blocks = k.div_ceil(self.options.block).max(self.options.sink);
        blocks - self.options.sink
    }

    /// P_i predicted for a prompt of `prefill` prunable tokens whose decode
    /// phase starts at `decode_start`: whole kept blocks,
    /// `P_i = min(P_{i-1}, P, (k_i − sink)·B)`.
    pub fn predicted_kept_tokens(&self, prefill: usize, decode_start: usize) -> Vec<usize> {
        let mut last = prefill;
        (0..self.cuts().len())
            .map(|i| {
                last = last.min(self.kept_blocks(i, decode_start) * self.options.block);
                last
            })
            .collect()
    }

    /// The SPEED cutoff holding the same prompt K/V for `prefill` prunable
    /// tokens keeping `kept[i]` at cut i in a model of `num_layers` layers:
    /// `L_eq = c_1 + Σ_i (c_{i+1} − c_i)·P_i / P` (§4.7).
    /// With no prunable prompt nothing is cut: the depth.
    pub fn equal_kv_cutoff(&self, num_layers: usize, prefill: usize, kept: &[usize]) -> f64 {
        if prefill == 0 {
            return num_layers as f64;
        }
        let cuts = self.cuts();
        let mut l_eq = cuts[0] as f64;
        for (i, &p_i) in kept.iter().enumerate().take(cuts.len()) {
            let next = cuts.get(i + 1).copied().unwrap_or(num_layers);
            l_eq += (next - cuts[i]) as f64 * p_i as f64 / prefill.max(1) as f64;
        }
        l_eq
    }

    /// Back to the written form with cuts as layer counts.
    pub fn spec(&self) -> SlimSpec {
        let pairs: Vec<(CutSpec, Budget)> = self
            .cuts()
            .iter()
            .zip(self.budgets())
            .map(|(&c, &b)| (CutSpec::Layers(c), b))
            .collect();
        let mut spec = SlimSpec::new(&pairs, SlimOptions::default()).expect("resolved is valid");
        spec.options = self.options;
        spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PolicySpec;

    fn slim(s: &str) -> SlimSpec {
        match s.parse::<PolicySpec>() {
            Ok(p) => p.slim.expect("a slim policy"),
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn parses_cuts_budgets_and_options() {
        let s = slim("slim:9@12k,18@6k,26@4k");
        assert_eq!(
            s.cuts(),
            &[CutSpec::Layers(9), CutSpec::Layers(18), CutSpec::Layers(26)]
        );
        assert_eq!(
            s.budgets(),
            &[
                Budget::Tokens(12288),
                Budget::Tokens(6144),
                Budget::Tokens(4096)
            ]
        );
        assert_eq!(s.options, SlimOptions::default());
        let s = slim("slim:2@50%+block:8+unit:2+window:2+swap:0+sink:0+score:max");
        assert_eq!(s.budgets(), &[Budget::Share(5000)]);
        let o = s.options;
        assert_eq!(
            (o.block, o.unit, o.window, o.swap_ppm, o.sink, o.score),
            (8, 2, 2, 0, 0, ScoreMode::Max)
        );
        assert_eq!(slim("slim:3/4@100").cuts(), &[CutSpec::Fraction(0.75)]);
        // without `+unit`, a block smaller than 8 gets units that divide it
        assert_eq!(slim("slim:3@50%+block:4").options.unit, 4);
        assert_eq!(slim("slim:3@50%+block:12").options.unit, 4);
        assert_eq!(
            slim("slim:3@50%+block:12").to_string(),
            "slim:3@50%+block:12+unit:4"
        );
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "slim:9@12k,18@6k,26@4k",
            "slim:paper",
            "slim:paper+swap:0",
            "slim:2@50%+block:8+unit:2",
            "slim:1@12.5%,3@100+window:1+sink:0+score:avg",
            "slim:0.3125@8k,0.625@4k+swap:0.95",
            "slim:0.3@64",
        ] {
            let spec = slim(s);
            assert_eq!(spec.to_string(), s);
            assert_eq!(slim(&spec.to_string()), spec);
        }
        let written = slim("slim:5/16@8k,3/4@4k");
        assert_eq!(slim(&written.to_string()), written);
    }

    #[test]
    fn the_paper_preset_resolves_as_the_paper_and_drops_cuts_on_shallow_models() {
        let p = slim("slim:paper");
        assert_eq!(p.resolve(32).unwrap().cuts(), &[10, 20, 30]);
        assert_eq!(p.resolve(28).unwrap().cuts(), &[9, 18, 26]);
        assert_eq!(p.resolve(4).unwrap().cuts(), &[1, 3]);
        assert_eq!(p.resolve(30).unwrap().cuts(), &[9, 19, 28]);
    }

    #[test]
    fn bad_spellings_are_named() {
        for bad in [
            "slim:",
            "slim:3",
            "slim:@8k",
            "slim:3@",
            "slim:3@x",
            "slim:3@0",
            "slim:3@0%",
            "slim:3@101%",
            "slim:3@8k+block:0",
            "slim:3@8k+unit:3",
            "slim:3@8k+unit:0",
            "slim:3@8k+window:0",
            "slim:3@8k+swap:1.5",
            "slim:3@8k+swap:x",
            "slim:3@8k+sink:-1",
            "slim:3@8k+score:mean",
            "slim:3@8k+color:red",
            "slim:3@8k+block",
            "slim:2@4k,3@8k",
            "slim:1@1,2@2,3@3,4@4,5@5,6@6,7@7,8@8,9@9",
        ] {
            let err = bad.parse::<PolicySpec>().unwrap_err();
            assert!(matches!(err, PolicyError::Malformed { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn cuts_out_of_range_or_not_increasing_are_errors() {
        for (s, layers) in [
            ("slim:4@8", 4),
            ("slim:0@8", 4),
            ("slim:2@8,2@4", 4),
            ("slim:3@8,2@4", 4),
        ] {
            let err = slim(s).resolve(layers).unwrap_err();
            assert!(
                matches!(err, PolicyError::SlimCutOutOfRange { .. }),
                "{s}: {err}"
            );
        }
    }

    #[test]
    fn budgets_resolve_to_blocks_as_specified() {
        let p = slim("slim:1@100,2@64,3@1").resolve(4).unwrap();
        // K = 100: ⌈100/64⌉ = 2 blocks, the sink is one of them
        assert_eq!(p.kept_blocks(0, 1000), 1);
        assert_eq!(p.kept_blocks(1, 1000), 0);
        // K smaller than the sink: the sink alone
        assert_eq!(p.kept_blocks(2, 1000), 0);
        let p = slim("slim:1@25%+block:8").resolve(4).unwrap();
        // 25% of 100 tokens = 25 -> 4 blocks of 8, one of them the sink
        assert_eq!(p.kept_blocks(0, 100), 3);
        assert_eq!(Budget::Share(3333).tokens(10), 4);
        assert_eq!(p.sink_len(5), 5);
        assert_eq!(p.sink_len(100), 8);
        assert_eq!(p.segment(0), 0);
        assert_eq!(p.segment(1), 1);
    }
}
