//! Live generation: the full model and SPEED at the chosen cut side by side,
//! tokens streaming in, TTFT / TPOT / K/V bytes updating each step, and the
//! tokens where the two disagree highlighted.

use egui::{Color32, DragValue, RichText, ScrollArea, Ui};

use crate::backend::{LiveMetrics, LiveToken};
use crate::cost_panel::human_bytes;

/// Background of a token where the two policies disagree.
pub const DISAGREE: Color32 = Color32::from_rgb(150, 40, 40);

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

/// The live panel's inputs and what has streamed in.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveState {
    /// Prompt text.
    pub prompt: String,
    /// Most new tokens.
    pub max_new_tokens: usize,
    /// SPEED keeps BoS as an anchor.
    pub keep_bos: bool,
    /// The cut of the current or last run.
    pub l_cut: Option<usize>,
    /// The reference policy, written out.
    pub full_policy: String,
    /// The SPEED policy, written out.
    pub speed_policy: String,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// Tokens of the full model.
    pub full: Vec<LiveToken>,
    /// Tokens of SPEED.
    pub speed: Vec<LiveToken>,
    /// Per step: the two agree.
    pub agree: Vec<bool>,
    /// Per step: KL(full ‖ SPEED) while the prefixes agree.
    pub kl: Vec<Option<f32>>,
    /// Full model figures.
    pub full_metrics: LiveMetrics,
    /// SPEED figures.
    pub speed_metrics: LiveMetrics,
    /// Status.
    pub status: LiveStatus,
}

impl Default for LiveState {
    fn default() -> Self {
        Self {
            prompt: "Copy this: the quick brown fox jumps over the lazy dog.".into(),
            max_new_tokens: 32,
            keep_bos: true,
            l_cut: None,
            full_policy: String::new(),
            speed_policy: String::new(),
            prompt_len: 0,
            full: Vec::new(),
            speed: Vec::new(),
            agree: Vec::new(),
            kl: Vec::new(),
            full_metrics: LiveMetrics::default(),
            speed_metrics: LiveMetrics::default(),
            status: LiveStatus::Idle,
        }
    }
}

impl LiveState {
    /// Clears the output for a new run at `l_cut`.
    pub fn begin(&mut self, l_cut: usize) {
        *self = Self {
            prompt: std::mem::take(&mut self.prompt),
            max_new_tokens: self.max_new_tokens,
            keep_bos: self.keep_bos,
            l_cut: Some(l_cut),
            status: LiveStatus::Running,
            ..Self::default()
        };
    }

    /// The worker named the policies.
    pub fn started(&mut self, full: String, speed: String, prompt_len: usize) {
        self.full_policy = full;
        self.speed_policy = speed;
        self.prompt_len = prompt_len;
    }

    /// One more step.
    pub fn step(
        &mut self,
        full: Option<LiveToken>,
        speed: Option<LiveToken>,
        agree: bool,
        kl: Option<f32>,
        full_metrics: LiveMetrics,
        speed_metrics: LiveMetrics,
    ) {
        self.full.extend(full);
        self.speed.extend(speed);
        self.agree.push(agree);
        self.kl.push(kl);
        self.full_metrics = full_metrics;
        self.speed_metrics = speed_metrics;
    }

