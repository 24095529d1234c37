//! The per-layer metrics of [`LayerCurves`], described once.
//!
//! [`LAYER_METRICS`] names each series of the aggregated curves (its CSV
//! column, its JSON field, its label), the quantity it measures (which y axis
//! and chart it shares), how it is indexed (per layer, per cut, per hidden
//! state) and whether a run may leave it out (the logit lens, the knockout, a mixture-of-experts model's routing, a learned attention sink's share). The report's CSV, tables and figures, the report check and the
//! viewer's curves all read this table, so a new metric is one more entry
//! here (plus the field it reads).

use crate::curves::LayerCurves;
use crate::floats::Series;

/// How a metric's series is indexed over the model's depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Indexing {
    /// One value per layer (`L` entries), drawn half a layer right of the
    /// boundary before it: layer `l` spans `[l, l + 1)` and sits at `l + 0.5`.
    Layer,
    /// One value per cut `c` in `0..=L` (`L + 1` entries), drawn at the
    /// boundary `c`; the row of layer `l` reads the cut at `l`.
    Cut,
    /// One value per hidden state, index 0 = the embeddings (`L + 1`
    /// entries), drawn at the boundary after the layer; the row of layer `l`
    /// reads its output, index `l + 1`.
    Output,
}

impl Indexing {
    /// Entries of a series for a model of `num_layers` layers (saturating:
    /// a layer count read from a file may be huge).
    pub fn len(self, num_layers: usize) -> usize {
        match self {
            Indexing::Layer => num_layers,
            Indexing::Cut | Indexing::Output => num_layers.saturating_add(1),
        }
    }

    /// The index a per-layer row (CSV, tables) reads for layer `layer`.
    pub fn row_index(self, layer: usize) -> usize {
        match self {
            Indexing::Layer | Indexing::Cut => layer,
            Indexing::Output => layer + 1,
        }
    }

    /// Whether values sit half a layer off the layer boundaries (per-layer
    /// values, between the cuts that enclose the layer).
    pub fn half_layer(self) -> bool {
        self == Indexing::Layer
    }

    /// Where entry `i` sits on an axis of layer boundaries (cut `c` at `c`).
    pub fn boundary_x(self, i: usize) -> f64 {
        if self.half_layer() {
            i as f64 + 0.5
        } else {
            i as f64
        }
    }

    /// The axis label of an index of this kind.
    pub fn x_label(self) -> &'static str {
        match self {
            Indexing::Layer => "layer",
            Indexing::Cut => "cut c",
            Indexing::Output => "layer output (0 = embeddings)",
        }
    }
}

/// The quantity a metric measures: metrics of one kind share a y axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricAxis {
    /// Attention mass of decode queries on one kind of token.
    Mass,
    /// The share of decode-to-prompt attention a cut drops.
    TailMass,
    /// Normalised conditional prompt entropy.
    Entropy,
    /// Curvature of the hidden-state trajectory.
    Curvature,
    /// The logit lens: the probability of, or the share of steps agreeing
    /// on, each decode step's token.
    Lens,
    /// The logit lens's divergence from the final distribution.
    LensKl,
    /// The rank of each decode step's token under the logit lens.
    LensRank,
    /// How far the output moves when the prompt is knocked out of a band
    /// of layers: KL(full ‖ knocked out).
    Knockout,
    /// Top-1 agreement with the full model under a knockout.
    KnockoutTop1,
    /// How a mixture-of-experts model routes its decode tokens: the
    /// router's normalised entropy and a policy's top-k overlap with the
    /// full model, both in `[0, 1]`.
    Routing,
}

impl MetricAxis {
    /// Every kind, in the order charts show them.
    pub const ALL: [MetricAxis; 10] = [
        MetricAxis::Mass,
        MetricAxis::TailMass,
        MetricAxis::Entropy,
        MetricAxis::Curvature,
        MetricAxis::Lens,
        MetricAxis::LensKl,
        MetricAxis::LensRank,
        MetricAxis::Knockout,
        MetricAxis::KnockoutTop1,
        MetricAxis::Routing,
    ];

    /// The y axis label (the unit).
    pub fn unit(self) -> &'static str {
        match self {
            MetricAxis::Mass => "attention mass",
            MetricAxis::TailMass => "R(c)",
            MetricAxis::Entropy => "H / ln(n_prefill)",
            MetricAxis::Curvature => "radians",
            MetricAxis::Lens => "probability / share of steps",
            MetricAxis::LensKl => "KL(final || lens), nats",
            MetricAxis::LensRank => "log10 rank",
            MetricAxis::Knockout => "KL(full || knocked out), nats",
            MetricAxis::KnockoutTop1 => "top-1 agreement with full",
            MetricAxis::Routing => "H / ln(experts), top-k overlap",
        }
    }

    /// The metrics of this kind, in table order.
    pub fn metrics(self) -> impl Iterator<Item = &'static LayerMetric> {
        LAYER_METRICS.iter().filter(move |m| m.axis == self)
    }
}

