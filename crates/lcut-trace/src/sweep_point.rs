//! One point of the empirical sweep, carrying its policy as a
//! [`PolicySpec`], and its JSON form.
//!
//! A point is written with `policy` (the canonical text, e.g.
//! `"speed:22+bos"`) and, for SPEED and SelfOnly points at a layer count,
//! also `l_cut` and `anchors` beside it, so readers of the older schema (the
//! notebook, scripts) keep working. Reading takes `policy` when present and
//! otherwise rebuilds a SPEED policy from `l_cut` + `anchors`, so reports
//! written before points carried a policy still load.

use lcut_policy::{Anchors, CutSpec, PolicyKind, PolicySpec};
use serde::{Deserialize, Serialize};

/// One point of the empirical sweep: a policy (SPEED at a cutoff) against
/// the full model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "SweepPointWire", into = "SweepPointWire")]
pub struct SweepPoint {
    /// The policy measured.
    pub policy: PolicySpec,
    /// Teacher-forced top-1 agreement with the full model's greedy tokens.
    pub top1_agreement: f32,
    /// Mean KL(full ‖ policy) of the next-token distributions, nats.
    pub mean_kl: f32,
    /// Mean negative log-likelihood of the full model's continuation, nats/token.
    pub nll: f32,
    /// KV bytes at the sweep's context length.
    pub kv_bytes: u64,
    /// `kv_bytes` over the full model's.
    pub kv_ratio: f32,
    /// Prefill FLOPs at the sweep's context length.
    pub prefill_flops: f64,
    /// `prefill_flops` over the full model's.
    pub prefill_ratio: f32,
    /// Continuation tokens scored, what agreement, KL and NLL average over
    /// (shards' points merge weighted by it); `None` in reports written
    /// before it was recorded.
    pub tokens: Option<usize>,
    /// On a mixture-of-experts model, the mean top-k overlap of the decode
    /// tokens' routing under the policy with the full model's on the same
    /// tokens (`|chosen_policy ∩ chosen_full| / k`, over every sparse layer
    /// and scored token; 1: the same experts decode); `None` for a dense
    /// model and in reports written before it was recorded.
    pub routing_overlap: Option<f32>,
}

/// The SPEED policy at `l_cut` layers keeping `anchors`: what a sweep point
/// of the cutoff axis carries.
pub fn speed_policy(l_cut: usize, anchors: Anchors) -> PolicySpec {
    PolicySpec::at_cut(PolicyKind::Speed, CutSpec::Layers(l_cut), anchors)
}

/// The label of an anchor set as a sweep point's `anchors` field writes it:
/// `"bos"`, `"none"`, `"prefix:N"` or `"system"`.
pub fn anchors_label(anchors: Anchors) -> String {
    match anchors {
        Anchors::None => "none".to_string(),
        Anchors::Bos => "bos".to_string(),
        Anchors::Prefix(n) => format!("prefix:{n}"),
        Anchors::System => "system".to_string(),
    }
}

impl SweepPoint {
    /// Whether the policy is a cutoff policy (SPEED or SelfOnly), the ones
    /// with a cutoff and anchors.
    fn is_cutoff_policy(&self) -> bool {
        matches!(self.policy.kind, PolicyKind::Speed | PolicyKind::SelfOnly)
    }

    /// The cutoff in layers, for a SPEED or SelfOnly point written with a
    /// layer count (every point of a cutoff sweep); `None` for other
    /// policies and for a cutoff given as a fraction of depth.
    pub fn l_cut(&self) -> Option<usize> {
        match (self.is_cutoff_policy(), self.policy.cut) {
            (true, CutSpec::Layers(n)) => Some(n),
            _ => None,
        }
    }

    /// The anchors the policy keeps above the cutoff (`Anchors::None` for
    /// policies without a cutoff).
    pub fn anchors(&self) -> Anchors {
        if self.is_cutoff_policy() {
            self.policy.anchors
        } else {
            Anchors::None
        }
    }

    /// The cutoff as tables and labels show it: the layer count, or the
    /// policy's text for a point without one.
    pub fn cut_label(&self) -> String {
        self.l_cut()
            .map_or_else(|| self.policy.to_string(), |c| c.to_string())
    }

