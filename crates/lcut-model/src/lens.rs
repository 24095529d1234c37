//! The logit lens: every hidden state of a position read through the
//! model's own final norm and LM head (and final softcap), as if the model
//! ended there (nostalgebraist 2020; the convention of transformers-based
//! lens tools: the last site is the model's own logits).
//!
//! A position has `L + 1` sites: site 0 the embeddings entering layer 0
//! (scaled where the architecture scales them), site `l + 1` the residual
//! stream after layer `l`; site `L` gives the model's logits. Each site is
//! summarised against a target token (the token the last site ranks first,
//! which greedy decoding emits): its log-probability, its rank, the site's
//! own top token and KL(final ‖ site) in nats, the divergence of the
//! site's next-token distribution from the model's (the tuned-lens
//! convention). Only `L + 1` numbers of each kind leave the device per
//! position; the `[L + 1, vocab]` logits only when asked.

use std::collections::BTreeMap;

use candle_core::Tensor;

use crate::decoder::Decoder;
use crate::error::Result;
use crate::probe::{Probe, ResidualSite};

/// Most lens logits (sites x positions x vocabulary) one block of
/// [`Decoder::lens_records`] holds: 1M f32 values (4 MB); a block holds at
/// least one site of one position whatever the model's size.
pub const LENS_BLOCK_ELEMS: usize = 1 << 20;

/// Upper bound on the bytes [`Decoder::lens_records`] holds at once when
/// it reads one position (a decode step) of a model of `vocab` tokens with
/// `sites` hidden states: a block of at most `max(LENS_BLOCK_ELEMS, vocab)`
/// lens logits on the device and their host copy (and a softcap's
/// temporaries: 4 f32 copies), the final row with its f64 probabilities,
/// plus the `[sites, vocab]` logits when they are kept (`keep_logits`).
pub fn lens_buffer_bound(sites: usize, vocab: usize, keep_logits: bool) -> u64 {
    let block = LENS_BLOCK_ELEMS.max(vocab).min(sites.max(1) * vocab);
    let kept = if keep_logits { 8 * sites * vocab } else { 0 };
    (16 * block + 12 * vocab + kept) as u64
}

/// Receives each position's lens logits [sites, vocab] (f32) as
/// [`Decoder::lens_records`] makes them.
pub type LogitSink<'a> = &'a mut dyn FnMut(usize, &Tensor) -> Result<()>;

/// The lens of one position at every site (index 0 the embeddings, `l + 1`
/// the output of layer `l`).
#[derive(Debug, Clone, PartialEq)]
pub struct LensRecord {
    /// The position.
    pub position: usize,
    /// The token the statistics are of: the one the last site ranks first,
    /// unless the caller named another.
    pub target: u32,
    /// Log-probability of the target under each site's lens.
    pub logprob: Vec<f32>,
    /// Rank of the target under each site's lens: 1 + the tokens whose
    /// logit is strictly larger (1 = the site's first choice); 0 where a
    /// policy kept the position out of that site (its other statistics
    /// are NaN there).
    pub rank: Vec<u32>,
    /// The token each site ranks first.
    pub top: Vec<u32>,
    /// KL(final ‖ site) of the next-token distributions, nats (0 at the
    /// last site).
    pub kl: Vec<f32>,
}

impl LensRecord {
    /// The formation site: the smallest site from which every site up to
    /// the last ranks the target first (the last site always does, so it
    /// is at most `L`). Read as a cut: from this layer boundary on, the
    /// answer no longer changes.
    pub fn formation(&self) -> usize {
        let sites = self.rank.len();
        sites - self.rank.iter().rev().take_while(|&&r| r == 1).count()
    }
}

/// Records the lens of every position from a given one on, at every site,
/// as the decoder computes them (a prefill's last chunk, each decode step,
/// a teacher-forced pass): each site's rows are held until the last
/// layer's arrive, then the statistics are computed and the rows dropped.
pub struct LensProbe<'m> {
    model: &'m Decoder,
    from: usize,
    /// Per site, rows waiting for their position's last layer.
    pending: Vec<BTreeMap<usize, Tensor>>,
    keep_logits: bool,
    logits: Vec<(usize, Tensor)>,
    /// One record per position, in the order the last layer reached them.
    pub records: Vec<LensRecord>,
}

impl<'m> LensProbe<'m> {
    /// A probe of `model`'s lens at positions `from` and later.
    pub fn new(model: &'m Decoder, from: usize) -> Self {
        Self {
            model,
            from,
            pending: vec![BTreeMap::new(); model.config().num_layers + 1],
            keep_logits: false,
            logits: Vec::new(),
            records: Vec::new(),
        }
    }

    /// Also keep each position's lens logits [sites, vocab] until
    /// [`LensProbe::take_logits`] takes them (`--save-lens-logits`).
    pub fn keeping_logits(mut self) -> Self {
        self.keep_logits = true;
        self
    }

    /// The lens logits kept since the last call, by position, oldest first.
    pub fn take_logits(&mut self) -> Vec<(usize, Tensor)> {
        std::mem::take(&mut self.logits)
    }

    /// The lens of the positions whose last layer just ran.
    fn finish(&mut self, positions: &[usize]) -> Result<()> {
        let width = self.model.config().hidden_size;
        let dtype = self.model.dtype();
        let device = self.model.device().clone();
        // a position a policy kept out of some layer has no row there: a
        // zero row stands in and its statistics are NaN
        let mut missing = vec![Vec::new(); positions.len()];
        let mut sites = Vec::with_capacity(self.pending.len());
        for (i, rows) in self.pending.iter_mut().enumerate() {
            let picked = positions
                .iter()
                .enumerate()
                .map(|(k, p)| match rows.remove(p) {
                    Some(r) => Ok(r),
                    None => {
                        missing[k].push(i);
                        Tensor::zeros((1, width), dtype, &device)
                    }
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            sites.push(Tensor::cat(&picked, 0)?);
            // rows of positions before these can no longer finish
            let last = positions.last().copied().unwrap_or(0);
            rows.retain(|&p, _| p > last);
        }
        let keep = self.keep_logits;
        let kept = &mut self.logits;
        let mut sink = |p: usize, z: &Tensor| -> Result<()> {
            kept.push((p, z.copy()?));
            Ok(())
        };
        let sink: Option<LogitSink<'_>> = if keep { Some(&mut sink) } else { None };
        let mut records = self.model.lens_records(&sites, positions, None, sink)?;
        for (rec, gone) in records.iter_mut().zip(&missing) {
            for &i in gone {
                rec.logprob[i] = f32::NAN;
                rec.kl[i] = f32::NAN;
                rec.rank[i] = 0;
            }
        }
        self.records.extend(records);
        Ok(())
    }
}

impl Probe for LensProbe<'_> {
    fn wants_residual(&self, _site: ResidualSite) -> bool {
        true
    }

    fn on_residual(
        &mut self,
        site: ResidualSite,
        positions: &[usize],
        hidden: &Tensor,
    ) -> Result<()> {
        let index = site.entered_layer();
        let first = positions.partition_point(|&p| p < self.from);
        if first == positions.len() || index >= self.pending.len() {
            return Ok(());
        }
        let rows = &mut self.pending[index];
        for (k, &p) in positions.iter().enumerate().skip(first) {
            rows.insert(p, hidden.narrow(0, k, 1)?.to_dtype(self.model.dtype())?);
        }
        if index + 1 == self.pending.len() {
            self.finish(&positions[first..])?;
        }
        Ok(())
    }
}
