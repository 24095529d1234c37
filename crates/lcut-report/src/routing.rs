//! "How the experts route": a mixture-of-experts run's routing in words
//! (shared by the HTML and Markdown writers and `lcut diagnose`), the
//! layer × expert load heatmap, and the sweep's routing overlap per cut.
//! The per-layer entropy and overlap lines are charts of the per-layer
//! metrics ([`lcut_trace::MetricAxis::Routing`]). A dense model's report
//! has none of these.

use lcut_trace::{Report, RoutingCurves, Sweep, SweepPoint};

use crate::figures::Figure;
use crate::heatmap::Heatmap;
use crate::lines::{Line, LineChart};
use crate::svg::num;

/// The finite value of `series` at each of `layers` with the highest
/// (`max`) or lowest value, and its layer.
fn extreme(series: &[f32], layers: &[usize], max: bool) -> Option<(usize, f32)> {
    layers
        .iter()
        .filter_map(|&l| series.get(l).map(|&v| (l, v)))
        .filter(|(_, v)| v.is_finite())
        .reduce(|a, b| match (max, b.1 > a.1, b.1 < a.1) {
            (true, true, _) | (false, _, true) => b,
            _ => a,
        })
}

/// The busiest expert of any sparse layer: (layer, expert, share).
fn busiest(c: &RoutingCurves) -> Option<(usize, usize, f32)> {
    let e = c.num_experts;
    c.sparse_layers
        .iter()
        .flat_map(|&l| (0..e).map(move |x| (l, x)))
        .map(|(l, x)| (l, x, c.load.view()[[l, x]]))
        .filter(|(_, _, v)| v.is_finite())
        .reduce(|a, b| if b.2 > a.2 { b } else { a })
}

/// The routing of a run in words: experts and layers, the router's
/// entropy at its highest and lowest layer, the busiest expert against an
/// even share, and the compared policy's overlap with the full model;
/// `None` for a dense model.
pub fn routing_sentence(r: &Report) -> Option<String> {
    let c = r.curves.routing.as_ref()?;
    let layers = &c.sparse_layers;
    let mut text = format!(
        "Routing ({}: top {} of {} experts at {} of {} layers, {} decode tokens):",
        r.model.arch,
        c.top_k,
        c.num_experts,
        layers.len(),
        r.model.num_layers,
        c.tokens
    );
    if let (Some((hi_l, hi)), Some((lo_l, lo))) = (
        extreme(&c.entropy, layers, true),
        extreme(&c.entropy, layers, false),
    ) {
        text.push_str(&format!(
            " the router's entropy over ln {} is highest at layer {hi_l} ({}) and lowest at \
             layer {lo_l} ({}) (1 = every expert alike, 0 = one expert);",
            c.num_experts,
            num(hi, 3),
            num(lo, 3)
        ));
    }
    if let Some((l, x, share)) = busiest(c) {
        text.push_str(&format!(
            " the busiest expert takes {} of a layer's top-k slots (expert {x} at layer {l}; \
             an even share is {}).",
            num(share, 3),
            num(1.0 / c.num_experts as f32, 3)
        ));
    }
    if let (Some(policy), Some((lo_l, lo))) = (&c.policy, extreme(&c.overlap, layers, false)) {
        let finite: Vec<f32> = layers
            .iter()
            .filter_map(|&l| c.overlap.get(l).copied())
            .filter(|v| v.is_finite())
            .collect();
        let mean = finite.iter().sum::<f32>() / finite.len().max(1) as f32;
        text.push_str(&format!(
            " Under {policy}, teacher-forced on the same tokens, the decode tokens keep {} of \
             their top-k experts on average (lowest {} at layer {lo_l}; 1 = the full model's \
             experts).",
            num(mean, 3),
            num(lo, 3)
        ));
    }
    Some(text)
}

