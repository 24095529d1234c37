//! `lcut train-lora`: a SPEED-aware LoRA adapter by self-distillation. The
//! full model greedily continues prompts from lcut's own task generators
//! (its distributions kept too, for the logit-distillation term);
//! the frozen layers beneath the trained ones run once per sequence (their
//! output is the same under both masks); the trained layers learn, with the
//! SPEED mask, to give the full model's tokens. Writes the adapter (PEFT layout, with
//! `lcut_policy`), a resumable checkpoint and `training.json`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::Tensor;
use indicatif::{ProgressBar, ProgressStyle};
use lcut_engine::Session;
use lcut_model::lora::{LoraConfig, Targets, write_adapter};
use lcut_model::{LogitRows, Probe, ResidualSite};
use lcut_policy::{Policy, PolicySpec, TokenPhases, Visibility};
use lcut_train::lora_train::{
    BelowCut, LoraTrainOptions, TeacherTopK, TrainSeq, UpperModel, train_lora,
};

use crate::args::{DeviceArg, DtypeArg, KvDtypeArg, WeightArg};
use crate::lora_teacher::{self, TeacherRecord, TeacherSettings};
use serde_json::json;

/// Arguments of `lcut train-lora`.
#[derive(Debug, clap::Args)]
pub struct TrainLoraArgs {
    /// Base model (Hugging Face folder or .gguf file), loaded dense in f32.
    #[arg(long)]
    model: PathBuf,
    /// The SPEED policy to train for (e.g. speed:22+bos).
    #[arg(long)]
    policy: PolicySpec,
    /// LoRA rank.
    #[arg(long, default_value_t = 8)]
    lora: usize,
    /// LoRA alpha (scale alpha / rank).
    #[arg(long, default_value_t = 16.0)]
    alpha: f64,
    /// Layers to adapt, A..B (end exclusive); the cut to the top by default.
    /// A below the cut trains those layers too, on every token of a
    /// sequence (slower: the whole sequence runs there, not only the rows
    /// that exist above the cut).
    #[arg(long)]
    layers: Option<String>,
    /// Projections to adapt, comma-separated (q,k,v,o,gate,up,down).
    #[arg(long, default_value = "q,k,v,o")]
    modules: String,
    /// Training prompts drawn from lcut's task generators.
    #[arg(long, default_value_t = 140)]
    prompts: usize,
    /// First seed of the task generators (one suite of prompts a seed, the
    /// next seeds used when more are needed; the committed evaluation suite
    /// uses 13).
    #[arg(long, default_value_t = 101)]
    prompt_seed: u64,
    /// Skip prompts longer than this many tokens.
    #[arg(long, default_value_t = 1100)]
    max_prompt_tokens: usize,
    /// Tokens the full model continues each prompt with (the targets).
    #[arg(long, default_value_t = 24)]
    max_new_tokens: usize,
    /// Weight of the logit-distillation term: KL from the full model's
    /// next-token distribution (its top --kd-top-k tokens) to the adapted
    /// model's, added to the cross-entropy on its tokens (0: tokens only).
    #[arg(long, default_value_t = 1.0)]
    kd_weight: f64,
    /// Tokens kept of each of the full model's distributions.
    #[arg(long, default_value_t = 32)]
    kd_top_k: usize,
    /// The full model's continuations and distributions as JSON Lines: read
    /// when the file exists (made with the same settings), else made and
    /// written there, so runs for other cuts share them.
    #[arg(long)]
    teacher: Option<PathBuf>,
    /// Draw every kind of prompt as often as the most frequent one (the
    /// sequences of rarer kinds repeated) instead of as the generators
    /// happened to give them.
    #[arg(long)]
    balance_kinds: bool,
    /// Leave out every prompt of this suite (e.g. the evaluation suite), so
    /// that an evaluation on it is on held-out prompts.
    #[arg(long)]
    exclude_suite: Option<PathBuf>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Learning rate at the start (decays linearly to --lr-end).
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Learning rate at the end.
    #[arg(long, default_value_t = 2e-4)]
    lr_end: f64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    /// Gradient clipping (global norm).
    #[arg(long, default_value_t = 1.0)]
    clip: f64,
    /// Seed of the adapter's initialisation and of the batch draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Steps between checkpoints (a rerun with the same --out resumes).
    #[arg(long, default_value_t = 50)]
    checkpoint_every: usize,
    /// Output folder: the adapter, checkpoint/ and training.json.
    #[arg(long)]
    out: PathBuf,
}

