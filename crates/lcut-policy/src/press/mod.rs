//! kvpress's presses as policies: after the prompt (kvpress's context) has
//! run at full depth, each layer keeps, per K/V head or for the whole
//! layer, the prompt positions its press scores highest; the decode phase
//! (the question and the answer) runs after, at every layer, reading the
//! compressed cache. The ratio R is kvpress's `compression_ratio`: the share
//! of the prompt's K/V removed. Written `NAME:R[+option:value...]`:
//!
//! - `streamingllm:R[+sink:N]` ([`streaming_llm`]): the first N positions
//!   and the latest ones, the same at every layer and head;
//! - `snapkv:R[+window:W][+kernel:K]` ([`snapkv`]): the last W prompt
//!   queries' attention, pooled, per K/V head;
//! - `pyramidkv:R[+window:W][+kernel:K][+beta:B]` ([`pyramidkv`]): SnapKV's
//!   scores with a budget falling from the lowest layer to the top;
//! - `knorm:R` ([`knorm`]): the keys of smallest norm, per K/V head;
//! - `tova:R` ([`tova`]): the last prompt query's attention averaged over
//!   every head, the same for each head of a layer;
//! - `expected:R[+sink:N][+future:F][+cov:off][+vnorm:off][+epsilon:E]`
//!   ([`expected`]): the attention queries are expected to pay, from the
//!   prompt queries' mean and covariance rotated over the next F positions.
//!
//! The decisions live with the running sequence ([`PressRun`]).

mod expected;
mod knorm;
mod math;
mod memo;
mod pyramidkv;
mod run;
mod snapkv;
mod streaming_llm;
mod tova;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;

pub use run::{PressObservation, PressRun};

/// Which press.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PressName {
    /// StreamingLLM: sink and recent window (`streamingllm`).
    StreamingLlm,
    /// SnapKV: observation-window attention, pooled, per K/V head (`snapkv`).
    SnapKv,
    /// PyramidKV: SnapKV's scores under a pyramid of layer budgets (`pyramidkv`).
    PyramidKv,
    /// KNorm: the smallest key norms (`knorm`).
    Knorm,
    /// TOVA: the last query's attention averaged over heads (`tova`).
    Tova,
    /// Expected Attention: kvpress's own (`expected`).
    Expected,
}

/// Every press, in the order the documentation lists them.
pub const PRESSES: [PressName; 6] = [
    PressName::StreamingLlm,
    PressName::SnapKv,
    PressName::PyramidKv,
    PressName::Knorm,
    PressName::Tova,
    PressName::Expected,
];

impl PressName {
    /// The name written before `:`.
    pub fn as_str(&self) -> &'static str {
        match self {
            PressName::StreamingLlm => "streamingllm",
            PressName::SnapKv => "snapkv",
            PressName::PyramidKv => "pyramidkv",
            PressName::Knorm => "knorm",
            PressName::Tova => "tova",
            PressName::Expected => "expected",
        }
    }

    /// The press written `name` (lower case).
    pub fn from_name(name: &str) -> Option<Self> {
        PRESSES.into_iter().find(|p| p.as_str() == name)
    }

    /// kvpress's class of this press.
    pub fn kvpress_class(&self) -> &'static str {
        match self {
            PressName::StreamingLlm => "StreamingLLMPress",
            PressName::SnapKv => "SnapKVPress",
            PressName::PyramidKv => "PyramidKVPress",
            PressName::Knorm => "KnormPress",
            PressName::Tova => "TOVAPress",
            PressName::Expected => "ExpectedAttentionPress",
        }
    }

    /// Whether each K/V head keeps its own positions (false: every head of
    /// a layer keeps the same ones).
    pub fn is_head_wise(&self) -> bool {
        !matches!(self, PressName::StreamingLlm | PressName::Tova)
    }

    /// The options this press takes after `+`.
    fn options(&self) -> &'static [&'static str] {
        match self {
            PressName::StreamingLlm => &["sink"],
            PressName::SnapKv => &["window", "kernel"],
            PressName::PyramidKv => &["window", "kernel", "beta"],
            PressName::Knorm | PressName::Tova => &[],
            PressName::Expected => &["sink", "future", "cov", "vnorm", "epsilon"],
        }
    }
}

