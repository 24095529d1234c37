//! "Where does the prompt matter": the causal knockout's summary sentence,
//! shared by the HTML and Markdown writers and `lcut diagnose`.

use lcut_trace::Report;

use crate::svg::num;

/// How many of the most causal bands the sentence names.
const NAMED: usize = 3;

/// The layers (or bands) whose prompt knockout moves the answer most, with
/// their KL and top-1 agreement, and the curve's value at the recommended
/// cut's layers; `None` when the run measured no knockout.
pub fn knockout_sentence(r: &Report) -> Option<String> {
    let band = r
        .traces
        .iter()
        .find_map(|t| t.knockout.as_ref().map(|k| k.band))?;
    let c = &r.curves;
    let top = c.most_causal(NAMED);
    if top.is_empty() {
        return None;
    }
    let name = |a: usize| match band {
        1 => format!("layer {a}"),
        _ => format!("layers {a}..{}", a + band - 1),
    };
    let named: Vec<String> = top
        .iter()
        .map(|&(a, kl)| {
            let agree = c.knockout_top1.get(a).copied().unwrap_or(f32::NAN);
            format!("{} (KL {}, top-1 {})", name(a), num(kl, 3), num(agree, 3))
        })
        .collect();
    let cut = r.recommendation.l_cut;
    let above: f32 = c
        .knockout_kl
        .iter()
        .skip(cut)
        .copied()
        .filter(|v| v.is_finite())
        .fold(0.0, f32::max);
    let what = if band == 1 {
        "one layer".to_string()
    } else {
        format!("a band of {band} layers")
    };
    let mut text = format!(
        "Where the prompt matters (causal knockout: the prompt hidden from the decode queries at \
         {what}, teacher-forced on the full model's answers): the answer moves most at {}; at or \
         above L_cut = {cut} the largest KL is {}.",
        named.join(", "),
        num(above, 3)
    );
    if let Some(line) = band_line(r, band) {
        text.push(' ');
        text.push_str(&line);
    }
    Some(text)
}

/// Whether a band in the middle beats the suffix of the same width (what
/// SPEED+BoS hides at the same prompt K/V), with the band's costs;
/// `None` for one layer at a time or without the curve.
fn band_line(r: &Report, band: usize) -> Option<String> {
    if band < 2 {
        return None;
    }
    let b = r.curves.best_band(band)?;
    let l = r.curves.num_layers;
    let cut = l - band;
    if b.band_wins() {
        Some(format!(
            "Among bands of {band} layers (the prompt K/V of SPEED+BoS {cut}), band:{}..{} moves \
             the answer least (KL {}) against the suffix band:{cut}..{} that SPEED+BoS {cut} \
             hides (KL {}): at the same K/V it keeps the answer closer, but saves no prefill (its \
             prompt still runs every layer: TTFT as the full model's); decoding reads as much \
             K/V as SPEED+BoS {cut}.",
            b.best,
            b.best + band - 1,
            num(b.best_kl, 3),
            l - 1,
            num(b.suffix_kl, 3)
        ))
    } else {
        Some(format!(
            "Among bands of {band} layers the suffix band:{cut}..{} (what SPEED+BoS {cut} hides) \
             moves the answer least (KL {}): no band in the middle beats SPEED+BoS at its K/V.",
            l - 1,
            num(b.suffix_kl, 3)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_diag::synthetic::synthetic_report;

    #[test]
    fn the_sentence_names_the_most_causal_layer_first_and_needs_a_knockout() {
        let mut r = synthetic_report(2, 10, 2, false).unwrap();
        let (a, kl) = r.curves.most_causal(1)[0];
        let text = knockout_sentence(&r).unwrap();
        assert!(
            text.contains(&format!("moves most at layer {a} (KL {}", num(kl, 3))),
            "{text}"
        );
        for t in &mut r.traces {
            t.knockout = None;
        }
        assert!(knockout_sentence(&r).is_none());
    }

    #[test]
    fn a_band_in_the_middle_is_offered_only_when_it_beats_the_suffix() {
        let mut r = synthetic_report(2, 6, 2, false).unwrap();
        for t in &mut r.traces {
            let k = t.knockout.as_mut().unwrap();
            k.band = 2;
            k.kl_sum.truncate(5);
            k.agree.truncate(5);
        }
        r.curves.knockout_kl = lcut_trace::Series(vec![0.5, 0.01, 0.3, 0.02, 0.2, f32::NAN]);
        let text = knockout_sentence(&r).unwrap();
        assert!(text.contains("band:1..2 moves the answer least"), "{text}");
        assert!(text.contains("saves no prefill"), "{text}");
        r.curves.knockout_kl.0[4] = 0.001;
        let text = knockout_sentence(&r).unwrap();
        assert!(
            text.contains("no band in the middle beats SPEED+BoS"),
            "{text}"
        );
    }
}