/// The layer × expert load heatmap; `None` for a dense model.
pub(crate) fn load_heatmap(r: &Report) -> Option<Figure> {
    let c = r.curves.routing.as_ref()?;
    let title = "Expert load by layer: share of the decode tokens' top-k slots".to_string();
    let svg = Heatmap {
        title: &title,
        x_label: "expert",
        y_label: "layer",
        values: c.load.view(),
        col_names: (0..c.num_experts).map(|x| format!("expert {x}")).collect(),
        cut: Some(r.recommendation.l_cut),
        range: None,
        named_columns: false,
    }
    .to_svg();
    Some(Figure {
        title,
        svg,
        caption: format!(
            "Each sparse layer's row sums to 1 over its {} experts (an even load is {} per \
             expert); {} decode tokens, top {} each. Grey rows are dense layers, which route \
             nothing.",
            c.num_experts,
            num(1.0 / c.num_experts as f32, 3),
            c.tokens,
            c.top_k
        ),
    })
}

/// The sweep's routing overlap against the cut, one line per anchor set;
/// `None` when no point has one (a dense model, an older report).
pub(crate) fn sweep_overlap_chart(r: &Report, sweep: &Sweep) -> Option<Figure> {
    if sweep.points.iter().all(|p| p.routing_overlap.is_none()) {
        return None;
    }
    let mut anchors: Vec<String> = sweep.points.iter().map(SweepPoint::anchors_label).collect();
    anchors.sort_unstable();
    anchors.dedup();
    let lines = anchors
        .iter()
        .map(|a| {
            let mut pts: Vec<(f64, f64)> = sweep
                .points
                .iter()
                .filter(|p| p.anchors_label() == *a)
                .filter_map(|p| Some((p.l_cut()? as f64, f64::from(p.routing_overlap?))))
                .collect();
            pts.sort_by(|x, y| x.0.total_cmp(&y.0));
            Line::new(format!("anchors: {a}"), pts)
        })
        .collect();
    let c = r.recommendation.l_cut;
    let chart = LineChart {
        title: "Routing overlap with the full model per cut".into(),
        x_label: "L_cut".into(),
        y_label: "mean top-k overlap".into(),
        lines,
        vlines: vec![(c as f64, format!("L_cut = {c}"))],
        dots: true,
        integer_x: true,
        ..LineChart::default()
    };
    Some(Figure {
        title: chart.title.clone(),
        svg: chart.to_svg(),
        caption: "Each SPEED cut teacher-forced on the full model's greedy continuation: the \
                  share of the full model's top-k experts the decode tokens still choose, over \
                  every sparse layer and token (1 = cutting the prompt changes no expert)."
            .to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcut_diag::synthetic::{synthetic_moe_report, synthetic_report};

    #[test]
    fn a_moe_report_says_how_it_routes_and_a_dense_one_says_nothing() {
        let r = synthetic_moe_report(3, 6, 2, true).unwrap();
        let s = routing_sentence(&r).unwrap();
        for part in [
            "top 2 of 8 experts at 5 of 6 layers",
            "entropy over ln 8",
            "busiest expert",
            "Under speed:3+bos",
        ] {
            assert!(s.contains(part), "{part}: {s}");
        }
        assert!(load_heatmap(&r).unwrap().svg.contains("expert 7"));
        let sweep = r.sweep.as_ref().unwrap();
        assert!(sweep_overlap_chart(&r, sweep).is_some());

        let dense = synthetic_report(3, 6, 2, true).unwrap();
        assert!(routing_sentence(&dense).is_none() && load_heatmap(&dense).is_none());
        assert!(sweep_overlap_chart(&dense, dense.sweep.as_ref().unwrap()).is_none());
    }

    #[test]
    fn extremes_skip_dense_layers_and_nan() {
        let s = [0.5, f32::NAN, 0.9, 0.1];
        assert_eq!(extreme(&s, &[0, 2, 3], true), Some((2, 0.9)));
        assert_eq!(extreme(&s, &[0, 1, 2], false), Some((0, 0.5)));
        assert_eq!(extreme(&s, &[1], true), None);
    }
}
