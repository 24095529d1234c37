//! The training data of an adapter: the teacher's records (read from a
//! teacher file made with the same settings, else made by the full model)
//! turned into [`TrainSeq`]s under the policy: the frozen layers beneath
//! the trained ones run once per sequence (their output is the same under
//! both masks), and the trained layers see the rows and the visibility of
//! the policy.

use candle_core::Tensor;
use lcut_engine::Session;
use std::collections::BTreeMap;

use lcut_model::{Decoder, LogitRows, Probe, ResidualSite, TrainKv};
use lcut_policy::{Policy, TokenPhases, Visibility, training_matrix};

use super::model::frozen_sources;
use super::options::DataOptions;
use super::progress::Progress;
use super::seq::{BelowCut, TeacherTopK, TrainSeq};
use super::teacher::{self, TeacherRecord, TeacherSettings};
use crate::error::{Result, refuse};

/// Captures the residual stream at some sites, every token's rows in order.
struct Capture {
    rows: BTreeMap<ResidualSite, Vec<Tensor>>,
}

impl Capture {
    fn at(sites: impl IntoIterator<Item = ResidualSite>) -> Self {
        Self {
            rows: sites.into_iter().map(|s| (s, vec![])).collect(),
        }
    }

    /// The rows captured at `site` [tokens, hidden], in f32.
    fn hidden(&self, site: ResidualSite) -> Result<Tensor> {
        Ok(Tensor::cat(&self.rows[&site], 0)?.to_dtype(candle_core::DType::F32)?)
    }
}

impl Probe for Capture {
    fn wants_residual(&self, site: ResidualSite) -> bool {
        self.rows.contains_key(&site)
    }
    fn on_residual(
        &mut self,
        site: ResidualSite,
        _: &[usize],
        hidden: &Tensor,
    ) -> lcut_model::Result<()> {
        if let Some(rows) = self.rows.get_mut(&site) {
            rows.push(hidden.clone());
        }
        Ok(())
    }
}

/// The training sequences of a job and the tokens they hold.
pub struct TrainingData {
    /// The sequences (with `balance_kinds`, rarer kinds repeated).
    pub sequences: Vec<TrainSeq>,
    /// Tokens of the teacher's records (prompts and continuations).
    pub tokens: usize,
}

/// The teacher's records (read from `opts.teacher` when it holds them, else
/// made and, with a teacher file, written there) and the training sequences
/// under `policy` from layer `first` on. `fingerprint` is the base model's
/// (`Decoder::lora_fingerprint`), recorded with the teacher; `kd`: keep the
/// teacher's distributions as targets too.
pub fn training_data(
    session: &Session,
    (policy, first, fingerprint): (&Policy, usize, &str),
    opts: &DataOptions,
    kd: bool,
    progress: &mut dyn Progress,
) -> Result<TrainingData> {
    let records = teacher_records(session, fingerprint, opts, progress)?;
    progress.start("sequences", records.len());
    let (mut data, mut tokens) = (vec![], 0);
    for record in &records {
        tokens += record.prompt_ids.len() + record.continuation.len();
        data.push(sequence(session, (policy, first), record, kd)?);
        progress.set(data.len(), "");
    }
    progress.finish();
    if opts.balance_kinds {
        data = teacher::balanced_by_kind(&records)
            .into_iter()
            .map(|i| data[i].clone())
            .collect();
    }
    Ok(TrainingData {
        sequences: data,
        tokens,
    })
}

/// The teacher's records: read back from the teacher file when it was made
/// with these settings, else made by the full model (and written there).
fn teacher_records(
    session: &Session,
    fingerprint: &str,
    opts: &DataOptions,
    progress: &mut dyn Progress,
) -> Result<Vec<TeacherRecord>> {
    let (exclude, excluded_suite_hash) = match &opts.exclude_suite {
        Some(path) => {
            let (set, hash) = teacher::suite_prompts(path)?;
            (set, Some(hash))
        }
        None => Default::default(),
    };
    let settings = TeacherSettings {
        base_fingerprint: fingerprint.to_string(),
        prompt_seed: opts.prompt_seed,
        prompts: opts.prompts,
        max_prompt_tokens: opts.max_prompt_tokens,
        max_new_tokens: opts.max_new_tokens,
        top_k: opts.kd_top_k,
        excluded_suite_hash,
    };
    if let Some(path) = &opts.teacher
        && let Some(records) = teacher::read(path, &settings)?
    {
        progress.note(&format!("teacher: {} records read", records.len()));
        return Ok(records);
    }
    progress.start("teacher", opts.prompts);
    let mut made = 0;
    let records = teacher::make(session, &settings, &exclude, || {
        made += 1;
        progress.set(made, "");
    })?;
    progress.finish();
    if let Some(path) = &opts.teacher {
        teacher::write(path, &settings, &records)?;
    }
    Ok(records)
}