    /// Whether the policy keeps the BoS token as its anchor.
    pub fn keeps_bos(&self) -> bool {
        self.anchors() == Anchors::Bos
    }

    /// The anchors as the points' series are labelled: `"bos"`, `"none"`,
    /// `"prefix:N"` or `"system"`.
    pub fn anchors_label(&self) -> String {
        anchors_label(self.anchors())
    }
}

/// The JSON form of a [`SweepPoint`]: `policy`, and the older `l_cut` +
/// `anchors` pair written beside it and read when `policy` is absent.
#[derive(Serialize, Deserialize)]
struct SweepPointWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    l_cut: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    anchors: Option<String>,
    #[serde(with = "crate::floats::scalar")]
    top1_agreement: f32,
    #[serde(with = "crate::floats::scalar")]
    mean_kl: f32,
    #[serde(with = "crate::floats::scalar")]
    nll: f32,
    kv_bytes: u64,
    #[serde(with = "crate::floats::scalar")]
    kv_ratio: f32,
    prefill_flops: f64,
    #[serde(with = "crate::floats::scalar")]
    prefill_ratio: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    routing_overlap: Option<f32>,
}

/// The policy of a point read from JSON: `policy` when given, otherwise SPEED
/// rebuilt from the older `l_cut` + `anchors`.
fn wire_policy(
    policy: Option<&str>,
    l_cut: Option<usize>,
    anchors: Option<&str>,
) -> Result<PolicySpec, String> {
    let text = match (policy, l_cut, anchors) {
        (Some(p), _, _) => p.to_string(),
        (None, Some(c), Some("none")) => format!("speed:{c}"),
        (None, Some(c), Some(a)) => format!("speed:{c}+{a}"),
        _ => {
            return Err(
                "a sweep point needs `policy`, or `l_cut` and `anchors` (older reports)"
                    .to_string(),
            );
        }
    };
    text.parse()
        .map_err(|e| format!("sweep point policy {text:?}: {e}"))
}

impl TryFrom<SweepPointWire> for SweepPoint {
    type Error = String;

    fn try_from(w: SweepPointWire) -> Result<Self, Self::Error> {
        Ok(Self {
            policy: wire_policy(w.policy.as_deref(), w.l_cut, w.anchors.as_deref())?,
            top1_agreement: w.top1_agreement,
            mean_kl: w.mean_kl,
            nll: w.nll,
            kv_bytes: w.kv_bytes,
            kv_ratio: w.kv_ratio,
            prefill_flops: w.prefill_flops,
            prefill_ratio: w.prefill_ratio,
            tokens: w.tokens,
            routing_overlap: w.routing_overlap.filter(|x| x.is_finite()),
        })
    }
}

