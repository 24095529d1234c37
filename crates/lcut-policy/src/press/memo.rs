//! Scores shared by the presses of one prompt run. A press's scores of a
//! layer depend on the layer's prompt K/V, the queries it observed and the
//! press's scoring settings, never on its compression ratio; SnapKV and
//! PyramidKV score alike (they differ in how many each layer keeps). A
//! leaderboard grid runs every press at four ratios from one prompt run, so
//! each layer is scored once per scoring, not once per configuration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{PressName, PressParams};

/// What a press's scores depend on besides the prompt: its scoring and the
/// settings that scoring reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Scoring {
    /// SnapKV's and PyramidKV's pooled window attention.
    Window { window: usize, kernel: usize },
    /// KNorm's key norms.
    Knorm,
    /// TOVA's last query's attention.
    Tova,
    /// Expected Attention's statistics.
    Expected {
        sink: usize,
        future: usize,
        covariance: bool,
        vnorm: bool,
        epsilon_bits: u64,
    },
}

impl Scoring {
    /// The scoring of `p`'s press (`None` for StreamingLLM, which keeps by
    /// position).
    pub(super) fn of(p: &PressParams) -> Option<Self> {
        Some(match p.name {
            PressName::StreamingLlm => return None,
            PressName::SnapKv | PressName::PyramidKv => Self::Window {
                window: p.window,
                kernel: p.kernel,
            },
            PressName::Knorm => Self::Knorm,
            PressName::Tova => Self::Tova,
            PressName::Expected => Self::Expected {
                sink: p.sink,
                future: p.future,
                covariance: p.covariance,
                vnorm: p.vnorm,
                epsilon_bits: p.epsilon.to_bits(),
            },
        })
    }
}

/// Per-head (or, for TOVA, one) score rows of a layer.
pub(super) type Scores = Arc<Vec<Vec<f64>>>;

/// A memo entry's key: the scoring, the layer and its keys' fingerprint.
type MemoKey = (Scoring, usize, u64);

/// The scores computed so far by the runs that share one prompt run (a run,
/// its forks and the presses retargeted from it). An entry is keyed by the
/// layer's prompt keys as well, so a fork whose prompt went on differently
/// never reads another prompt's scores.
#[derive(Debug, Clone, Default)]
pub(super) struct ScoreMemo(Arc<Mutex<HashMap<MemoKey, Scores>>>);

impl ScoreMemo {
    /// The scores of `scoring` at `layer` whose prompt keys are `keys`:
    /// the memo's, or `compute`'s, kept for the next run that asks.
    pub(super) fn get_or_compute<E>(
        &self,
        (scoring, layer): (Scoring, usize),
        keys: &[f32],
        compute: impl FnOnce() -> Result<Vec<Vec<f64>>, E>,
    ) -> Result<Scores, E> {
        let key = (scoring, layer, fingerprint(keys));
        if let Some(hit) = self.lock().get(&key) {
            return Ok(Arc::clone(hit));
        }
        let scores = Arc::new(compute()?);
        self.lock().insert(key, Arc::clone(&scores));
        Ok(scores)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<MemoKey, Scores>> {
        // a run that panicked while holding the lock left whole entries
        // only: the map is still valid
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A 64-bit fingerprint of a layer's prompt keys (their bits and count):
/// the keys at a position depend on every token up to it, so equal keys
/// mean the same prompt.
fn fingerprint(keys: &[f32]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ keys.len() as u64;
    for &k in keys {
        h = (h ^ u64::from(k.to_bits())).wrapping_mul(PRIME);
        h ^= h >> 29;
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_share_and_other_prompts_do_not() {
        let memo = ScoreMemo::default();
        let snap = Scoring::of(&PressParams::new(PressName::SnapKv, 0.25)).unwrap();
        let pyramid = Scoring::of(&PressParams::new(PressName::PyramidKv, 0.75)).unwrap();
        assert_eq!(snap, pyramid);
        let mut calls = 0;
        let mut get = |keys: &[f32], scoring| {
            memo.get_or_compute::<()>((scoring, 3), keys, || {
                calls += 1;
                Ok(vec![vec![keys[0] as f64]])
            })
            .unwrap()
        };
        assert_eq!(get(&[1.0, 2.0], snap)[0][0], 1.0);
        assert_eq!(get(&[1.0, 2.0], pyramid)[0][0], 1.0);
        // another prompt's keys, another scoring: computed afresh
        assert_eq!(get(&[5.0, 2.0], snap)[0][0], 5.0);
        let tova = Scoring::of(&PressParams::new(PressName::Tova, 0.5)).unwrap();
        assert_eq!(get(&[1.0, 2.0], tova)[0][0], 1.0);
        assert_eq!(calls, 3);
        assert!(Scoring::of(&PressParams::new(PressName::StreamingLlm, 0.5)).is_none());
    }
}