impl fmt::Display for PressName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A press with its ratio and options (kvpress's defaults where not
/// written).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PressParams {
    /// Which press.
    pub name: PressName,
    /// kvpress's `compression_ratio`: the share of the prompt's K/V
    /// removed, in (0, 1).
    pub ratio: f64,
    /// Sink positions always kept (`n_sink`; StreamingLLM, Expected
    /// Attention): 4.
    pub sink: usize,
    /// Observation window (`window_size`; SnapKV, PyramidKV): 64.
    pub window: usize,
    /// Pooling kernel, odd (`kernel_size`; SnapKV, PyramidKV): 5.
    pub kernel: usize,
    /// Pyramid steepness (`beta`; PyramidKV): 20.
    pub beta: usize,
    /// Future positions the query statistics are rotated over
    /// (`n_future_positions`; Expected Attention): 512.
    pub future: usize,
    /// Use the queries' covariance (`use_covariance`): on.
    pub covariance: bool,
    /// Scale scores by the value norms (`use_vnorm`): on.
    pub vnorm: bool,
    /// Added to the scores before the value-norm scaling (`epsilon`): 0.
    pub epsilon: f64,
}

// the ratio is checked to lie in (0, 1) and epsilon to be finite: no NaN
impl Eq for PressParams {}

impl PressParams {
    /// `name` at `ratio` with kvpress's defaults.
    pub fn new(name: PressName, ratio: f64) -> Self {
        Self {
            name,
            ratio,
            sink: 4,
            window: 64,
            kernel: 5,
            beta: 20,
            future: 512,
            covariance: true,
            vnorm: true,
            epsilon: 0.0,
        }
    }

    /// Parse the part after `NAME:` (`0.5+window:32`) of the press `name`;
    /// `text` is the whole policy, for errors.
    pub(crate) fn parse(text: &str, name: PressName, body: &str) -> Result<Self, PolicyError> {
        let bad = |reason: String| PolicyError::Malformed {
            text: text.to_string(),
            reason,
        };
        let mut parts = body.split('+');
        let ratio_text = parts.next().unwrap_or_default().trim();
        if ratio_text.is_empty() {
            return Err(bad(format!(
                "the compression ratio is missing (write `{name}:R`, R in (0, 1): the share of \
                 the prompt's K/V removed)"
            )));
        }
        let ratio: f64 = ratio_text
            .parse()
            .map_err(|_| bad(format!("compression ratio {ratio_text:?} is not a number")))?;
        let mut p = Self::new(name, ratio);
        for opt in parts {
            p.set_option(opt).map_err(bad)?;
        }
        p.check().map_err(bad)?;
        Ok(p)
    }

    /// Set one `name:value` option.
    fn set_option(&mut self, text: &str) -> Result<(), String> {
        let (key, value) = text
            .split_once(':')
            .ok_or_else(|| format!("option {text:?} has no `:value`"))?;
        let key = key.trim().to_ascii_lowercase();
        let value = value.trim();
        if !self.name.options().contains(&key.as_str()) {
            let known = match self.name.options() {
                [] => "none".to_string(),
                o => o.join(", "),
            };
            return Err(format!(
                "{} takes no option {key:?} (its options: {known})",
                self.name
            ));
        }
        let count = |what: &str| -> Result<usize, String> {
            value
                .parse()
                .map_err(|_| format!("{what} {value:?} is not a count"))
        };
        let switch = |what: &str| -> Result<bool, String> {
            match value {
                "on" => Ok(true),
                "off" => Ok(false),
                _ => Err(format!("{what} {value:?} is neither on nor off")),
            }
        };
        match key.as_str() {
            "sink" => self.sink = count("sink")?,
            "window" => self.window = count("window")?,
            "kernel" => self.kernel = count("kernel")?,
            "beta" => self.beta = count("beta")?,
            "future" => self.future = count("future positions")?,
            "cov" => self.covariance = switch("cov")?,
            "vnorm" => self.vnorm = switch("vnorm")?,
            _ => {
                self.epsilon = value
                    .parse()
                    .map_err(|_| format!("epsilon {value:?} is not a number"))?
            }
        }
        Ok(())
    }