/// Captures the residual stream after one layer.
struct Capture {
    site: ResidualSite,
    rows: Vec<Tensor>,
}

impl Probe for Capture {
    fn wants_residual(&self, site: ResidualSite) -> bool {
        site == self.site
    }
    fn on_residual(
        &mut self,
        _: ResidualSite,
        _: &[usize],
        hidden: &Tensor,
    ) -> lcut_model::Result<()> {
        self.rows.push(hidden.clone());
        Ok(())
    }
}

/// `A..B` into layer indices below `layers`; the cut to the top by default.
fn parse_layers(text: Option<&str>, cut: usize, layers: usize) -> Result<Vec<usize>> {
    let Some(text) = text else {
        return Ok((cut..layers).collect());
    };
    let (a, b) = text
        .split_once("..")
        .with_context(|| format!("--layers {text:?}: expected A..B"))?;
    let number = |t: &str| {
        t.trim()
            .parse::<usize>()
            .with_context(|| format!("--layers {text:?}: {t:?} is not a layer number"))
    };
    let (a, b) = (number(a)?, number(b)?);
    if b > layers || a >= b {
        bail!("--layers {text}: expected a range within 0..{layers} (end exclusive)");
    }
    Ok((a..b).collect())
}

fn parse_modules(text: &str) -> Result<Vec<String>> {
    text.split(',')
        .map(|m| {
            let m = m.trim();
            let full = if m.ends_with("_proj") {
                m.to_string()
            } else {
                format!("{m}_proj")
            };
            match lcut_train::lora_train::MODULES
                .iter()
                .any(|x| x.ends_with(&full))
            {
                true => Ok(full),
                false => bail!("--modules: unknown projection {m:?} (q, k, v, o, gate, up, down)"),
            }
        })
        .collect()
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
        bail!(
            "teacher record {}: the prompt tokenizes otherwise with this model's tokenizer",
            record.id
        );
    }
    let cont = &record.continuation;
    let ids: Vec<u32> = prompt.ids.iter().chain(cont).copied().collect();
    let anchors = policy.anchor_len(prompt.system_len, prompt.decode_start)?;
    let phases = TokenPhases::new(ids.len(), prompt.decode_start, anchors)?;
    let rule = policy.visibility(phases);
    let mut probe = Capture {
        site: match first {
            0 => ResidualSite::Embeddings,
            l => ResidualSite::Layer(l - 1),
        },
        rows: vec![],
    };
    let mut seq = model.new_full_sequence();
    model.forward(&mut seq, &ids, LogitRows::None, Some(&mut probe))?;
    let hidden = Tensor::cat(&probe.rows, 0)?.to_dtype(candle_core::DType::F32)?;
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
    let visible = positions
        .iter()
        .flat_map(|&q| positions.iter().map(move |&k| (q, k)))
        .map(|(q, k)| k <= q && rule.key_visible(cut, q, k))
        .collect();
    let first_target = prompt.ids.len();
    let (mut loss_rows, mut targets, mut steps) = (vec![], vec![], vec![]);
    for (row, &p) in positions.iter().enumerate() {
        if p + 1 >= first_target && p + 1 < ids.len() {
            loss_rows.push(row as u32);
            targets.push(ids[p + 1]);
            steps.push(p + 1 - first_target);
        }
    }
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
    })
}

