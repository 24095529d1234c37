//! What an item's generations hold in memory, and how an item whose
//! policies do not fit at once is split into groups that do.
//!
//! An item of a suite run holds, besides the weights: the prompt's one
//! full-depth run ([`SharedPrefix`](crate::shared_prefix::SharedPrefix))
//! with what it recorded for the branches, the full model's generation and
//! its logits rows (the forced runs' reference), and per policy two
//! generations (its own greedy answer and the run teacher-forced on the
//! full continuation). A generation that branches from the prompt run reads
//! the prompt rows it keeps from the run's buffers
//! ([`LayerCache::fork`](lcut_model::LayerCache::fork)): it allocates only
//! the rows it computes itself, its decode-phase tokens' and, for SlimInfer
//! and SwiftKV, the prompt's rows in the layers it runs on its own. A
//! policy that runs its own prompt holds all of its K/V, and one that
//! decides at the prompt's end on its own (SlimInfer's stages, a press that
//! runs alone) a whole copy of the prompt's K/V until it decides, in the
//! one run that finishes the prompt (the other run is copied from it
//! after); the runs are begun one policy at a time, so that copy is
//! counted once.
//!
//! When the policies' generations do not fit beside the rest, they run in
//! groups, one after another, from the same prompt run and the same full
//! continuation: a generation's steps are the same bits whatever decodes
//! beside it, so the results are those of one group.

use std::ops::Range;

use lcut_model::Decoder;
use lcut_model::memory::{available_bytes, format_bytes};
use lcut_policy::Policy;

use crate::error::{EngineError, Result};
use crate::prompt::PreparedPrompt;
use crate::session::Session;
use crate::shared_prefix::{Route, SharedPrefix, layers_shared, routes};

/// The part of the memory free that a run plans its items' groups for:
/// three quarters, the rest left to what the estimate leaves out (the
/// allocator's slack, the decode steps' scratch). A RULER-4K item under the
/// whole leaderboard grid peaked at 1.1 GiB resident on SmolLM2 (estimate
/// 1.1 GiB beside 0.1 GiB of weights and code) and at 1.7 GiB on Gemma 3
/// 270M (estimate 1.1 GiB beside 0.35 GiB).
pub fn planned_share(free: u64) -> u64 {
    free / 4 * 3
}

/// The bytes an item's run may hold: `given`, else the planned share of
/// what `session`'s device has free now (`None` when it cannot say).
pub(crate) fn budget_or_free(given: Option<u64>, session: &Session) -> Option<u64> {
    given.or_else(|| available_bytes(session.model.device()).map(planned_share))
}

/// The K/V buffers a sequence of `prompt` under `policy` allocates for a
/// run of `len` tokens.
fn reserved(model: &Decoder, prompt: &PreparedPrompt, policy: &Policy, len: usize) -> Result<u64> {
    let rule = policy.visibility(prompt.phases(policy)?);
    Ok(model.kv_bytes_reserved(rule.as_ref(), len))
}

/// The K/V buffers a branch of `prompt`'s run under `policy` allocates
/// itself for a run of `len` tokens, where it reads the prompt rows it keeps
/// in the lower `shared` layers from the run: its decode-phase tokens'
/// rows there, every row it keeps above.
fn branch_rows(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policy: &Policy,
    len: usize,
    shared: usize,
) -> Result<u64> {
    let rule = policy.visibility(prompt.phases(policy)?);
    Ok(model.kv_bytes_branch_reserved(rule.as_ref(), (prompt.decode_start, len), shared))
}

/// Bytes a generation in flight holds beside its K/V: about three rows of
/// the vocabulary in f32 (its step's logits, and what greedy choice and the
/// forced runs' agreement and divergence derive from them), as measured on
/// Gemma 3 270M (262,144 tokens): 2.75 MiB a generation beyond its K/V,
/// over policies that branch in each way.
fn generation_scratch(vocab: usize) -> u64 {
    3 * 4 * vocab as u64
}

/// Bytes an item's run holds beyond the weights, by part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemMemory {
    /// The prompt's full-depth run and what it recorded for the branches.
    pub prompt_run: u64,
    /// The full model's generation and its logits rows.
    pub full_generation: u64,
    /// Per policy, its two generations at their longest (zero for a
    /// full-depth policy of the session: its results are the full run's).
    pub per_policy: Vec<u64>,
    /// The most one policy holds while its runs begin (a whole copy of the
    /// prompt's K/V, for a policy that decides at the prompt's end).
    pub transient: u64,
}

