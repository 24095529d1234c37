//! The live panel's state: its inputs (prompt, budget, BoS, the third
//! policy as typed) and what the worker has streamed in (tokens, agreement,
//! figures, the SlimInfer run). Drawn by [`crate::live`].

use lcut_policy::{PolicyError, PolicySpec};

use crate::backend::{LiveMetrics, LiveStep, LiveToken};
use crate::failure::JobError;
use crate::slim_data::SlimRunView;

/// Where a live generation stands.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum LiveStatus {
    /// Nothing run yet.
    #[default]
    Idle,
    /// Running.
    Running,
    /// Finished.
    Done,
    /// Cancelled by the user.
    Cancelled,
    /// Failed (its kind and message).
    Failed(JobError),
}

/// The default third policy of the live view: SlimInfer with cuts at a
/// third and two thirds of the depth keeping half and a quarter of the
/// prompt, 16-token blocks scored in units of 4 (fits small models and
/// short prompts; `slim:paper` is the paper's LLaMA-3.1 configuration).
pub const DEFAULT_SLIM: &str = "slim:1/3@50%,2/3@25%+block:16+unit:4";

/// The live panel's inputs and what has streamed in.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveState {
    /// Prompt text.
    pub prompt: String,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// SPEED keeps BoS as an anchor.
    pub keep_bos: bool,
    /// The third policy as typed (empty: none), e.g. a SlimInfer policy.
    pub extra_text: String,
    /// The cut of the current or last run.
    pub l_cut: Option<usize>,
    /// The cut the live panel's L_cut control shows and the next run uses,
    /// once a run, the user or `--l-cut` has set it (a report arriving or a
    /// cut chosen in the report's views leaves it alone); `None`: the
    /// report's chosen cut.
    pub chosen_cut: Option<usize>,
    /// The reference policy, written out.
    pub full_policy: String,
    /// The SPEED policy, written out.
    pub speed_policy: String,
    /// The third policy of the current or last run, written out.
    pub extra_policy: Option<String>,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Tokens of the full model.
    pub full: Vec<LiveToken>,
    /// Tokens of SPEED.
    pub speed: Vec<LiveToken>,
    /// Tokens of the third policy.
    pub extra: Vec<LiveToken>,
    /// Per step: full and SPEED agree.
    pub agree: Vec<bool>,
    /// Per step: full and the third policy agree.
    pub extra_agree: Vec<bool>,
    /// Per step: KL(full ‖ SPEED) while the prefixes agree.
    pub kl: Vec<Option<f32>>,
    /// Full model figures.
    pub full_metrics: LiveMetrics,
    /// SPEED figures.
    pub speed_metrics: LiveMetrics,
    /// Third policy figures.
    pub extra_metrics: LiveMetrics,
    /// The SlimInfer run of the third policy, once its prefill decided.
    pub slim: Option<SlimRunView>,
    /// Status.
    pub status: LiveStatus,
}

impl Default for LiveState {
    fn default() -> Self {
        Self {
            prompt: "Copy this: the quick brown fox jumps over the lazy dog.".into(),
            max_new_tokens: 32,
            keep_bos: true,
            extra_text: DEFAULT_SLIM.into(),
            l_cut: None,
            chosen_cut: None,
            full_policy: String::new(),
            speed_policy: String::new(),
            extra_policy: None,
            prompt_len: 0,
            full: Vec::new(),
            speed: Vec::new(),
            extra: Vec::new(),
            agree: Vec::new(),
            extra_agree: Vec::new(),
            kl: Vec::new(),
            full_metrics: LiveMetrics::default(),
            speed_metrics: LiveMetrics::default(),
            extra_metrics: LiveMetrics::default(),
            slim: None,
            status: LiveStatus::Idle,
        }
    }
}

/// Reads a third policy as typed: `Ok(None)` when empty, the parser's (or,
/// given the model's depth, the resolver's) named error otherwise.
pub fn parse_extra(text: &str, layers: Option<usize>) -> Result<Option<PolicySpec>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let spec: PolicySpec = text.parse().map_err(|e: PolicyError| e.to_string())?;
    if let Some(l) = layers.filter(|&l| l > 0) {
        spec.resolve(l).map_err(|e| e.to_string())?;
    }
    Ok(Some(spec))
}