    /// The ratio and options a press can run with, whatever the prompt.
    fn check(&self) -> Result<(), String> {
        if !(self.ratio > 0.0 && self.ratio < 1.0) {
            return Err(format!(
                "compression ratio {} is not in (0, 1) (the share of the prompt's K/V removed)",
                self.ratio
            ));
        }
        match self.name {
            PressName::SnapKv | PressName::PyramidKv if self.window == 0 => {
                Err("the observation window must hold at least one query".into())
            }
            PressName::SnapKv | PressName::PyramidKv if self.kernel.is_multiple_of(2) => {
                Err(format!(
                    "kernel {} is even: kvpress pools with an odd kernel (its output would be one \
                 position longer than its input)",
                    self.kernel
                ))
            }
            PressName::PyramidKv if self.beta == 0 => Err("beta must be at least 1".into()),
            PressName::Expected if self.future == 0 => {
                Err("the query statistics need at least one future position".into())
            }
            PressName::Expected if !self.epsilon.is_finite() => {
                Err(format!("epsilon {} is not finite", self.epsilon))
            }
            _ => Ok(()),
        }
    }

    /// Prompt positions the press keeps whatever their scores (sinks, the
    /// observation window, TOVA's last position).
    pub fn always_kept(&self) -> usize {
        match self.name {
            PressName::StreamingLlm | PressName::Expected => self.sink,
            PressName::SnapKv | PressName::PyramidKv => self.window,
            PressName::Tova => 1,
            PressName::Knorm => 0,
        }
    }

    /// Prompt positions each K/V head of `layer` (of `num_layers`) keeps of
    /// a prompt of `prompt` tokens: kvpress's `compute_n_kept`,
    /// `max(1, int(prompt * (1 - R)))`, or PyramidKV's layer budget.
    pub fn kept_at(&self, layer: usize, num_layers: usize, prompt: usize) -> usize {
        match self.name {
            PressName::PyramidKv => pyramidkv::layer_budget(self, layer, num_layers, prompt),
            _ => kept_of(prompt, self.ratio),
        }
        .min(prompt)
    }

    /// Refuse a prompt of `prompt` tokens this press cannot compress as
    /// kvpress does: an empty one, one no longer than the positions it
    /// always keeps (kvpress asserts), or a budget below them at some layer
    /// (kvpress would then keep an arbitrary subset of equal scores).
    pub fn check_prompt(&self, prompt: usize, num_layers: usize) -> Result<(), PolicyError> {
        let refuse = |reason: String| PolicyError::PressPrompt {
            policy: self.to_string(),
            prompt,
            reason,
        };
        if prompt == 0 {
            return Err(refuse("there is no prompt to compress".into()));
        }
        let (what, option) = match self.name {
            PressName::StreamingLlm | PressName::Expected => ("sink positions", "sink"),
            PressName::SnapKv | PressName::PyramidKv => ("observation window", "window"),
            PressName::Tova | PressName::Knorm => ("", ""),
        };
        let always = self.always_kept();
        if !option.is_empty() && prompt <= always {
            return Err(refuse(format!(
                "its {what} ({always}) must be shorter than the prompt (write `+{option}:N` with \
                 N < {prompt})"
            )));
        }
        if let Some(layer) = (0..num_layers).find(|&l| self.kept_at(l, num_layers, prompt) < always)
        {
            let kept = self.kept_at(layer, num_layers, prompt);
            return Err(refuse(format!(
                "it keeps {kept} position(s) at layer {layer}, fewer than its {always} {what}, \
                 which it always keeps (a lower ratio or a smaller `+{option}:N`)"
            )));
        }
        Ok(())
    }
}

/// kvpress's `compute_n_kept`: `max(1, int(prompt * (1 - ratio)))`.
pub(crate) fn kept_of(prompt: usize, ratio: f64) -> usize {
    ((prompt as f64 * (1.0 - ratio)) as usize).max(1)
}

