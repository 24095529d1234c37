//! Generation under a visibility policy, one step at a time, with timing and
//! KV accounting.

use std::time::Instant;

use candle_core::{DType, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling as CandleSampling};
use lcut_model::{Decoder, LogitRows, Probe, Sequence};
use lcut_policy::{KvCost, Policy, SlimTrace, TokenPhases};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};
use crate::prompt::PreparedPrompt;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Sampling {
    /// The most likely token.
    Greedy,
    /// Sample at `temperature`, optionally restricted to the top-k and/or top-p.
    Sample {
        /// Softmax temperature (> 0).
        temperature: f64,
        /// Keep only the k most likely tokens.
        top_k: Option<usize>,
        /// Keep the smallest set of tokens whose mass reaches p.
        top_p: Option<f64>,
        /// Seed of the sampler.
        seed: u64,
    },
}

impl Sampling {
    fn processor(&self) -> LogitsProcessor {
        match *self {
            Sampling::Greedy => LogitsProcessor::from_sampling(0, CandleSampling::ArgMax),
            Sampling::Sample {
                temperature,
                top_k,
                top_p,
                seed,
            } => {
                let sampling = match (top_k, top_p) {
                    (None, None) => CandleSampling::All { temperature },
                    (Some(k), None) => CandleSampling::TopK { k, temperature },
                    (None, Some(p)) => CandleSampling::TopP { p, temperature },
                    (Some(k), Some(p)) => CandleSampling::TopKThenTopP { k, p, temperature },
                };
                LogitsProcessor::from_sampling(seed, sampling)
            }
        }
    }
}

/// Settings of one generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationConfig {
    /// Most tokens to produce.
    pub max_new_tokens: usize,
    /// Token choice.
    pub sampling: Sampling,
    /// Tokens that end the generation (produced, then stop).
    pub stop_tokens: Vec<u32>,
    /// Prompt tokens per prefill chunk: bounds the attention scores held at
    /// once to chunk x context.
    pub prefill_chunk: usize,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 64,
            sampling: Sampling::Greedy,
            stop_tokens: Vec::new(),
            prefill_chunk: 512,
        }
    }
}

/// Wall-clock figures of one generation.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Timing {
    /// Time to first token: prefill plus the first sampling, seconds (time
    /// inside the generation's own steps; see `Generation::step`).
    pub ttft_s: f64,
    /// Mean time per output token after the first, seconds (0 with one token).
    pub tpot_s: f64,
    /// Total time, seconds.
    pub total_s: f64,
    /// Output tokens per second over the whole run.
    pub tokens_per_s: f64,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StopReason {
    /// A stop token was produced.
    StopToken,
    /// The new-token budget was used up.
    MaxTokens,
    /// The caller stopped it (`on_step` returned false, or the viewer's cancel).
    Cancelled,
}

/// One produced token.
#[derive(Debug, Clone)]
pub struct Step {
    /// Index of the output token (0 = first).
    pub index: usize,
    /// The token.
    pub token: u32,
    /// The logits it was chosen from `[vocab]`, f32.
    pub logits: Tensor,
}

/// The result of a finished generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationOutput {
    /// The policy, written out.
    pub policy: String,
    /// Output tokens (a final stop token included).
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub stop: StopReason,
    /// Timing.
    pub timing: Timing,
    /// K/V bytes the caches hold at the end.
    pub kv_bytes_held: u64,
    /// K/V bytes by the cost formula for the same tokens.
    pub kv_bytes_formula: u64,
    /// K/V bytes the full model would hold for the same tokens.
    pub kv_bytes_full: u64,
    /// K/V bytes decode reads (SlimInfer: sink, active blocks and decode
    /// phase; the rest could sit offloaded); equals `kv_bytes_held` for
    /// static policies.
    #[serde(default)]
    pub kv_bytes_resident: u64,
    /// SlimInfer's decisions: kept blocks and scores per cut, and per decode
    /// step the overlap, swaps and traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slim: Option<SlimTrace>,
}