/// One per-layer metric of [`LayerCurves`].
#[derive(Debug, Clone, Copy)]
pub struct LayerMetric {
    /// The CSV column and stable key.
    pub name: &'static str,
    /// The field of [`LayerCurves`] (and of the report's JSON `curves`);
    /// a dotted path for a series inside a nested field (`routing.entropy`).
    pub field: &'static str,
    /// The legend and table label.
    pub label: &'static str,
    /// The quantity it measures.
    pub axis: MetricAxis,
    /// How its series is indexed.
    pub indexing: Indexing,
    /// Recorded only when the run asks (the logit lens): its series may be
    /// empty, and readers leave it out then.
    pub optional: bool,
    /// The series in the aggregated curves.
    pub get: fn(&LayerCurves) -> &Series,
}

impl LayerMetric {
    /// The metric's values in `curves`.
    pub fn series<'a>(&self, curves: &'a LayerCurves) -> &'a [f32] {
        (self.get)(curves)
    }

    /// Whether `curves` hold this metric (an optional one may be absent).
    pub fn present(&self, curves: &LayerCurves) -> bool {
        !self.series(curves).is_empty()
    }

    /// The value the row of `layer` shows (NaN when the series is short).
    pub fn row_value(&self, curves: &LayerCurves, layer: usize) -> f32 {
        self.series(curves)
            .get(self.indexing.row_index(layer))
            .copied()
            .unwrap_or(f32::NAN)
    }
}

/// Every per-layer metric, in the order of the CSV columns.
pub const LAYER_METRICS: &[LayerMetric] = &[
    LayerMetric {
        name: "bos",
        field: "bos",
        label: "BoS",
        axis: MetricAxis::Mass,
        indexing: Indexing::Layer,
        optional: false,
        get: |c| &c.bos,
    },
    LayerMetric {
        name: "anchor",
        field: "anchor",
        label: "other anchors",
        axis: MetricAxis::Mass,
        indexing: Indexing::Layer,
        optional: false,
        get: |c| &c.anchor,
    },
    LayerMetric {
        name: "prefill",
        field: "prefill",
        label: "prefill (prompt)",
        axis: MetricAxis::Mass,
        indexing: Indexing::Layer,
        optional: false,
        get: |c| &c.prefill,
    },
    LayerMetric {
        name: "decode",
        field: "decode",
        label: "decode phase",
        axis: MetricAxis::Mass,
        indexing: Indexing::Layer,
        optional: false,
        get: |c| &c.decode,
    },
    LayerMetric {
        name: "self",
        field: "self_mass",
        label: "self",
        axis: MetricAxis::Mass,
        indexing: Indexing::Layer,
        optional: false,
        get: |c| &c.self_mass,
    },
    LayerMetric {
        name: "entropy_head_mean",
        field: "entropy_head_mean",
        label: "entropy (head mean)",
        axis: MetricAxis::Entropy,
        indexing: Indexing::Layer,
        optional: false,
        get: |c| &c.entropy_head_mean,
    },
    LayerMetric {
        name: "entropy_weighted",
        field: "entropy_weighted",
        label: "entropy (mass-weighted)",
        axis: MetricAxis::Entropy,
        indexing: Indexing::Layer,
        optional: false,
        get: |c| &c.entropy_weighted,
    },
    LayerMetric {
        name: "tail_mass",
        field: "tail_mass",
        label: "tail mass R(c)",
        axis: MetricAxis::TailMass,
        indexing: Indexing::Cut,
        optional: false,
        get: |c| &c.tail_mass,
    },
    LayerMetric {
        name: "curvature_prompt",
        field: "curvature_prompt",
        label: "curvature (prompt)",
        axis: MetricAxis::Curvature,
        indexing: Indexing::Output,
        optional: false,
        get: |c| &c.curvature_prompt,
    },
    LayerMetric {
        name: "curvature_generated",
        field: "curvature_generated",
        label: "curvature (generated)",
        axis: MetricAxis::Curvature,
        indexing: Indexing::Output,
        optional: false,
        get: |c| &c.curvature_generated,
    },
    LayerMetric {
        name: "straightening_prompt",
        field: "straightening_prompt",
        label: "straightening (prompt)",
        axis: MetricAxis::Curvature,
        indexing: Indexing::Output,
        optional: false,
        get: |c| &c.straightening_prompt,
    },
    LayerMetric {
        name: "straightening_generated",
        field: "straightening_generated",
        label: "straightening (generated)",
        axis: MetricAxis::Curvature,
        indexing: Indexing::Output,
        optional: false,
        get: |c| &c.straightening_generated,
    },
    LayerMetric {
        name: "lens_prob",
        field: "lens_prob",
        label: "lens: P(token)",
        axis: MetricAxis::Lens,
        indexing: Indexing::Output,
        optional: true,
        get: |c| &c.lens_prob,
    },
    LayerMetric {
        name: "lens_top1",
        field: "lens_top1",
        label: "lens: top-1 = token",
        axis: MetricAxis::Lens,
        indexing: Indexing::Output,
        optional: true,
        get: |c| &c.lens_top1,
    },
    LayerMetric {
        name: "lens_formed",
        field: "lens_formed",
        label: "lens: answer formed",
        axis: MetricAxis::Lens,
        indexing: Indexing::Output,
        optional: true,
        get: |c| &c.lens_formed,
    },
    LayerMetric {
        name: "lens_kl",
        field: "lens_kl",
        label: "lens: KL(final || lens)",
        axis: MetricAxis::LensKl,
        indexing: Indexing::Output,
        optional: true,
        get: |c| &c.lens_kl,
    },
    LayerMetric {
        name: "lens_log_rank",
        field: "lens_log_rank",
        label: "lens: log10 rank",
        axis: MetricAxis::LensRank,
        indexing: Indexing::Output,
        optional: true,
        get: |c| &c.lens_log_rank,
    },
    LayerMetric {
        name: "knockout_kl",
        field: "knockout_kl",
        label: "knockout: KL(full || knocked out)",
        axis: MetricAxis::Knockout,
        indexing: Indexing::Layer,
        optional: true,
        get: |c| &c.knockout_kl,
    },
    LayerMetric {
        name: "knockout_top1",
        field: "knockout_top1",
        label: "knockout: top-1 agreement",
        axis: MetricAxis::KnockoutTop1,
        indexing: Indexing::Layer,
        optional: true,
        get: |c| &c.knockout_top1,
    },
    LayerMetric {
        name: "routing_entropy",
        field: "routing.entropy",
        label: "routing: entropy",
        axis: MetricAxis::Routing,
        indexing: Indexing::Layer,
        optional: true,
        get: |c| c.routing.as_ref().map_or(&NO_SERIES, |r| &r.entropy),
    },
    LayerMetric {
        name: "routing_overlap",
        field: "routing.overlap",
        label: "routing: top-k overlap with full",
        axis: MetricAxis::Routing,
        indexing: Indexing::Layer,
        optional: true,
        get: |c| c.routing.as_ref().map_or(&NO_SERIES, |r| &r.overlap),
    },
    LayerMetric {
        name: "sink",
        field: "sink",
        label: "sink (no key)",
        axis: MetricAxis::Mass,
        indexing: Indexing::Layer,
        optional: true,
        get: |c| &c.sink,
    },
];