impl LiveState {
    /// Clears the output for a new run at `l_cut`, keeping the inputs.
    pub fn begin(&mut self, l_cut: usize) {
        *self = Self {
            prompt: std::mem::take(&mut self.prompt),
            max_new_tokens: self.max_new_tokens,
            keep_bos: self.keep_bos,
            extra_text: std::mem::take(&mut self.extra_text),
            l_cut: Some(l_cut),
            chosen_cut: Some(l_cut),
            status: LiveStatus::Running,
            ..Self::default()
        };
    }

    /// The third policy as typed, checked against `layers` when known.
    pub fn extra_spec(&self, layers: Option<usize>) -> Result<Option<PolicySpec>, String> {
        parse_extra(&self.extra_text, layers)
    }

    /// The worker named the policies.
    pub fn started(
        &mut self,
        full: String,
        speed: String,
        extra: Option<String>,
        prompt_len: usize,
    ) {
        self.full_policy = full;
        self.speed_policy = speed;
        self.extra_policy = extra;
        self.prompt_len = prompt_len;
    }

    /// One more step.
    pub fn step(&mut self, s: LiveStep) {
        self.full.extend(s.full);
        self.speed.extend(s.speed);
        self.extra.extend(s.extra);
        self.agree.push(s.agree);
        self.extra_agree.push(s.extra_agree);
        self.kl.push(s.kl);
        self.full_metrics = s.full_metrics;
        self.speed_metrics = s.speed_metrics;
        self.extra_metrics = s.extra_metrics;
        if let Some(v) = self.slim.as_mut() {
            v.extend_steps(s.slim_steps);
        }
    }

    /// The run finished; `slim` is the third policy's whole SlimInfer trace.
    pub fn done(&mut self, metrics: [LiveMetrics; 3], slim: Option<Box<lcut_policy::SlimTrace>>) {
        [self.full_metrics, self.speed_metrics, self.extra_metrics] = metrics;
        if let (Some(v), Some(t)) = (self.slim.as_mut(), slim) {
            v.trace = *t;
        }
        self.status = LiveStatus::Done;
    }

    /// The run was cancelled.
    pub fn cancelled(&mut self) {
        self.status = LiveStatus::Cancelled;
    }

    /// The run failed.
    pub fn failed(&mut self, error: JobError) {
        self.status = LiveStatus::Failed(error);
    }

    /// Share of steps where full and SPEED produced the same token.
    pub fn agreement(&self) -> f64 {
        share(&self.agree)
    }

    /// Share of steps where full and the third policy produced the same token.
    pub fn extra_agreement(&self) -> f64 {
        share(&self.extra_agree)
    }

    /// Index of the first step where full and SPEED disagree.
    pub fn first_divergence(&self) -> Option<usize> {
        self.agree.iter().position(|a| !a)
    }
}

fn share(v: &[bool]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().filter(|&&a| a).count() as f64 / v.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(id: u32) -> Option<LiveToken> {
        Some(LiveToken {
            id,
            text: format!("t{id}"),
        })
    }

    #[test]
    fn the_third_policy_parses_or_names_its_error() {
        assert_eq!(parse_extra("  ", Some(16)), Ok(None));
        let spec = parse_extra(DEFAULT_SLIM, Some(16)).unwrap().unwrap();
        assert_eq!(spec.kind, lcut_policy::PolicyKind::Slim);
        let slim = spec.resolve(16).unwrap();
        assert_eq!(slim.slim().unwrap().cuts(), &[5, 11]);
        let e = parse_extra("slim:3@50%+unit:5", None).unwrap_err();
        assert!(e.contains("unit 5 must divide the block size 64"), "{e}");
        assert!(parse_extra("slim:20@50%", None).is_ok());
        let e = parse_extra("slim:20@50%", Some(16)).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let e = parse_extra("slimm:3", Some(16)).unwrap_err();
        assert!(e.contains("unknown policy"), "{e}");
    }

    #[test]
    fn steps_accumulate_and_agreement_counts() {
        let mut s = LiveState {
            prompt: "keep me".into(),
            ..LiveState::default()
        };
        s.begin(3);
        assert_eq!(s.prompt, "keep me");
        assert_eq!(s.status, LiveStatus::Running);
        s.step(LiveStep {
            full: tok(1),
            speed: tok(1),
            agree: true,
            kl: Some(0.1),
            ..LiveStep::default()
        });
        s.step(LiveStep {
            full: tok(2),
            speed: tok(5),
            ..LiveStep::default()
        });
        assert_eq!(s.full.len(), 2);
        assert_eq!(s.agreement(), 0.5);
        assert_eq!(s.first_divergence(), Some(1));
        s.cancelled();
        assert_eq!(s.status, LiveStatus::Cancelled);
    }
}