impl ItemMemory {
    /// The parts for `prompt` under `policies` on `model`, with `max_new`
    /// new tokens and prefill chunks of `chunk`.
    pub fn of(
        model: &Decoder,
        prompt: &PreparedPrompt,
        policies: &[Policy],
        (max_new, chunk): (usize, usize),
    ) -> Result<Self> {
        let cfg = model.config();
        let full = Policy::full(cfg.num_layers);
        let len = prompt.len() + max_new;
        let full_kv = reserved(model, prompt, &full, len)?;
        let rows = (max_new * cfg.vocab_size * 4) as u64;
        let record = SharedPrefix::record_bytes(model, prompt, policies, chunk)?;
        let scratch = generation_scratch(cfg.vocab_size);
        let layers = cfg.num_layers;
        let routes = routes(model, prompt, policies)?;
        let per_policy = policies
            .iter()
            .zip(&routes)
            .map(|(p, &route)| match p.is_full_depth() {
                true => Ok(0),
                false => {
                    // a press keeps every decode-phase row, and makes room
                    // for the whole prompt where it runs it alone, as the
                    // full model does
                    let like = if p.press().is_some() { &full } else { p };
                    let shared = layers_shared(model, prompt, p, route)?;
                    Ok(2 * (branch_rows(model, prompt, like, len, shared)? + scratch))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let decides_alone = policies.iter().zip(routes).any(|(p, route)| {
            p.slim().is_some() || (p.press().is_some() && matches!(route, Route::Alone(_)))
        });
        Ok(Self {
            prompt_run: full_kv + record,
            full_generation: branch_rows(model, prompt, &full, len, layers)? + scratch + rows,
            per_policy,
            transient: if decides_alone { full_kv } else { 0 },
        })
    }

    /// The parts for `prompt` in a cutoff sweep ([`accuracy_by_cutoff`](super::accuracy_by_cutoff)):
    /// one full-depth prompt run restricted for each of `policies`, each
    /// with one greedy generation of up to `max_new` tokens, and no full
    /// generation or press.
    pub fn of_cutoffs(
        model: &Decoder,
        prompt: &PreparedPrompt,
        policies: &[Policy],
        max_new: usize,
    ) -> Result<Self> {
        let len = prompt.len() + max_new;
        let cfg = model.config();
        let full = Policy::full(cfg.num_layers);
        let scratch = generation_scratch(cfg.vocab_size);
        Ok(Self {
            prompt_run: reserved(model, prompt, &full, len)?,
            full_generation: 0,
            per_policy: policies
                .iter()
                .map(|p| Ok(branch_rows(model, prompt, p, len, cfg.num_layers)? + scratch))
                .collect::<Result<_>>()?,
            transient: 0,
        })
    }

    /// What the item holds at its peak when every policy runs in one group.
    pub fn total(&self) -> u64 {
        self.fixed() + self.per_policy.iter().sum::<u64>()
    }

    /// What the item holds whatever the grouping: the prompt's run, the
    /// full generation and one policy's runs as they begin.
    fn fixed(&self) -> u64 {
        self.prompt_run + self.full_generation + self.transient
    }

    /// The policies' groups, consecutive ranges of their indices, each
    /// holding at most what `budget` leaves beside the fixed part (one
    /// group when there is no budget or everything fits). Refused, with the
    /// figures, when even the largest policy alone does not fit.
    pub fn groups(&self, budget: Option<u64>) -> Result<Vec<Range<usize>>> {
        let all = 0..self.per_policy.len();
        let Some(budget) = budget else {
            return Ok(vec![all]);
        };
        if self.total() <= budget {
            return Ok(vec![all]);
        }
        let largest = self.per_policy.iter().copied().max().unwrap_or(0);
        let room = budget.checked_sub(self.fixed()).filter(|&r| r >= largest);
        let Some(room) = room else {
            return Err(EngineError::ItemOutOfMemory {
                need: format!(
                    "{} (the prompt's run {}, the full generation {}, a policy's runs \
                     beginning {}, the largest policy's runs {})",
                    format_bytes(self.fixed() + largest),
                    format_bytes(self.prompt_run),
                    format_bytes(self.full_generation),
                    format_bytes(self.transient),
                    format_bytes(largest)
                ),
                free: format_bytes(budget),
            });
        };
        let mut groups = Vec::new();
        let (mut start, mut held) = (0, 0);
        for (i, &bytes) in self.per_policy.iter().enumerate() {
            if held + bytes > room && i > start {
                groups.push(start..i);
                (start, held) = (i, 0);
            }
            held += bytes;
        }
        groups.push(start..self.per_policy.len());
        Ok(groups)
    }

    /// One line for a run's log: the parts, and the groups `budget` makes.
    pub fn line(&self, what: &str, budget: Option<u64>) -> String {
        let policies = self.per_policy.iter().filter(|&&b| b > 0).count();
        let free = budget.map_or("unknown".into(), format_bytes);
        let groups = match self.groups(budget) {
            Ok(g) if g.len() > 1 => format!("; the policies run in {} groups", g.len()),
            Ok(_) => String::new(),
            Err(_) => "; it does not fit".into(),
        };
        let full = match self.full_generation {
            0 => String::new(),
            bytes => format!(", the full generation {}", format_bytes(bytes)),
        };
        format!(
            "memory: {what} holds about {} beside the weights (the prompt's run {}{full}, \
             {policies} policies' generations {}); the run plans for {free}{groups}",
            format_bytes(self.total()),
            format_bytes(self.prompt_run),
            format_bytes(self.per_policy.iter().sum::<u64>() + self.transient),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn memory(per_policy: &[u64]) -> ItemMemory {
        ItemMemory {
            prompt_run: 100 * M,
            full_generation: 50 * M,
            per_policy: per_policy.iter().map(|b| b * M).collect(),
            transient: 10 * M,
        }
    }

    /// Groups are consecutive, cover every policy once, and each fits the
    /// room the budget leaves; no budget or enough of it is one group.
    #[test]
    fn policies_are_grouped_to_fit() {
        let m = memory(&[40, 0, 30, 30, 40, 20]);
        assert_eq!(m.total(), 320 * M);
        assert_eq!(m.groups(None).unwrap(), vec![0..6]);
        assert_eq!(m.groups(Some(320 * M)).unwrap(), vec![0..6]);
        // 160 fixed, room 70
        assert_eq!(m.groups(Some(230 * M)).unwrap(), vec![0..3, 3..5, 5..6]);
        // room 40: the largest alone fits
        assert_eq!(
            m.groups(Some(200 * M)).unwrap(),
            vec![0..2, 2..3, 3..4, 4..5, 5..6]
        );
        let err = m.groups(Some(199 * M)).unwrap_err().to_string();
        assert!(
            err.contains("200.0 MiB") && err.contains("199.0 MiB"),
            "{err}"
        );
        assert!(m.line("an item", Some(230 * M)).contains("in 3 groups"));
        assert!(m.line("an item", Some(199 * M)).contains("does not fit"));
    }
}