    /// The run finished.
    pub fn done(&mut self, full: LiveMetrics, speed: LiveMetrics) {
        self.full_metrics = full;
        self.speed_metrics = speed;
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

    /// Share of steps where both produced the same token.
    pub fn agreement(&self) -> f64 {
        if self.agree.is_empty() {
            return 0.0;
        }
        self.agree.iter().filter(|&&a| a).count() as f64 / self.agree.len() as f64
    }

    /// Index of the first step where the two disagree.
    pub fn first_divergence(&self) -> Option<usize> {
        self.agree.iter().position(|a| !a)
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("–".into(), |s| format!("{:.1} ms", 1000.0 * s))
}

fn show_column(ui: &mut Ui, title: &str, tokens: &[LiveToken], agree: &[bool], m: &LiveMetrics) {
    ui.label(RichText::new(title).strong());
    ui.label(format!(
        "TTFT {} · TPOT {} · {} tokens · KV {}",
        ms(m.ttft_s),
        ms(m.tpot_s),
        m.tokens,
        human_bytes(m.kv_bytes)
    ));
    ScrollArea::vertical()
        .id_salt(title)
        .max_height(320.0)
        .show(ui, |ui| {
            ui.horizontal_wrapped(|ui| {
                ui.spacing_mut().item_spacing.x = 0.0;
                for (i, t) in tokens.iter().enumerate() {
                    let disagree = !agree.get(i).copied().unwrap_or(true);
                    // A newline shows as `\n` and breaks the line.
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
            });
        });
}

/// The live panel. Returns true when Generate was clicked (the caller starts
/// the job); `can_run` is false without a model or while a job runs.
/// `layers` (the open model's depth) bounds the SPEED L_cut slider.
pub fn show_live(
    ui: &mut Ui,
    live: &mut LiveState,
    l_cut: &mut usize,
    layers: usize,
    can_run: bool,
    why_not: &str,
) -> bool {
    let mut go = false;
    ui.horizontal(|ui| {
        let l = ui.label("Live prompt:");
        ui.add(
            egui::TextEdit::multiline(&mut live.prompt)
                .desired_rows(2)
                .desired_width(ui.available_width() - 10.0),
        )
        .labelled_by(l.id);
    });
    ui.horizontal(|ui| {
        let l = ui.label("Live max new tokens");
        ui.add(DragValue::new(&mut live.max_new_tokens).range(1..=4096))
            .labelled_by(l.id);
        ui.checkbox(&mut live.keep_bos, "SPEED keeps BoS");
        if layers > 0 {
            *l_cut = (*l_cut).clamp(1, layers);
            ui.add(egui::Slider::new(l_cut, 1..=layers).text("SPEED L_cut"));
        }
        let l_cut = *l_cut;
        go = ui
            .add_enabled(
                can_run,
                egui::Button::new(format!("Generate at L_cut {l_cut}")),
            )
            .on_disabled_hover_text(why_not)
            .clicked();
        if !can_run && !why_not.is_empty() {
            ui.label(RichText::new(why_not).weak());
        }
    });
    let status = match &live.status {
        LiveStatus::Idle => String::new(),
        LiveStatus::Running => "running…".into(),
        LiveStatus::Done => "done".into(),
        LiveStatus::Cancelled => "cancelled".into(),
        LiveStatus::Failed(e) => format!("failed: {e}"),
    };
    if live.status != LiveStatus::Idle {
        ui.label(format!(
            "{status} · {} prompt tokens, agreement {:.0}% · first divergence: {} · KL at step 0: {}",
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
    ui.separator();
    ui.columns(2, |cols| {
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
        show_column(
            &mut cols[0],
            &full_title,
            &live.full,
            &live.agree,
            &live.full_metrics,
        );
        show_column(
            &mut cols[1],
            &speed_title,
            &live.speed,
            &live.agree,
            &live.speed_metrics,
        );
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
    fn steps_accumulate_and_agreement_counts() {
        let mut s = LiveState {
            prompt: "keep me".into(),
            ..LiveState::default()
        };
        s.begin(3);
        assert_eq!(s.prompt, "keep me");
        assert_eq!(s.status, LiveStatus::Running);
        let m = LiveMetrics::default();
        s.step(tok(1), tok(1), true, Some(0.1), m, m);
        s.step(tok(2), tok(5), false, None, m, m);
        assert_eq!(s.full.len(), 2);
        assert_eq!(s.agreement(), 0.5);
        assert_eq!(s.first_divergence(), Some(1));
        s.cancelled();
        assert_eq!(s.status, LiveStatus::Cancelled);
    }
}
