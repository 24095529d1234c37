//! Live generation: the full model, SPEED at the chosen cut and a third
//! policy (SlimInfer by default) side by side, tokens streaming in, TTFT /
//! TPOT / K/V bytes held and resident updating each step, and the tokens
//! where SPEED or the third policy disagrees with the full model
//! highlighted. The SlimInfer run's own views are in [`crate::slim_views`].

use egui::{Color32, DragValue, RichText, ScrollArea, Ui};

use lcut_policy::{PolicyError, PolicySpec};

use crate::backend::{LiveMetrics, LiveStep, LiveToken};
use crate::slim_data::SlimRunView;
use crate::theme::{DISAGREE, human_bytes};

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
    /// Failed with a message.
    Failed(String),
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
    pub fn failed(&mut self, msg: String) {
        self.status = LiveStatus::Failed(msg);
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

fn ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |s| format!("{:.1} ms", 1000.0 * s))
}

/// One policy's stream: its title, figures and tokens (those that differ
/// from the full model's highlighted).
struct Column<'a> {
    title: String,
    tokens: &'a [LiveToken],
    agree: &'a [bool],
    metrics: &'a LiveMetrics,
}

/// The figures of a column: timing and tokens, then K/V held and resident.
pub fn metrics_lines(m: &LiveMetrics) -> [String; 2] {
    [
        format!(
            "TTFT {} · TPOT {} · {} tokens",
            ms(m.ttft_s),
            ms(m.tpot_s),
            m.tokens
        ),
        format!(
            "KV {} held · {} resident",
            human_bytes(m.kv_bytes),
            human_bytes(m.kv_bytes_resident)
        ),
    ]
}

fn show_column(ui: &mut Ui, c: &Column<'_>, max_height: f32) {
    ui.label(RichText::new(&c.title).strong());
    for line in metrics_lines(c.metrics) {
        ui.label(line);
    }
    ScrollArea::vertical()
        .id_salt(&c.title)
        .max_height(max_height)
        .show(ui, |ui| {
            ui.horizontal_wrapped(|ui| {
                ui.spacing_mut().item_spacing.x = 0.0;
                for (i, t) in c.tokens.iter().enumerate() {
                    let disagree = !c.agree.get(i).copied().unwrap_or(true);
                    show_token(ui, i, t, disagree);
                }
            });
        });
}

/// One token; a newline shows as `\n` and breaks the line.
fn show_token(ui: &mut Ui, i: usize, t: &LiveToken, disagree: bool) {
    let pieces: Vec<&str> = t.text.split('\n').collect();
    for (k, piece) in pieces.iter().enumerate() {
        let last = k + 1 == pieces.len();
        let shown = if last {
            (*piece).to_string()
        } else {
            format!("{piece}\\n")
        };
        if !shown.is_empty() {
            let text = RichText::new(shown).monospace();
            let text = if disagree {
                text.background_color(DISAGREE).color(Color32::WHITE)
            } else {
                text
            };
            ui.label(text)
                .on_hover_text(format!("step {i}, token id {}", t.id));
        }
        if !last {
            ui.end_row();
        }
    }
}

/// The prompt, the token budget, SPEED's cut, the third policy (checked
/// as typed, its named error shown) and Generate. Returns true when
/// Generate was clicked.
fn show_inputs(
    ui: &mut Ui,
    live: &mut LiveState,
    l_cut: &mut usize,
    layers: usize,
    why_not: &str,
) -> bool {
    ui.horizontal(|ui| {
        let l = ui.label("Live prompt:");
        ui.add(
            egui::TextEdit::multiline(&mut live.prompt)
                .desired_rows(2)
                .desired_width(ui.available_width() - 10.0),
        )
        .labelled_by(l.id);
    });
    let extra = live.extra_spec((layers > 0).then_some(layers));
    ui.horizontal(|ui| {
        let l = ui.label("Third policy (SlimInfer):");
        ui.add(egui::TextEdit::singleline(&mut live.extra_text).desired_width(360.0))
            .labelled_by(l.id)
            .on_hover_text(
                "slim:C1@K1[,C2@K2...][+block:B][+unit:u][+window:w][+swap:g][+sink:n][+score:unit|avg|max] \
                 or slim:paper (any policy works; empty: none)",
            );
        if ui.button("Default").clicked() {
            live.extra_text = DEFAULT_SLIM.into();
        }
        if ui.button("slim:paper").clicked() {
            live.extra_text = "slim:paper".into();
        }
        if ui.button("None").clicked() {
            live.extra_text.clear();
        }
    });
    if let Err(e) = &extra {
        ui.label(RichText::new(format!("third policy: {e}")).color(ui.visuals().error_fg_color));
    }
    let mut go = false;
    ui.horizontal(|ui| {
        let l = ui.label("Live max new tokens");
        ui.add(DragValue::new(&mut live.max_new_tokens).range(1..=4096))
            .labelled_by(l.id);
        ui.checkbox(&mut live.keep_bos, "SPEED keeps BoS");
        if layers > 0 {
            *l_cut = (*l_cut).clamp(1, layers);
            ui.add(egui::Slider::new(l_cut, 1..=layers).text("SPEED L_cut"));
        }
        let why_not = match &extra {
            Err(_) if why_not.is_empty() => "the third policy is malformed",
            _ => why_not,
        };
        go = ui
            .add_enabled(
                why_not.is_empty(),
                egui::Button::new(format!("Generate at L_cut {}", *l_cut)),
            )
            .on_disabled_hover_text(why_not)
            .clicked();
        if !why_not.is_empty() {
            ui.label(RichText::new(why_not).weak());
        }
    });
    go
}