/// The series of a metric whose curves hold none (a dense model's routing).
static NO_SERIES: Series = Series(Vec::new());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fields_and_labels_are_unique() {
        for key in [
            |m: &LayerMetric| m.name,
            |m: &LayerMetric| m.field,
            |m: &LayerMetric| m.label,
        ] {
            let mut seen: Vec<&str> = LAYER_METRICS.iter().map(key).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), LAYER_METRICS.len(), "{seen:?}");
        }
    }

    #[test]
    fn every_kind_has_metrics_of_one_indexing() {
        for axis in MetricAxis::ALL {
            let kinds: Vec<Indexing> = axis.metrics().map(|m| m.indexing).collect();
            assert!(!kinds.is_empty(), "{axis:?}");
            assert!(kinds.iter().all(|&k| k == kinds[0]), "{axis:?}: {kinds:?}");
        }
    }

    #[test]
    fn every_series_of_the_curves_is_in_the_table() {
        // the sink's share is left out of a model's JSON without sinks
        let mut curves = LayerCurves::empty(0, 0);
        curves.sink = Series(vec![0.5]);
        let json = serde_json::to_value(&curves).unwrap();
        let mut series: Vec<&str> = json
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, v)| v.is_array())
            .map(|(k, _)| k.as_str())
            .collect();
        // nested series (a MoE model's routing) are absent from empty curves
        let mut fields: Vec<&str> = LAYER_METRICS
            .iter()
            .map(|m| m.field)
            .filter(|f| !f.contains('.'))
            .collect();
        series.sort_unstable();
        fields.sort_unstable();
        assert_eq!(series, fields);
    }

    #[test]
    fn rows_read_the_layer_or_its_output() {
        assert_eq!(Indexing::Layer.row_index(3), 3);
        assert_eq!(Indexing::Cut.row_index(3), 3);
        assert_eq!(Indexing::Output.row_index(3), 4);
        assert_eq!(Indexing::Layer.boundary_x(3), 3.5);
        assert_eq!(Indexing::Output.boundary_x(3), 3.0);
        assert_eq!(Indexing::Cut.len(usize::MAX), usize::MAX);
    }
}
