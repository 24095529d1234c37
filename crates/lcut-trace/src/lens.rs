//! The logit lens of one prompt's decode steps, as a trace records it.
//!
//! A decode step's token is read at every hidden state of its query: site 0
//! the embeddings, site `l + 1` the output of layer `l`, each through the
//! model's final norm and LM head (site `L` gives the model's own logits).
//! Per (site, step): the log-probability and the rank of the step's token
//! (the one the last layer ranks first, which greedy decoding emits),
//! whether the site ranks it first, its own first token, and KL(final ‖
//! site). `L + 1` values per step and kind: never `vocab` per step.

use serde::{Deserialize, Serialize};

use crate::tensor::Tensor2;

/// The logit lens of a trace's decode steps; every tensor is `[L + 1,
/// steps]`, site 0 the embeddings and site `l + 1` the output of layer `l`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LensTrace {
    /// Log-probability (nats) of the step's token under the site's lens.
    pub logprob: Tensor2,
    /// Rank of the step's token under the site's lens: 1 + the tokens with
    /// a strictly larger logit (1 = the site's first choice).
    pub rank: Tensor2,
    /// 1 where the site ranks the step's token first, else 0.
    pub top1: Tensor2,
    /// KL(final ‖ site) of the next-token distributions, nats (0 at site L).
    pub kl: Tensor2,
    /// `[L + 1, steps]` row-major: the token each site ranks first.
    pub top_ids: Vec<u32>,
}

impl LensTrace {
    /// A lens of `sites` sites and `steps` steps with every value NaN and
    /// every top id 0; the recorder overwrites them.
    pub fn empty(sites: usize, steps: usize) -> Self {
        let nan = Tensor2::filled([sites, steps], f32::NAN);
        Self {
            logprob: nan.clone(),
            rank: nan.clone(),
            top1: nan.clone(),
            kl: nan,
            top_ids: vec![0; sites * steps],
        }
    }

    /// The four statistics, in the order logprob, rank, top1, kl.
    pub fn tensors(&self) -> [&Tensor2; 4] {
        [&self.logprob, &self.rank, &self.top1, &self.kl]
    }

    /// Number of sites (`L + 1`).
    pub fn sites(&self) -> usize {
        self.top1.shape()[0]
    }

    /// Number of steps.
    pub fn steps(&self) -> usize {
        self.top1.shape()[1]
    }

    /// The formation site of `step`: the smallest site `i` such that every
    /// site from `i` to `L` ranks the step's token first. Site `L` always
    /// does, so it is at most `L`; read as a cut, from layer boundary `i`
    /// on the answer no longer changes. `None` for a step past the end.
    pub fn formation(&self, step: usize) -> Option<usize> {
        let (sites, steps) = (self.sites(), self.steps());
        if step >= steps {
            return None;
        }
        let v = self.top1.view();
        let stays = (0..sites)
            .rev()
            .take_while(|&i| v[[i, step]] == 1.0)
            .count();
        Some(sites - stays)
    }

    /// Checks every shape against `sites` x `steps`.
    pub fn check(&self, sites: usize, steps: usize) -> Result<(), String> {
        let names = ["logprob", "rank", "top1", "kl"];
        for (name, t) in names.iter().zip(self.tensors()) {
            if t.shape() != [sites, steps] {
                return Err(format!(
                    "`lens.{name}` has shape {:?}, expected [num_layers + 1, steps] = {:?}",
                    t.shape(),
                    [sites as u128, steps as u128]
                ));
            }
        }
        if Some(self.top_ids.len()) != sites.checked_mul(steps) {
            return Err(format!(
                "`lens.top_ids` has {} entries, expected (num_layers + 1) x steps = {}",
                self.top_ids.len(),
                sites as u128 * steps as u128
            ));
        }
        Ok(())
    }

    /// Bytes it holds on the heap: four f32 tensors and the ids (the
    /// struct itself lives in its trace).
    pub fn heap_bytes(&self) -> usize {
        let tensors: usize = self.tensors().iter().map(|t| 4 * t.data().len()).sum();
        tensors + 4 * self.top_ids.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formation_is_where_the_token_stays_first() {
        // 4 sites, 3 steps: step 0 forms at 1, step 1 flips back at 2 and
        // forms at 3 (the last site), step 2 is first everywhere
        let mut lens = LensTrace::empty(4, 3);
        let top1 = [[0., 1., 1.], [1., 1., 1.], [1., 0., 1.], [1., 1., 1.]];
        for (i, row) in top1.iter().enumerate() {
            for (k, &v) in row.iter().enumerate() {
                lens.top1.view_mut()[[i, k]] = v;
            }
        }
        assert_eq!(lens.formation(0), Some(1));
        assert_eq!(lens.formation(1), Some(3));
        assert_eq!(lens.formation(2), Some(0));
        assert_eq!(lens.formation(3), None);
    }

    #[test]
    fn check_names_the_field() {
        let mut lens = LensTrace::empty(3, 2);
        lens.check(3, 2).unwrap();
        assert!(lens.check(4, 2).unwrap_err().contains("lens.logprob"));
        lens.top_ids.pop();
        assert!(lens.check(3, 2).unwrap_err().contains("lens.top_ids"));
    }
}