/// Run `prompt`'s tokens before its decode start through `seq` in chunks
/// of `chunk` tokens (no logits), `probe` (if any) seeing every chunk;
/// `on_chunk(done)` after each chunk returns false to stop early, and then
/// this returns `Ok(false)`.
pub(crate) fn prefill_before_decode_start(
    model: &Decoder,
    seq: &mut Sequence,
    prompt: &PreparedPrompt,
    chunk: usize,
    mut probe: Option<&mut (dyn Probe + '_)>,
    mut on_chunk: impl FnMut(usize) -> bool,
) -> Result<bool> {
    let s = prompt.decode_start;
    let chunk = chunk.max(1);
    for start in (0..s).step_by(chunk) {
        let end = (start + chunk).min(s);
        model.forward(
            seq,
            &prompt.ids[start..end],
            LogitRows::None,
            probe.as_deref_mut(),
        )?;
        if !on_chunk(end) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A non-empty prompt that, with `config`'s token budget, fits the
/// model's positions.
pub(crate) fn check_fits(
    model: &Decoder,
    prompt: &PreparedPrompt,
    config: &GenerationConfig,
) -> Result<()> {
    if prompt.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let max_positions = model.config().max_position_embeddings;
    if prompt.len().saturating_add(config.max_new_tokens) > max_positions {
        return Err(EngineError::PromptTooLong {
            prompt_len: prompt.len(),
            max_new_tokens: config.max_new_tokens,
            max_positions,
        });
    }
    Ok(())
}

/// A new sequence of `prompt` under `policy`, with room for `extra` tokens
/// after the prompt, holding the prompt's tokens before its decode start
/// (run in chunks of `chunk`).
pub(crate) fn prefill_prefix(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policy: Policy,
    extra: usize,
    chunk: usize,
) -> Result<Sequence> {
    let phases = prompt.phases(&policy)?;
    let seq = model.new_sequence(policy, phases)?;
    run_prefix(model, seq, prompt, extra, chunk)
}

/// `seq` with room for `extra` tokens after `prompt`, holding the prompt's
/// tokens before its decode start (run in chunks of `chunk`).
fn run_prefix(
    model: &Decoder,
    mut seq: Sequence,
    prompt: &PreparedPrompt,
    extra: usize,
    chunk: usize,
) -> Result<Sequence> {
    seq.reserve(prompt.len().saturating_add(extra));
    prefill_before_decode_start(model, &mut seq, prompt, chunk, None, |_| true)?;
    Ok(seq)
}

/// How far the prompt's prefill has got, in prompt tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillProgress {
    /// Prompt tokens processed.
    pub done: usize,
    /// Prompt tokens in all.
    pub total: usize,
}

impl PrefillProgress {
    /// True once the whole prompt has been processed.
    pub fn finished(&self) -> bool {
        self.done >= self.total
    }
}

/// A generation in progress: call [`Generation::step`] until it returns
/// `None`. The first step runs the prompt; a caller that wants progress or
/// a chance to cancel during a long prompt calls
/// [`Generation::advance_prefill`] first, one chunk at a time.
pub struct Generation<'m> {
    model: &'m Decoder,
    seq: Sequence,
    prompt: PreparedPrompt,
    /// Prompt tokens processed so far.
    prefilled: usize,
    /// Logits of the prompt's last token, once the prefill has reached it.
    prompt_logits: Option<Tensor>,
    config: GenerationConfig,
    sampler: LogitsProcessor,
    produced: Vec<u32>,
    stop: Option<StopReason>,
    /// Seconds spent inside `step` (model, sampling), so that a caller's
    /// own work between steps, or another generation run in lockstep, does
    /// not count against this one.
    busy_s: f64,
    first_token_at: Option<f64>,
}

impl<'m> Generation<'m> {
    /// Prepare a generation of `prompt` under `policy`; checks that the
    /// prompt and the token budget fit the model.
    pub fn new(
        model: &'m Decoder,
        prompt: PreparedPrompt,
        policy: Policy,
        config: GenerationConfig,
    ) -> Result<Self> {
        check_fits(model, &prompt, &config)?;
        let phases = prompt.phases(&policy)?;
        let seq = model.new_sequence(policy, phases)?;
        Ok(Self::with_sequence(model, prompt, seq, 0, config))
    }

    /// Go on from `prefix`, a state of `prompt`'s tokens before its decode
    /// start (from [`Generation::prefill_to_decode_start`], forked, or
    /// [restricted](Sequence::restricted) to another policy): the prompt's
    /// earlier tokens are not run again, so one prefill serves several
    /// continuations. Checks that the prompt and the token budget fit the
    /// model and that `prefix` holds exactly the tokens before the decode
    /// start.
    pub fn from_prefix(
        model: &'m Decoder,
        prompt: PreparedPrompt,
        prefix: Sequence,
        config: GenerationConfig,
    ) -> Result<Self> {
        check_fits(model, &prompt, &config)?;
        if prefix.len() != prompt.decode_start {
            return Err(EngineError::PrefixMismatch {
                held: prefix.len(),
                decode_start: prompt.decode_start,
            });
        }
        let done = prompt.decode_start;
        Ok(Self::with_sequence(model, prompt, prefix, done, config))
    }

    fn with_sequence(
        model: &'m Decoder,
        prompt: PreparedPrompt,
        mut seq: Sequence,
        prefilled: usize,
        config: GenerationConfig,
    ) -> Self {
        seq.reserve(prompt.len().saturating_add(config.max_new_tokens));
        Self {
            model,
            seq,
            sampler: config.sampling.processor(),
            prompt,
            prefilled,
            prompt_logits: None,
            config,
            produced: Vec::new(),
            stop: None,
            busy_s: 0.0,
            first_token_at: None,
        }
    }

    /// A second generation of the same prompt from this one's state once
    /// its whole prompt has run and before it has produced a token, under
    /// `config`: the prompt (a policy's decision at the decode start among
    /// it) is not run again, and the copy's first step reads the same
    /// logits. `None` before the prompt is done or once a token is out.
    pub fn fork_prefilled(&self, config: GenerationConfig) -> Result<Option<Self>> {
        if self.prefilled < self.prompt.len() || self.prompt_logits.is_none() {
            return Ok(None);
        }
        check_fits(self.model, &self.prompt, &config)?;
        self.fork_with(config).map(Some)
    }

    /// A second greedy generation from this one's state after its last
    /// step, that chose `token` there instead of the token this one
    /// recorded (a run teacher-forced on another's tokens, and the same
    /// policy's own greedy run, are one run until their choices first
    /// differ): nothing is run again, the copy's next step feeds `token`,
    /// and it ends where [`Generation::step`] would have ended it on
    /// `token` (a stop token, its budget). The copy reads the rows so far
    /// from this one's buffers ([`Sequence::fork`]). `None` before a token
    /// is out, and for a sampling generation, whose choices depend on its
    /// sampler's state as well as on its logits.
    pub fn fork_choosing(&self, token: u32) -> Result<Option<Self>> {
        if self.produced.is_empty() || self.config.sampling != Sampling::Greedy {
            return Ok(None);
        }
        let mut copy = self.fork_with(self.config.clone())?;
        copy.produced.clone_from(&self.produced);
        copy.produced.pop();
        copy.push_token(token);
        copy.first_token_at = self.first_token_at;
        Ok(Some(copy))
    }

    /// A copy of this generation's state under `config`, reading the rows
    /// so far from this one's buffers ([`Sequence::fork`]): the prompt run,
    /// its last logits and the time spent, nothing produced yet.
    fn fork_with(&self, config: GenerationConfig) -> Result<Self> {
        let seq = self.seq.fork()?;
        let mut copy =
            Self::with_sequence(self.model, self.prompt.clone(), seq, self.prefilled, config);
        copy.prompt_logits.clone_from(&self.prompt_logits);
        copy.busy_s = self.busy_s;
        Ok(copy)
    }

    /// Token phases of the prompt under this generation's policy.
    pub fn phases(&self) -> &TokenPhases {
        self.seq.phases()
    }

    /// The sequence state (caches, policy).
    pub fn sequence(&self) -> &Sequence {
        &self.seq
    }

    /// Tokens produced so far.
    pub fn produced(&self) -> &[u32] {
        &self.produced
    }

    /// The prompt.
    pub fn prompt(&self) -> &PreparedPrompt {
        &self.prompt
    }

    /// Produce the next token (the first call runs the prefill), or `None`
    /// once a stop token or the budget ended the generation. The probe, if
    /// any, sees the layers computed in this step.
    pub fn step(&mut self, probe: Option<&mut (dyn Probe + '_)>) -> Result<Option<Step>> {
        if self.check_ended() {
            return Ok(None);
        }
        let logits = match self.produced.last() {
            None => self.prefill(probe)?,
            Some(&last) => self.decode_one(last, probe)?,
        };
        self.record(logits, |own| own).map(Some)
    }

    /// One step of every generation in `gens` that has not ended, their
    /// decode steps decoded together ([`Decoder::forward_batch`]: one pass
    /// over the weights for up to eight generations of one model); a
    /// generation's first step (its prompt) runs alone. The token each
    /// records is `choose(i, own)`, `own` being the one generation `i`
    /// chose itself: `choose` is called in the order of `gens`, so a
    /// generation can be made to follow an earlier one's choice of the same
    /// round (teacher forcing). Returns each generation's step, `None` for
    /// one that had ended. Greedy choices are those of stepping each alone.
    pub fn step_together(
        gens: &mut [&mut Generation<'m>],
        mut choose: impl FnMut(usize, u32) -> u32,
    ) -> Result<Vec<Option<Step>>> {
        let mut logits: Vec<Option<Tensor>> = vec![None; gens.len()];
        let mut decoding = Vec::new();
        for (i, g) in gens.iter_mut().enumerate() {
            if g.check_ended() {
                continue;
            }
            match g.produced.last() {
                None => logits[i] = Some(g.prefill(None)?),
                Some(_) => decoding.push(i),
            }
        }
        while let Some(&first) = decoding.first() {
            let model = gens[first].model;
            let (same, rest): (Vec<usize>, Vec<usize>) = decoding
                .iter()
                .partition(|&&i| std::ptr::eq(gens[i].model, model));
            let started = Instant::now();
            let mut members: Vec<&mut Generation<'m>> = gens
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| same.contains(i))
                .map(|(_, g)| &mut **g)
                .collect();
            let tokens: Vec<u32> = members
                .iter()
                .map(|g| g.produced.last().copied().unwrap_or_default())
                .collect();
            let mut seqs: Vec<&mut Sequence> = members.iter_mut().map(|g| &mut g.seq).collect();
            let rows = model.forward_batch(&mut seqs, &tokens)?;
            let secs = started.elapsed().as_secs_f64();
            for ((g, row), &i) in members.iter_mut().zip(rows).zip(&same) {
                g.busy_s += secs;
                logits[i] = Some(row.squeeze(0)?.to_dtype(DType::F32)?);
            }
            decoding = rest;
        }
        gens.iter_mut()
            .zip(logits)
            .enumerate()
            .map(|(i, (g, l))| l.map(|l| g.record(l, |own| choose(i, own))).transpose())
            .collect()
    }

    /// Whether the generation has ended: a stop token, its budget spent,
    /// or cancelled.
    pub fn ended(&self) -> bool {
        self.stop.is_some() || self.produced.len() >= self.config.max_new_tokens
    }

    /// Whether the generation has ended (marked so once its budget is
    /// spent).
    fn check_ended(&mut self) -> bool {
        let ended = self.ended();
        if ended {
            self.stop.get_or_insert(StopReason::MaxTokens);
        }
        ended
    }

    /// Record the token `choose` makes of this generation's own choice
    /// from `logits`, and end the generation at a stop token or its budget.
    fn record(&mut self, logits: Tensor, choose: impl FnOnce(u32) -> u32) -> Result<Step> {
        let started = Instant::now();
        let token = choose(self.sampler.sample(&logits)?);
        self.push_token(token);
        self.busy_s += started.elapsed().as_secs_f64();
        self.first_token_at.get_or_insert(self.busy_s);
        Ok(Step {
            index: self.produced.len() - 1,
            token,
            logits,
        })
    }

    /// Take `token` as the next produced token, and end the generation at
    /// a stop token or its budget.
    fn push_token(&mut self, token: u32) {
        self.produced.push(token);
        if self.config.stop_tokens.contains(&token) {
            self.finish(StopReason::StopToken);
        } else if self.produced.len() >= self.config.max_new_tokens {
            self.finish(StopReason::MaxTokens);
        }
    }

    fn finish(&mut self, reason: StopReason) {
        self.stop = Some(reason);
    }

    /// Stop the generation as cancelled by the caller (a no-op once it has
    /// ended); later steps return `None`.
    pub fn cancel(&mut self) {
        self.stop.get_or_insert(StopReason::Cancelled);
    }

    /// Run the next chunk of the prompt: tokens before the decode start in
    /// chunks of `prefill_chunk`, then the decode-phase prompt tokens, the
    /// last chunk giving the logits of the first output token. The first
    /// [`Generation::step`] runs whatever is left, so calling this is only
    /// needed to report progress or cancel within a long prompt. A no-op
    /// once the prompt is done. Its time counts toward TTFT.
    pub fn advance_prefill(
        &mut self,
        probe: Option<&mut (dyn Probe + '_)>,
    ) -> Result<PrefillProgress> {
        let (p, s) = (self.prompt.len(), self.prompt.decode_start);
        if self.prefilled < p {
            let started = Instant::now();
            let chunk = self.config.prefill_chunk.max(1);
            let start = self.prefilled;
            let (end, rows) = if start < s {
                ((start + chunk).min(s), LogitRows::None)
            } else {
                ((start + chunk).min(p), LogitRows::Last)
            };
            let out =
                self.model
                    .forward(&mut self.seq, &self.prompt.ids[start..end], rows, probe)?;
            if rows == LogitRows::Last {
                self.prompt_logits = out.logits;
            }
            self.prefilled = end;
            self.busy_s += started.elapsed().as_secs_f64();
        }
        Ok(PrefillProgress {
            done: self.prefilled,
            total: p,
        })
    }

    /// Run the rest of the prompt chunk by chunk, telling `on_chunk` after
    /// each; stops, with the prompt unfinished, as soon as `on_chunk` returns
    /// false. Returns whether the prompt is done.
    pub fn prefill_with(
        &mut self,
        mut probe: Option<&mut (dyn Probe + '_)>,
        mut on_chunk: impl FnMut(PrefillProgress) -> bool,
    ) -> Result<bool> {
        loop {
            let progress = self.advance_prefill(probe.as_deref_mut())?;
            if !on_chunk(progress) {
                return Ok(false);
            }
            if progress.finished() {
                return Ok(true);
            }
        }
    }

    /// Run the prompt up to its decode start (not the decode-phase prompt
    /// tokens), chunk by chunk, telling `on_chunk` after each; stops as soon
    /// as `on_chunk` returns false. Returns whether the decode start was
    /// reached. The sequence then holds the full-depth prefix that a sweep
    /// forks for every cutoff.
    pub fn prefill_to_decode_start(
        &mut self,
        mut on_chunk: impl FnMut(PrefillProgress) -> bool,
    ) -> Result<bool> {
        let s = self.prompt.decode_start;
        while self.prefilled < s {
            let progress = self.advance_prefill(None)?;
            let at_start = PrefillProgress {
                done: progress.done,
                total: s,
            };
            if !on_chunk(at_start) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Finish the prompt; returns the logits of its last token.
    fn prefill(&mut self, probe: Option<&mut (dyn Probe + '_)>) -> Result<Tensor> {
        self.prefill_with(probe, |_| true)?;
        let started = Instant::now();
        let logits = self
            .prompt_logits
            .take()
            .ok_or(EngineError::MissingLogits {
                position: self.prompt.len() - 1,
            })?
            .squeeze(0)?;
        self.busy_s += started.elapsed().as_secs_f64();
        Ok(logits)
    }

    fn decode_one(&mut self, token: u32, probe: Option<&mut (dyn Probe + '_)>) -> Result<Tensor> {
        let started = Instant::now();
        let out = self
            .model
            .forward(&mut self.seq, &[token], LogitRows::Last, probe)?;
        let logits = out.logits.ok_or(EngineError::MissingLogits {
            position: self.seq.len() - 1,
        })?;
        let logits = logits.squeeze(0)?.to_dtype(DType::F32)?;
        self.busy_s += started.elapsed().as_secs_f64();
        Ok(logits)
    }

    /// K/V token counts by phase for what the caches have processed.
    pub fn kv_cost(&self) -> KvCost {
        let phases = self.seq.phases();
        KvCost {
            anchors: phases.anchor_len(),
            prefill: phases.prefill_len(),
            decode: self.seq.len().saturating_sub(phases.decode_start()),
        }
    }

    /// Run to the end, calling `on_step` for each token; `on_step` returns
    /// false to stop early (cancel).
    pub fn run(mut self, mut on_step: impl FnMut(&Step) -> bool) -> Result<GenerationOutput> {
        while let Some(step) = self.step(None)? {
            if !on_step(&step) {
                self.finish(StopReason::Cancelled);
                break;
            }
        }
        Ok(self.output())
    }

    /// The result so far (timing covers the steps taken).
    pub fn output(&self) -> GenerationOutput {
        let n = self.produced.len();
        let total_s = self.busy_s;
        let ttft_s = self.first_token_at.unwrap_or(0.0);
        let tpot_s = if n > 1 {
            (total_s - ttft_s) / (n - 1) as f64
        } else {
            0.0
        };
        let policy = *self.seq.policy();
        let shape = self.model.kv_shape();
        let cost = self.kv_cost();
        let b = shape.bytes_per_token_layer() as u64;
        let kv_heads = shape.num_kv_heads.max(1);
        let per_head_row = b / kv_heads as u64;
        let vis = self.seq.visibility();
        let counts = vis.accounting();
        let windows = &self.model.config().sliding_window;
        // a model whose layers differ in K/V shape or share K/V (Gemma 4)
        // is counted layer by layer
        let len = vis.phases().decode_start() + cost.decode;
        let layered = self.model.layered_kv_bytes(vis, len);
        let formula = layered.unwrap_or_else(|| {
            per_head_row * counts.held_head_rows_windowed(cost.decode, kv_heads, windows) as u64
        });
        let full_rule = Policy::full(policy.num_layers()).visibility(*vis.phases());
        let kv_bytes_full = match layered {
            Some(_) => self
                .model
                .layered_kv_bytes(full_rule.as_ref(), len)
                .unwrap_or_default(),
            None => cost.bytes(&Policy::full(policy.num_layers()), &shape, windows),
        };
        // a layered model's rows read are those it holds: SlimInfer, the one
        // policy that reads fewer rows than it holds, is refused on them
        let resident = layered.unwrap_or_else(|| {
            per_head_row * counts.resident_head_rows_windowed(cost.decode, kv_heads, windows) as u64
        });
        let slim = vis.dynamic().and_then(|d| d.decision_trace(b));
        GenerationOutput {
            policy: policy.to_string(),
            tokens: self.produced.clone(),
            stop: self.stop.unwrap_or(StopReason::MaxTokens),
            timing: Timing {
                ttft_s,
                tpot_s,
                total_s,
                tokens_per_s: if total_s > 0.0 {
                    n as f64 / total_s
                } else {
                    0.0
                },
            },
            kv_bytes_held: self.seq.kv_bytes_held(),
            kv_bytes_formula: formula,
            kv_bytes_full,
            kv_bytes_resident: resident,
            slim,
        }
    }
}