/// Every row of an `n`-token sequence in the layers from `first` to the
/// cut, reading what `rule` shows there, with `kept` the rows that go on.
fn below_cut(rule: &dyn Visibility, first: usize, n: usize, kept: Vec<u32>) -> BelowCut {
    let visible = (0..n)
        .flat_map(|q| (0..n).map(move |k| (q, k)))
        .map(|(q, k)| k <= q && rule.key_visible(first, q, k))
        .collect();
    BelowCut {
        positions: (0..n).collect(),
        visible,
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
            _ => bail!(
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

/// Progress of one phase: a bar on a terminal; elsewhere (a batch job's
/// log) a line at every twentieth of the work, so a log shows it too.
struct Progress {
    bar: ProgressBar,
    what: &'static str,
    len: usize,
    lines: bool,
    started: Instant,
}

impl Progress {
    fn new(len: usize, what: &'static str) -> Self {
        let bar = ProgressBar::new(len as u64);
        let style = format!("{what} {{bar:30}} {{pos}}/{{len}} {{msg}} [{{elapsed}} < {{eta}}]");
        if let Ok(s) = ProgressStyle::with_template(&style) {
            bar.set_style(s);
        }
        Self {
            bar,
            what,
            len,
            lines: !std::io::stderr().is_terminal(),
            started: Instant::now(),
        }
    }

    /// `done` of the work is done; `msg` says how it goes.
    fn set(&self, done: usize, msg: &str) {
        self.bar.set_position(done as u64);
        self.bar.set_message(msg.to_string());
        let every = (self.len / 20).max(1);
        if self.lines && (done.is_multiple_of(every) || done == self.len) {
            let secs = self.started.elapsed().as_secs_f64();
            eprintln!("{} {done}/{} {msg} ({secs:.0} s)", self.what, self.len);
        }
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// The teacher's records (read from `--teacher` when it holds them, else
/// made and, with `--teacher`, written there) and the training sequences
/// under `policy`; returns the sequences and their tokens. `fingerprint` is
/// the base model's (`Decoder::lora_fingerprint`), recorded with the teacher.
fn training_data(
    session: &Session,
    (policy, first, fingerprint): (&Policy, usize, &str),
    args: &TrainLoraArgs,
) -> Result<(Vec<TrainSeq>, usize)> {
    let (exclude, excluded_suite_hash) = match &args.exclude_suite {
        Some(path) => {
            let (set, hash) = lora_teacher::suite_prompts(path)?;
            (set, Some(hash))
        }
        None => Default::default(),
    };
    let settings = TeacherSettings {
        base_fingerprint: fingerprint.to_string(),
        prompt_seed: args.prompt_seed,
        prompts: args.prompts,
        max_prompt_tokens: args.max_prompt_tokens,
        max_new_tokens: args.max_new_tokens,
        top_k: args.kd_top_k,
        excluded_suite_hash,
    };
    let cached = match &args.teacher {
        Some(path) => lora_teacher::read(path, &settings)?,
        None => None,
    };
    let records = match cached {
        Some(records) => {
            eprintln!("teacher: {} records read", records.len());
            records
        }
        None => {
            let pb = Progress::new(args.prompts, "teacher");
            let mut made = 0;
            let records = lora_teacher::make(session, &settings, &exclude, || {
                made += 1;
                pb.set(made, "");
            })?;
            pb.finish();
            if let Some(path) = &args.teacher {
                lora_teacher::write(path, &settings, &records)?;
            }
            records
        }
    };
    let pb = Progress::new(records.len(), "sequences");
    let (mut data, mut tokens) = (vec![], 0);
    for record in &records {
        tokens += record.prompt_ids.len() + record.continuation.len();
        data.push(sequence(
            session,
            (policy, first),
            record,
            args.kd_weight > 0.0,
        )?);
        pb.set(data.len(), "");
    }
    pb.finish();
    if args.balance_kinds {
        data = lora_teacher::balanced_by_kind(&records)
            .into_iter()
            .map(|i| data[i].clone())
            .collect();
    }
    Ok((data, tokens))
}

/// Run `lcut train-lora`.
pub fn run(args: &TrainLoraArgs) -> Result<()> {
    let started = Instant::now();
    let session = crate::common::open_session(
        &Some(args.model.clone()),
        WeightArg::Dense(DtypeArg::F32),
        KvDtypeArg::Auto,
        DeviceArg::Cpu,
    )?;
    let layers = session.model.config().num_layers;
    let spec = args.policy;
    let policy = spec.resolve(layers)?;
    if policy.is_full_depth() || policy.l_cut() == 0 || !policy.trainable() {
        bail!(
            "--policy {}: LoRA training here is for a SPEED policy with a cut in 1..{layers}",
            args.policy
        );
    }
    let adapt = parse_layers(args.layers.as_deref(), policy.l_cut(), layers)?;
    let modules = parse_modules(&args.modules)?;
    let first = adapt[0].min(policy.l_cut());
    let upper = load_trained_span(&args.model, first, policy.l_cut())?;
    let fingerprint = session.model.lora_fingerprint()?;
    let (data, tokens) = training_data(&session, (&policy, first, &fingerprint), args)?;
    let prep_s = started.elapsed().as_secs_f64();
    eprintln!(
        "{} sequences ({tokens} tokens) ready in {prep_s:.0} s",
        data.len()
    );
    let short: Vec<&str> = modules.iter().map(|m| m.as_str()).collect();
    let lora = upper.init_lora(&adapt, &short, args.lora, args.alpha, args.seed)?;
    let mut config = LoraConfig::new(args.lora, args.alpha, &[]);
    config.targets = Targets::Modules(
        modules
            .iter()
            .map(|m| m.rsplit('.').next().unwrap_or(m).to_string())
            .collect(),
    );
    config.layers = Some(adapt.clone());
    config.policy = Some(spec.to_string());
    config.base_model = args
        .model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    config.base_fingerprint = Some(fingerprint);
    let opts = LoraTrainOptions {
        steps: args.steps,
        batch: args.batch,
        lr: args.lr,
        lr_end: args.lr_end,
        weight_decay: args.weight_decay,
        clip: args.clip,
        seed: args.seed,
        checkpoint_every: args.checkpoint_every,
        kd_weight: args.kd_weight,
    };
    let ckpt = args.out.join("checkpoint");
    let pb = Progress::new(args.steps, "steps");
    let state = train_lora(
        &upper,
        &lora,
        &data,
        &opts,
        (&ckpt, &config),
        |step, loss| {
            pb.set(step, &format!("loss {loss:.3}"));
        },
    )?;
    pb.finish();
    write_adapter(&args.out, &config, &lora.pairs())?;
    let record = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "seed": args.seed,
        "prompt_seed": args.prompt_seed,
        "kd_top_k": args.kd_top_k,
        "balance_kinds": args.balance_kinds,
        "exclude_suite": args.exclude_suite.as_ref().map(|p| p.display().to_string()),
        "policy": spec.to_string(),
        "layers": adapt,
        "modules": modules,
        "rank": args.lora,
        "alpha": args.alpha,
        "options": opts,
        "sequences": data.len(),
        "tokens": tokens,
        "data_seconds": prep_s,
        "train_seconds": state.train_seconds,
        "wall_seconds_this_run": started.elapsed().as_secs_f64(),
        "loss": state.losses,
    });
    let path = args.out.join("training.json");
    lcut_model::lora::write_atomic(&path, serde_json::to_string_pretty(&record)?.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    let last =
        state.losses.iter().rev().take(50).sum::<f64>() / state.losses.len().clamp(1, 50) as f64;
    println!(
        "wrote adapter {} ({} steps, last-50 mean loss {last:.4}, training {:.0} s)",
        args.out.display(),
        state.step,
        state.train_seconds
    );
    Ok(())
}

/// The model's layers from `first` up for a policy cutting at `cut`, dense f32.
fn load_trained_span(path: &Path, first: usize, cut: usize) -> Result<UpperModel> {
    use lcut_model::gguf::{GgufFile, GgufWeights, is_gguf_path};
    if is_gguf_path(path) {
        let file = GgufFile::open(path)?;
        let cfg = file.config().clone();
        return Ok(UpperModel::load_span(
            &cfg,
            &GgufWeights::new(file),
            first,
            cut,
        )?);
    }
    let cfg = lcut_model::ModelConfig::from_folder(path)?;
    Ok(UpperModel::load_span(
        &cfg,
        &lcut_model::WeightFiles::open(path)?,
        first,
        cut,
    )?)
}

#[cfg(test)]
mod tests {
    use super::parse_layers;

    #[test]
    fn layers_default_to_the_cut_up_and_may_start_below_it() -> anyhow::Result<()> {
        assert_eq!(parse_layers(None, 22, 30)?, (22..30).collect::<Vec<_>>());
        assert_eq!(
            parse_layers(Some("18..30"), 22, 30)?,
            (18..30).collect::<Vec<_>>()
        );
        assert_eq!(parse_layers(Some("0..30"), 15, 30)?.len(), 30);
        Ok(())
    }

    #[test]
    fn bad_layer_ranges_are_named() {
        for (text, says) in [
            ("20..31", "within 0..30"),
            ("25..25", "within 0..30"),
            ("26..24", "within 0..30"),
            ("a..30", "\"a\" is not a layer number"),
            ("22-30", "expected A..B"),
        ] {
            let err = match parse_layers(Some(text), 22, 30) {
                Ok(v) => panic!("--layers {text} gave {v:?}"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(says), "--layers {text}: {err}");
        }
    }
}