impl fmt::Display for PressParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = Self::new(self.name, self.ratio);
        write!(f, "{}:{}", self.name, self.ratio)?;
        let on = |b: bool| if b { "on" } else { "off" };
        for key in self.name.options() {
            match *key {
                "sink" if self.sink != d.sink => write!(f, "+sink:{}", self.sink)?,
                "window" if self.window != d.window => write!(f, "+window:{}", self.window)?,
                "kernel" if self.kernel != d.kernel => write!(f, "+kernel:{}", self.kernel)?,
                "beta" if self.beta != d.beta => write!(f, "+beta:{}", self.beta)?,
                "future" if self.future != d.future => write!(f, "+future:{}", self.future)?,
                "cov" if self.covariance != d.covariance => {
                    write!(f, "+cov:{}", on(self.covariance))?
                }
                "vnorm" if self.vnorm != d.vnorm => write!(f, "+vnorm:{}", on(self.vnorm))?,
                "epsilon" if self.epsilon != d.epsilon => write!(f, "+epsilon:{}", self.epsilon)?,
                _ => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PressParams, PolicyError> {
        let (name, body) = text.split_once(':').expect("a name");
        PressParams::parse(text, PressName::from_name(name).expect("a press"), body)
    }

    #[test]
    fn presses_parse_with_kvpress_defaults_and_print_back() {
        let p = parse("snapkv:0.5").unwrap();
        assert_eq!((p.window, p.kernel, p.ratio), (64, 5, 0.5));
        let e = parse("expected:0.25").unwrap();
        assert_eq!(
            (e.sink, e.future, e.covariance, e.vnorm),
            (4, 512, true, true)
        );
        for text in [
            "streamingllm:0.5",
            "streamingllm:0.875+sink:8",
            "snapkv:0.25+window:32+kernel:7",
            "pyramidkv:0.75+beta:10",
            "knorm:0.5",
            "tova:0.5",
            "expected:0.5+sink:2+future:64+cov:off+vnorm:off+epsilon:0.01",
        ] {
            assert_eq!(parse(text).unwrap().to_string(), text);
        }
        // defaults written out are dropped
        assert_eq!(
            parse("snapkv:0.5+window:64").unwrap().to_string(),
            "snapkv:0.5"
        );
    }

    #[test]
    fn bad_ratios_and_options_are_named() {
        for (text, says) in [
            ("knorm:0", "not in (0, 1)"),
            ("knorm:1", "not in (0, 1)"),
            ("knorm:1.5", "not in (0, 1)"),
            ("knorm:-0.1", "not in (0, 1)"),
            ("knorm:x", "not a number"),
            ("knorm:", "ratio is missing"),
            ("knorm:0.5+window:4", "knorm takes no option \"window\""),
            ("snapkv:0.5+kernel:4", "even"),
            ("snapkv:0.5+window:0", "at least one query"),
            ("snapkv:0.5+window:x", "not a count"),
            ("expected:0.5+cov:maybe", "neither on nor off"),
            ("tova:0.5+sink", "no `:value`"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn kept_counts_follow_kvpress() {
        // int(28 * 0.5) = 14; int(275 * 0.25) = 68 (68.75 truncated)
        assert_eq!(parse("knorm:0.5").unwrap().kept_at(0, 6, 28), 14);
        assert_eq!(parse("knorm:0.75").unwrap().kept_at(3, 6, 275), 68);
        // never below one
        assert_eq!(parse("knorm:0.99").unwrap().kept_at(0, 6, 10), 1);
    }

    #[test]
    fn prompts_too_short_for_a_press_are_refused_by_name() {
        let snap = parse("snapkv:0.5").unwrap();
        let err = snap.check_prompt(40, 6).unwrap_err().to_string();
        assert!(
            err.contains("observation window (64)") && err.contains("+window:N"),
            "{err}"
        );
        assert!(
            parse("snapkv:0.5+window:8")
                .unwrap()
                .check_prompt(40, 6)
                .is_ok()
        );
        // 0.9 of 40 keeps int(3.99...) = 3 < the window of 8
        let err = parse("snapkv:0.9+window:8")
            .unwrap()
            .check_prompt(40, 6)
            .unwrap_err();
        assert!(
            err.to_string().contains("keeps 3 position(s) at layer 0"),
            "{err}"
        );
        assert!(
            parse("streamingllm:0.5")
                .unwrap()
                .check_prompt(4, 6)
                .is_err()
        );
        assert!(parse("knorm:0.5").unwrap().check_prompt(0, 6).is_err());
        assert!(parse("knorm:0.5").unwrap().check_prompt(1, 6).is_ok());
    }
}
