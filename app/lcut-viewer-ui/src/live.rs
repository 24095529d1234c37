//! Live generation: the full model, SPEED at the chosen cut and a third
//! policy (SlimInfer by default) side by side, tokens streaming in, TTFT /
//! TPOT / K/V bytes held and resident updating each step, and the tokens
//! where SPEED or the third policy disagrees with the full model
//! highlighted. The SlimInfer run's own views are in [`crate::slim_views`];
//! the state it draws is [`crate::live_state`].

use egui::{Color32, DragValue, RichText, ScrollArea, Ui};

use crate::backend::{LiveMetrics, LiveToken};
pub use crate::live_state::{DEFAULT_SLIM, LiveState, LiveStatus, parse_extra};
use crate::theme::{DISAGREE, human_bytes};

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
    if live.speed_policy.contains("+heads:") {
        ui.label(RichText::new(format!("policy: {}", live.speed_policy)).weak());
    }
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

/// `policy` with its head file named by the file's name alone (a column
/// title has no room for a folder; the summary line keeps the whole path).
pub fn short_head_file(policy: &str) -> String {
    let Some((before, rest)) = policy.split_once("+heads:") else {
        return policy.to_string();
    };
    let (file, after) = rest.split_once('+').map_or((rest, ""), |(f, a)| (f, a));
    let name = std::path::Path::new(file)
        .file_name()
        .map_or(file.to_string(), |n| n.to_string_lossy().into_owned());
    let after = if after.is_empty() {
        String::new()
    } else {
        format!("+{after}")
    };
    format!("{before}+heads:{name}{after}")
}

fn columns(live: &LiveState) -> Vec<Column<'_>> {
    let full_title = if live.full_policy.is_empty() {
        "Full".to_string()
    } else {
        format!("Full ({})", live.full_policy)
    };
    let speed_title = match (&live.speed_policy, live.l_cut) {
        (p, _) if p.contains("+heads:") => {
            format!("SPEED with kept heads ({})", short_head_file(p))
        }
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
        } else if p.starts_with("speed:") {
            "SPEED"
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
    use super::short_head_file;

    #[test]
    fn a_head_file_is_named_by_its_file_name_in_titles() {
        assert_eq!(
            short_head_file("speed:11+bos+heads:/a/b/heads-c11-n33.json"),
            "speed:11+bos+heads:heads-c11-n33.json"
        );
        assert_eq!(
            short_head_file("speed:11+bos+heads:x/h.json+window:64"),
            "speed:11+bos+heads:h.json+window:64"
        );
        assert_eq!(short_head_file("speed:22+bos"), "speed:22+bos");
    }
}
