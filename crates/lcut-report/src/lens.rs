//! "Where does the answer form": the logit lens's summary sentence and its
//! per-prompt table, shared by the HTML and Markdown writers.

use lcut_trace::{LayerCurves, PromptTrace, Report};

use crate::svg::num;
use crate::tables::Table;

/// The value of a lens curve at hidden state `i`, when the run has it.
fn at(series: &[f32], i: usize) -> Option<f32> {
    series.get(i).copied().filter(|v| v.is_finite())
}

/// The sentence on where the answer forms against cut `cut`, for `curves`
/// of a run that recorded the logit lens (`None` otherwise).
pub fn formation_sentence(curves: &LayerCurves, cut: usize) -> Option<String> {
    let f = curves.formation()?;
    let l = curves.num_layers;
    let mut text = format!(
        "Where the answer forms (logit lens): half of the decode steps' answers stay the model's \
         top-1 from layer boundary {} of {l} on (the formation layer; mean over steps {}).",
        f.median,
        num(f.mean, 1)
    );
    if let (Some(top1), Some(prob)) = (at(&curves.lens_top1, cut), at(&curves.lens_prob, cut)) {
        let formed = at(&curves.lens_formed, cut).unwrap_or(f32::NAN);
        text.push_str(&format!(
            " At L_cut = {cut} the lens of the hidden state there (the output of layer {}) ranks \
             the emitted token first on {}% of steps (probability {}), and {}% of answers have \
             formed there.",
            cut.saturating_sub(1),
            num(100.0 * top1, 1),
            num(prob, 3),
            num(100.0 * formed, 1)
        ));
    }
    Some(text)
}

/// The report's sentence (`None` without the lens).
pub fn report_formation_sentence(r: &Report) -> Option<String> {
    formation_sentence(&r.curves, r.recommendation.l_cut)
}

/// Median of a trace's steps' formation sites, NaN without steps.
fn median_formation(t: &PromptTrace) -> f32 {
    let Some(lens) = &t.lens else {
        return f32::NAN;
    };
    let mut f: Vec<usize> = (0..lens.steps())
        .filter_map(|k| lens.formation(k))
        .collect();
    if f.is_empty() {
        return f32::NAN;
    }
    f.sort_unstable();
    f[(f.len() - 1) / 2] as f32
}

/// Per prompt: its steps, the median formation site, and at the cut the
/// share of steps whose token the lens ranks first; `None` when no trace
/// has a lens.
pub fn lens_prompt_table(r: &Report) -> Option<Table> {
    if r.traces.iter().all(|t| t.lens.is_none()) {
        return None;
    }
    let cut = r.recommendation.l_cut;
    let rows = r
        .traces
        .iter()
        .map(|t| {
            let (top1, prob) = t.lens.as_ref().map_or((f32::NAN, f32::NAN), |lens| {
                let steps = lens.steps().max(1) as f32;
                let row = |x: &lcut_trace::Tensor2| -> f32 {
                    x.view()
                        .row(cut)
                        .iter()
                        .filter(|v| v.is_finite())
                        .sum::<f32>()
                        / steps
                };
                let probs = lens.logprob.view().row(cut).mapv(f32::exp);
                (
                    row(&lens.top1),
                    probs.iter().filter(|v| v.is_finite()).sum::<f32>() / steps,
                )
            });
            vec![
                t.index.to_string(),
                t.id.clone(),
                t.num_steps().to_string(),
                num(median_formation(t), 0),
                num(top1, 3),
                num(prob, 3),
            ]
        })
        .collect();
    Some(Table {
        headers: vec![
            "index".into(),
            "id".into(),
            "steps".into(),
            "formation layer (median over steps)".into(),
            format!("lens top-1 = token at L_cut {cut}"),
            format!("lens P(token) at L_cut {cut}"),
        ],
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sentence_and_table_exist_only_with_a_lens() {
        let mut r = lcut_diag::synthetic::synthetic_report(3, 6, 2, false).unwrap();
        let text = report_formation_sentence(&r).unwrap();
        let f = r.curves.formation().unwrap();
        assert!(
            text.contains(&format!("layer boundary {} of 6", f.median)),
            "{text}"
        );
        assert!(text.contains(&format!("At L_cut = {}", r.recommendation.l_cut)));
        let t = lens_prompt_table(&r).unwrap();
        assert_eq!(t.rows.len(), 3);
        for tr in &mut r.traces {
            tr.lens = None;
        }
        r.curves = lcut_diag::aggregate(&r.traces).unwrap();
        assert!(report_formation_sentence(&r).is_none());
        assert!(lens_prompt_table(&r).is_none());
    }
}
