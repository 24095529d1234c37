//! StreamingLLM (Xiao et al., arXiv 2309.17453) as kvpress's
//! `StreamingLLMPress` defines it: of a prompt of `n` positions each layer
//! keeps the first `sink` (the attention sinks, 4 by default) and the
//! latest `n_kept - sink`, where `n_kept = max(1, int(n (1 - R)))`; every
//! head and layer keeps the same positions. The keys keep their rotary
//! positions (kvpress's press, not its `KeyRerotationPress` wrapper).

use super::PressParams;

/// Which of the `n` prompt positions a layer keeps when it keeps `kept`
/// of them.
pub(super) fn keep(p: &PressParams, n: usize, kept: usize) -> Vec<bool> {
    let recent = kept.saturating_sub(p.sink);
    (0..n).map(|i| i < p.sink || i + recent >= n).collect()
}

#[cfg(test)]
mod tests {
    use super::super::{PressName, PressParams};
    use super::*;

    #[test]
    fn keeps_the_sinks_and_the_latest_positions() {
        let p = PressParams::new(PressName::StreamingLlm, 0.5);
        let n = 28;
        let kept = p.kept_at(0, 6, n);
        let k = keep(&p, n, kept);
        let on: Vec<usize> = (0..n).filter(|&i| k[i]).collect();
        assert_eq!(kept, 14);
        assert_eq!(on, [0, 1, 2, 3, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27]);
    }
}