impl From<SweepPoint> for SweepPointWire {
    fn from(p: SweepPoint) -> Self {
        let l_cut = p.l_cut();
        Self {
            policy: Some(p.policy.to_string()),
            l_cut,
            anchors: l_cut.map(|_| p.anchors_label()),
            top1_agreement: p.top1_agreement,
            mean_kl: p.mean_kl,
            nll: p.nll,
            kv_bytes: p.kv_bytes,
            kv_ratio: p.kv_ratio,
            prefill_flops: p.prefill_flops,
            prefill_ratio: p.prefill_ratio,
            tokens: p.tokens,
            routing_overlap: p.routing_overlap.filter(|x| x.is_finite()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics_json() -> &'static str {
        r#""top1_agreement": 0.9, "mean_kl": null, "nll": 1.5, "kv_bytes": 1024,
           "kv_ratio": 0.5, "prefill_flops": 1e12, "prefill_ratio": 0.75"#
    }

    fn point(policy: PolicySpec) -> SweepPoint {
        SweepPoint {
            policy,
            top1_agreement: 0.9,
            mean_kl: f32::NAN,
            nll: 1.5,
            kv_bytes: 1024,
            kv_ratio: 0.5,
            prefill_flops: 1e12,
            prefill_ratio: 0.75,
            tokens: Some(12),
            routing_overlap: None,
        }
    }

    fn parse(json: &str) -> Result<SweepPoint, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn old_points_load_as_speed_policies() {
        let bos = parse(&format!(
            r#"{{"l_cut": 22, "anchors": "bos", {}}}"#,
            metrics_json()
        ))
        .unwrap();
        assert_eq!(bos.policy, speed_policy(22, Anchors::Bos));
        assert_eq!(bos.policy.to_string(), "speed:22+bos");
        assert_eq!((bos.l_cut(), bos.keeps_bos()), (Some(22), true));
        assert_eq!((bos.kv_bytes, bos.nll), (1024, 1.5));
        assert_eq!(bos.tokens, None, "old points have no token count");
        assert_eq!(bos.routing_overlap, None, "nor a routing overlap");
        assert!(bos.mean_kl.is_nan());

        let none = parse(&format!(
            r#"{{"l_cut": 7, "anchors": "none", {}}}"#,
            metrics_json()
        ))
        .unwrap();
        assert_eq!(none.policy, speed_policy(7, Anchors::None));
        assert_eq!((none.l_cut(), none.keeps_bos()), (Some(7), false));
        assert_eq!(none.anchors_label(), "none");
    }

    #[test]
    fn points_write_policy_with_l_cut_and_anchors_beside_it() {
        let v = serde_json::to_value(point(speed_policy(22, Anchors::Bos))).unwrap();
        assert_eq!(v["policy"], "speed:22+bos");
        assert_eq!(v["l_cut"], 22);
        assert_eq!(v["anchors"], "bos");
        assert!(v["mean_kl"].is_null());
        assert_eq!(v["tokens"], 12);
        assert!(
            v.get("routing_overlap").is_none(),
            "a dense point writes none"
        );
        let mut moe = point(speed_policy(2, Anchors::Bos));
        moe.routing_overlap = Some(0.75);
        moe.mean_kl = 0.5; // NaN would not equal itself
        let json = serde_json::to_string(&moe).unwrap();
        assert!(json.contains("\"routing_overlap\":0.75"), "{json}");
        assert_eq!(parse(&json).unwrap(), moe);

        let none = serde_json::to_value(point(speed_policy(3, Anchors::None))).unwrap();
        assert_eq!(
            (&none["policy"], &none["l_cut"], &none["anchors"]),
            (&"speed:3".into(), &3.into(), &"none".into())
        );
    }

    #[test]
    fn points_round_trip_and_policy_wins_over_l_cut() {
        for p in [
            speed_policy(22, Anchors::Bos),
            speed_policy(1, Anchors::None),
            "selfonly:5+bos".parse().unwrap(),
            PolicySpec::full(),
            "speed:3/4+bos".parse().unwrap(),
        ] {
            let json = serde_json::to_string(&point(p)).unwrap();
            let back = parse(&json).unwrap();
            assert_eq!(back.policy, p, "{json}");
        }
        let full = serde_json::to_value(point(PolicySpec::full())).unwrap();
        assert_eq!(full["policy"], "full");
        assert!(full.get("l_cut").is_none() && full.get("anchors").is_none());
        assert_eq!(point(PolicySpec::full()).l_cut(), None);
        assert_eq!(point(PolicySpec::full()).cut_label(), "full");
        assert_eq!(point(speed_policy(22, Anchors::Bos)).cut_label(), "22");

        let both = parse(&format!(
            r#"{{"policy": "speed:4", "l_cut": 9, "anchors": "bos", {}}}"#,
            metrics_json()
        ))
        .unwrap();
        assert_eq!(both.policy, speed_policy(4, Anchors::None));
    }

    #[test]
    fn bad_points_are_errors_not_panics() {
        for bad in [
            format!(r#"{{"policy": "speed:x", {}}}"#, metrics_json()),
            format!(
                r#"{{"l_cut": 4, "anchors": "everything", {}}}"#,
                metrics_json()
            ),
            format!(r#"{{"l_cut": 4, {}}}"#, metrics_json()),
            format!(r#"{{{}}}"#, metrics_json()),
        ] {
            let err = parse(&bad).unwrap_err().to_string();
            assert!(err.contains("sweep point"), "{bad}: {err}");
        }
    }
}