/// A training sequence: the prompt and its continuation, the rows that
/// exist at the cut under `policy`, the residual stream entering layer
/// `first` from the frozen layers beneath it (every row when `first` is
/// below the cut, else the rows at the cut), and the continuation as
/// targets (tokens and, with `kd`, the teacher's distributions).
fn sequence(
    session: &Session,
    (policy, first): (&Policy, usize),
    record: &TeacherRecord,
    kd: bool,
) -> Result<TrainSeq> {
    let model = &session.model;
    let cut = policy.l_cut();
    let prompt = session.prepare_text(&record.prompt, record.system.as_deref(), true)?;
    if prompt.ids != record.prompt_ids {
        refuse!(
            "teacher record {}: the prompt tokenizes otherwise with this model's tokenizer",
            record.id
        );
    }
    let cont = &record.continuation;
    let ids: Vec<u32> = prompt.ids.iter().chain(cont).copied().collect();
    let anchors = policy.anchor_len(prompt.system_len, prompt.decode_start)?;
    let phases = TokenPhases::new(ids.len(), prompt.decode_start, anchors)?;
    let rule = policy.visibility(phases);
    let FrozenRows {
        hidden,
        layer_inputs,
        source_kv,
    } = frozen_rows(model, &ids, first)?;
    let positions: Vec<usize> = (0..ids.len())
        .filter(|&p| rule.token_exists(cut, p))
        .collect();
    let idx: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
    let (x, below) = match first < cut {
        // positions are never renumbered: row p of the sequence is position p
        true => (
            hidden,
            Some(below_cut(rule.as_ref(), first, ids.len(), idx)),
        ),
        false => (
            hidden.index_select(&Tensor::new(idx.as_slice(), hidden.device())?, 0)?,
            None,
        ),
    };
    // the layers from the cut on read as the cut does (each layer's own
    // sliding window is applied by the model's training pass)
    let visible = training_matrix(rule.as_ref(), cut, None, &positions);
    let (loss_rows, targets, steps) = continuation_targets(&positions, &ids, prompt.ids.len());
    let teacher = match kd {
        true => Some(teacher_rows(record, &steps)?),
        false => None,
    };
    Ok(TrainSeq {
        x,
        below,
        positions,
        visible,
        loss_rows,
        targets,
        teacher,
        layer_inputs,
        source_kv,
    })
}

/// What the frozen layers beneath the trained ones give a sequence: every
/// token's residual stream entering the first trained layer, its per-layer
/// inputs (Gemma 4) and the keys and values of the frozen layers whose K/V
/// a trained layer reads ([`TrainSeq`] takes these).
pub struct FrozenRows {
    /// The residual stream entering layer `first` [tokens, hidden], f32.
    pub hidden: Tensor,
    /// The per-layer inputs [tokens, layers * width], where the model has them.
    pub layer_inputs: Option<Tensor>,
    /// Keys and values [kv_heads, tokens, head_dim] by frozen source layer.
    pub source_kv: TrainKv,
}

/// [`FrozenRows`] of the tokens `ids` for training layers `first..` of
/// `model` (dense f32, as training loads it): one full-depth pass that
/// records the residual stream entering `first` and each frozen source
/// layer (and the embeddings, for the per-layer inputs), then each source
/// layer's keys and values from the state entering it.
pub fn frozen_rows(model: &Decoder, ids: &[u32], first: usize) -> Result<FrozenRows> {
    let sources = frozen_sources(model, first);
    let per_layer = model.config().per_layer_input.is_some();
    let sites = std::iter::once(ResidualSite::entering(first))
        .chain(per_layer.then_some(ResidualSite::Embeddings))
        .chain(sources.iter().map(|&l| ResidualSite::entering(l)));
    let mut probe = Capture::at(sites);
    let mut seq = model.new_full_sequence();
    model.forward(&mut seq, ids, LogitRows::None, Some(&mut probe))?;
    let layer_inputs = match per_layer {
        true => model.train_layer_inputs(ids, &probe.hidden(ResidualSite::Embeddings)?)?,
        false => None,
    };
    let every: Vec<usize> = (0..ids.len()).collect();
    let mut source_kv = TrainKv::new();
    for l in sources {
        let entering = probe.hidden(ResidualSite::entering(l))?;
        let kv = model.train_kv(l, entering, &every)?;
        source_kv.insert(l, kv);
    }
    Ok(FrozenRows {
        hidden: probe.hidden(ResidualSite::entering(first))?,
        layer_inputs,
        source_kv,
    })
}

/// The rows (indices into `positions`) whose next token is a continuation
/// token of `ids` (which starts at `first_target`), that token, and its
/// index in the continuation.
fn continuation_targets(
    positions: &[usize],
    ids: &[u32],
    first_target: usize,
) -> (Vec<u32>, Vec<u32>, Vec<usize>) {
    let (mut loss_rows, mut targets, mut steps) = (vec![], vec![], vec![]);
    for (row, &p) in positions.iter().enumerate() {
        if p + 1 >= first_target && p + 1 < ids.len() {
            loss_rows.push(row as u32);
            targets.push(ids[p + 1]);
            steps.push(p + 1 - first_target);
        }
    }
    (loss_rows, targets, steps)
}

/// Every row of an `n`-token sequence in the layers from `first` to the
/// cut, reading what `rule` shows there, with `kept` the rows that go on.
fn below_cut(rule: &dyn Visibility, first: usize, n: usize, kept: Vec<u32>) -> BelowCut {
    let positions: Vec<usize> = (0..n).collect();
    BelowCut {
        visible: training_matrix(rule, first, None, &positions),
        positions,
        kept,
    }
}

/// The teacher's top-k distributions before continuation tokens `steps`.
fn teacher_rows(record: &TeacherRecord, steps: &[usize]) -> Result<TeacherTopK> {
    let k = record.top_ids.first().map_or(0, Vec::len);
    let (mut ids, mut probs) = (vec![], vec![]);
    for &s in steps {
        match (record.top_ids.get(s), record.top_probs.get(s)) {
            (Some(i), Some(p)) if i.len() == k && p.len() == k => {
                ids.extend_from_slice(i);
                probs.extend_from_slice(p);
            }
            _ => refuse!(
                "teacher record {}: no top-{k} distribution before continuation token {s}",
                record.id
            ),
        }
    }
    let dev = candle_core::Device::Cpu;
    Ok(TeacherTopK {
        ids: Tensor::from_vec(ids, (steps.len(), k), &dev)?,
        probs: Tensor::from_vec(probs, (steps.len(), k), &dev)?,
    })
}