fn show_summary(ui: &mut Ui, live: &LiveState) {
    let status = match &live.status {
        LiveStatus::Idle => return,
        LiveStatus::Running => "running…".into(),
        LiveStatus::Done => "done".into(),
        LiveStatus::Cancelled => "cancelled".into(),
        LiveStatus::Failed(e) => format!("failed: {e}"),
    };
    let extra = match &live.extra_policy {
        Some(_) => format!(", third policy {:.0}%", 100.0 * live.extra_agreement()),
        None => String::new(),
    };
    ui.label(format!(
        "{status} · {} prompt tokens, agreement {:.0}%{extra} · first divergence: {} · KL at step 0: {}",
        live.prompt_len,
        100.0 * live.agreement(),
        live.first_divergence()
            .map_or("none".to_string(), |i| format!("step {i}")),
        live.kl
            .first()
            .copied()
            .flatten()
            .map_or("–".to_string(), |k| format!("{k:.4}"))
    ));
}

fn columns(live: &LiveState) -> Vec<Column<'_>> {
    let full_title = if live.full_policy.is_empty() {
        "Full".to_string()
    } else {
        format!("Full ({})", live.full_policy)
    };
    let speed_title = match (&live.speed_policy, live.l_cut) {
        (p, _) if !p.is_empty() => format!("SPEED ({p})"),
        (_, Some(c)) => format!("SPEED at L_cut {c}"),
        _ => "SPEED".to_string(),
    };
    let mut cols = vec![
        Column {
            title: full_title,
            tokens: &live.full,
            agree: &live.agree,
            metrics: &live.full_metrics,
        },
        Column {
            title: speed_title,
            tokens: &live.speed,
            agree: &live.agree,
            metrics: &live.speed_metrics,
        },
    ];
    if let Some(p) = &live.extra_policy {
        let name = if live.slim.is_some() || p.starts_with("slim:") {
            "SlimInfer"
        } else {
            "Third"
        };
        cols.push(Column {
            title: format!("{name} ({p})"),
            tokens: &live.extra,
            agree: &live.extra_agree,
            metrics: &live.extra_metrics,
        });
    }
    cols
}

/// The live panel. Returns true when Generate was clicked (the caller starts
/// the job); `can_run` is false without a model or while a job runs, with
/// `why_not` saying why. `layers` (the open model's depth) bounds the SPEED
/// L_cut slider and checks the third policy.
pub fn show_live(
    ui: &mut Ui,
    live: &mut LiveState,
    l_cut: &mut usize,
    layers: usize,
    can_run: bool,
    why_not: &str,
) -> bool {
    let why_not = match (can_run, why_not) {
        (false, "") => "not available now",
        (false, w) => w,
        (true, _) => "",
    };
    let go = show_inputs(ui, live, l_cut, layers, why_not);
    show_summary(ui, live);
    ui.separator();
    let cols = columns(live);
    let height = if live.slim.is_some() { 150.0 } else { 320.0 };
    ui.columns(cols.len(), |uis| {
        for (ui, c) in uis.iter_mut().zip(&cols) {
            show_column(ui, c, height);
        }
    });
    go
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
