//! Options shared by several subcommands: the model and how it loads
//! ([`ModelArgs`]: `--model`, `--dtype`, `--kv-dtype`, `--device`), lengths,
//! progress bars, the memory check and atomic writes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use indicatif::{ProgressBar, ProgressStyle};
use lcut_engine::suite::ItemMemory;
use lcut_model::{ResolvedModel, StoreRoots, WeightMode};

use crate::args::{DeviceArg, KvDtypeArg, WeightArg};

/// `--model`, `--dtype`, `--kv-dtype` and `--device`: the model a command
/// loads and how; flattened into every command that loads one.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct ModelArgs {
    /// Model: a Hugging Face folder, a .gguf file, a Hugging Face cache name
    /// `ORG/NAME[@REV][:FILE]` or an Ollama name `NAME[:TAG]` (`lcut models`
    /// lists them); without it the bundled model (`bench`: a random-weight
    /// Llama of the shape its options give).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// dtype: f32, bf16, f16, or q (a GGUF's weights kept quantized).
    #[arg(long, default_value = "f32", ignore_case = true)]
    pub dtype: WeightArg,
    /// K/V cache storage: auto (f16 for `--dtype q`, else the weights'
    /// dtype), f32, f16 or bf16.
    #[arg(long, value_enum, default_value = "auto", ignore_case = true)]
    pub kv_dtype: KvDtypeArg,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: DeviceArg,
}

impl ModelArgs {
    /// `model` on the CPU in `dtype`, the cache as `kv_dtype` says.
    pub fn cpu(model: Option<PathBuf>, dtype: WeightArg, kv_dtype: KvDtypeArg) -> Self {
        Self {
            model,
            dtype,
            kv_dtype,
            device: DeviceArg::Cpu,
        }
    }

    /// The model opened, not loaded ([`PendingModel`]).
    pub fn open(&self) -> Result<PendingModel> {
        PendingModel::open(self)
    }

    /// The model loaded with its tokenizer, its K/V cache stored as asked.
    pub fn load(&self) -> Result<lcut_engine::Session> {
        self.open()?.load()
    }

    /// The K/V cache's dtype for these weights.
    pub fn kv_dtype(&self) -> DType {
        self.kv_dtype.dtype(self.dtype.mode())
    }
}

/// The model reference given, or the bundled model's folder.
pub fn model_or_bundled(model: &Option<PathBuf>) -> PathBuf {
    model
        .clone()
        .unwrap_or_else(|| lcut_engine::bundled(lcut_engine::BUNDLED_MODEL))
}

/// Resolve a `--model` reference, offline: a folder or file path, a Hugging
/// Face hub cache name (`ORG/NAME[@REV][:FILE]`) or an Ollama name
/// (`NAME[:TAG]`), in the stores the environment names.
pub fn resolve_model(reference: &Path) -> Result<ResolvedModel> {
    lcut_model::store::resolve(reference, &StoreRoots::from_env())
        .with_context(|| format!("loading model {}", reference.display()))
}

/// Parse `1,5,9` into token ids.
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            t.trim()
                .parse::<u32>()
                .with_context(|| format!("token id {t:?} in --ids is not a non-negative integer"))
        })
        .collect()
}

/// A progress bar counting `len` things called `unit` (`prompts`,
/// `items`, `runs`), with a message after the count.
pub fn count_bar(len: usize, unit: &str) -> ProgressBar {
    ProgressBar::new(len as u64).with_style(
        ProgressStyle::with_template(&format!("{{bar:30}} {{pos}}/{{len}} {unit} {{msg}}"))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// Parse a length such as `256`, `1k`, `4K`, `128k`.
pub fn parse_len(s: &str) -> Result<usize> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = match t.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => (t.as_str(), 1),
    };
    let n: usize = num
        .parse()
        .with_context(|| format!("length {s:?} is not a count like 256, 1k or 128k"))?;
    Ok(n * mul)
}

/// A run to size against free memory: `total_len` tokens (the full
/// model's K/V for all of them in `kv_dtype`), activations in `dtype`,
/// prefill in chunks of `chunk`, attention blocks of `block` scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSize {
    /// Activations' dtype.
    pub dtype: DType,
    /// The K/V cache's dtype.
    pub kv_dtype: DType,
    /// Prompt and new tokens.
    pub total_len: usize,
    /// Prompt tokens per prefill chunk.
    pub chunk: usize,
    /// Attention scores computed at once.
    pub block: usize,
    /// The weights are already resident (a loaded model) and so are not
    /// counted again.
    pub weights_loaded: bool,
}

/// Refuse a run of `size` whose estimated peak memory is more than
/// `device` has free.
pub fn ensure_fits(cfg: &lcut_model::ModelConfig, device: &Device, size: &RunSize) -> Result<()> {
    let RunSize {
        dtype,
        kv_dtype,
        total_len,
        chunk,
        block,
        weights_loaded,
    } = *size;
    let kv = lcut_model::memory::kv_cache_bytes(cfg, kv_dtype, total_len);
    let mut need = lcut_model::memory::estimate(cfg, dtype, kv, total_len, chunk, block)
        .for_fused_attention(device, cfg, dtype, (total_len, chunk));
    if weights_loaded {
        need = need.without_weights();
    }
    let remedies = crate::memory_check::Remedies {
        chunk_option: true,
        f32_run: dtype == DType::F32,
        forcible: false,
    };
    crate::memory_check::refuse_if_short(
        &format!("{total_len} tokens"),
        &need,
        (crate::memory_check::available(device)?, device),
        &remedies,
    )
}

/// Say what the item of a suite run that holds the most holds beside the
/// weights, what the run plans for and whether the item's policies run in
/// groups; returns the memory the run goes by (the planned share of
/// `LCUT_AVAILABLE_MEMORY` or of what the device has free; `None` when
/// neither says).
pub fn suite_memory_line(
    session: &lcut_engine::Session,
    items: &[lcut_engine::suite::SuiteItem],
    opts: &lcut_engine::suite::SuiteEvalOptions,
) -> Result<Option<u64>> {
    memory_line(session, |_| {
        lcut_engine::suite::largest_item_memory(session, items, opts)
    })
}

/// [`suite_memory_line`] for a cutoff sweep over a suite (`opts`' own
/// budget is replaced by the one returned).
pub fn cutoff_memory_line(
    session: &lcut_engine::Session,
    items: &[lcut_engine::suite::SuiteItem],
    opts: &lcut_engine::suite::CutoffEvalOptions,
) -> Result<Option<u64>> {
    memory_line(session, |budget| {
        let opts = lcut_engine::suite::CutoffEvalOptions {
            memory_budget: budget,
            ..opts.clone()
        };
        lcut_engine::suite::cutoff_memory(session, items, &opts)
    })
}

/// Print the line of the item `largest` finds for the planned budget, and
/// return the budget.
fn memory_line(
    session: &lcut_engine::Session,
    largest: impl FnOnce(Option<u64>) -> lcut_engine::Result<Option<ItemMemory>>,
) -> Result<Option<u64>> {
    let budget = planned_budget(session)?;
    if let Some(m) = largest(budget)? {
        eprintln!("{}", m.line("the largest item", budget));
    }
    Ok(budget)
}

/// The planned share of `LCUT_AVAILABLE_MEMORY` or of what the session's
/// device has free (`None` when neither says): the memory a suite run's
/// items plan their groups for.
pub fn planned_budget(session: &lcut_engine::Session) -> Result<Option<u64>> {
    let free = crate::memory_check::available(session.model.device())?;
    Ok(free.map(lcut_engine::suite::planned_share))
}

/// Say what the process held at its peak (on hosts that report it), after
/// a run that printed [`suite_memory_line`].
pub fn suite_memory_peak() {
    if let Some((_, peak)) = lcut_model::memory::resident_bytes() {
        eprintln!(
            "memory: peak resident {}",
            lcut_model::memory::format_bytes(peak)
        );
    }
}

/// A model opened but not loaded: its config, the bytes its weights will
/// take and its tokenizer are known, so a run can be sized (and refused)
/// before the weights are read.
pub struct PendingModel {
    /// The model as resolved.
    pub resolved: ResolvedModel,
    /// Its files, opened (memory-mapped, nothing read but headers).
    pub files: lcut_model::ModelFiles,
    /// How the weights will be loaded.
    pub mode: WeightMode,
    /// How the K/V cache will be stored.
    pub kv_dtype: DType,
    /// Where.
    pub device: Device,
}

impl PendingModel {
    /// Open the model `args` give (a path or a store name, or the bundled one).
    pub fn open(args: &ModelArgs) -> Result<Self> {
        let resolved = resolve_model(&model_or_bundled(&args.model))?;
        let files = lcut_model::ModelFiles::open_format(&resolved.path, resolved.format)
            .with_context(|| format!("loading model {resolved}"))?;
        Ok(Self {
            resolved,
            files,
            mode: args.dtype.mode(),
            kv_dtype: args.kv_dtype(),
            device: args.device.open()?,
        })
    }

    /// The model's config.
    pub fn config(&self) -> &lcut_model::ModelConfig {
        self.files.config()
    }

    /// The dtype of the run's activations (and K/V).
    pub fn dtype(&self) -> DType {
        self.mode.activation_dtype()
    }

    /// Bytes the weights will take once loaded.
    pub fn weight_bytes(&self) -> u64 {
        lcut_model::memory::loaded_weight_bytes(&self.files, self.mode)
    }

    /// The model's tokenizer, chat template and BoS id, without its weights.
    pub fn prompter(&self) -> Result<lcut_engine::PromptTokenizer> {
        let r = &self.resolved;
        lcut_engine::PromptTokenizer::load_format(&r.path, r.format)
            .with_context(|| format!("loading the tokenizer of {r}"))
    }

    /// Load the weights and tokenizer, the K/V cache stored as asked.
    pub fn load(self) -> Result<lcut_engine::Session> {
        let name = self.resolved.to_string();
        let mut session = lcut_engine::Session::load_resolved_files(
            &self.resolved,
            self.files,
            self.mode,
            &self.device,
        )
        .with_context(|| format!("loading model {name}"))?;
        session.model.set_kv_dtype(self.kv_dtype)?;
        Ok(session)
    }
}

/// Write `bytes` to `path` atomically (temporary file, then rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    lcut_trace::write_file_atomic(path, bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// The line that names the policies among `policies` that run their own
/// prompt in a run that shares one prompt run per item (`lcut eval`'s
/// suite and grid), and why, as the first of `items` shows; `None` where
/// every one branches from it (or there are no items).
pub fn shared_run_note(
    session: &lcut_engine::Session,
    items: &[lcut_engine::suite::SuiteItem],
    policies: &[lcut_policy::Policy],
) -> Result<Option<String>> {
    let Some(first) = items.first() else {
        return Ok(None);
    };
    let prompt = first.prepare(session)?;
    let routes = lcut_engine::routes(&session.model, &prompt, policies)?;
    let apart: Vec<String> = policies
        .iter()
        .zip(routes)
        .filter_map(|(p, r)| match r {
            lcut_engine::Route::Alone(why) => Some(format!("{p} ({why})")),
            _ => None,
        })
        .collect();
    Ok((!apart.is_empty()).then(|| {
        format!(
            "run apart, each on its own prompt run per item (the others share one): {}",
            apart.join("; ")
        )
    }))
}

/// The line that says which layers the presses among `policies` compress on
/// `model` where some of its layers slide: those it leaves as the model
/// holds them (kvpress's rule for Gemma 3); `None` where no press runs or
/// no layer slides.
pub fn press_layers_note<'a>(
    model: &lcut_model::Decoder,
    policies: impl IntoIterator<Item = &'a lcut_policy::Policy>,
) -> Option<String> {
    let pressed: Vec<&lcut_policy::Policy> = policies
        .into_iter()
        .filter(|p| p.press().is_some())
        .collect();
    // a grid of presses at several ratios is named by its presses, once each
    let mut presses: Vec<String> = Vec::new();
    for p in &pressed {
        let name = match (pressed.len() > 2, p.press()) {
            (true, Some(params)) => params.name.to_string(),
            _ => p.to_string(),
        };
        if !presses.contains(&name) {
            presses.push(name);
        }
    }
    let left = model.layers_left_whole_at_prompt_end();
    if presses.is_empty() || left.is_empty() {
        return None;
    }
    let layers = model.config().num_layers;
    let compressed: Vec<String> = (0..layers)
        .filter(|l| !left.contains(l))
        .map(|l| l.to_string())
        .collect();
    Some(format!(
        "{}: compress the {} of {layers} layers without a sliding window ({}) and leave the {} \
         sliding-window layers as the model holds them, as kvpress's presses do on Gemma 3",
        presses.join(", "),
        compressed.len(),
        compressed.join(", "),
        left.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_ids_parse() {
        assert_eq!(parse_len("1k").unwrap(), 1024);
        assert_eq!(parse_len("256").unwrap(), 256);
        assert!(parse_len("x").is_err());
        assert_eq!(parse_ids("1, 5,9").unwrap(), vec![1, 5, 9]);
        assert!(parse_ids("1,-2").is_err());
    }

    #[test]
    fn a_missing_model_is_named() {
        let missing = Some(PathBuf::from("no-such-model"));
        let args = ModelArgs::cpu(
            missing,
            WeightArg::Dense(crate::args::DtypeArg::F32),
            KvDtypeArg::Auto,
        );
        let Err(e) = args.load() else {
            panic!("a missing model loaded");
        };
        assert!(
            format!("{e:#}").contains("loading model no-such-model"),
            "{e:#}"
        );
    }
}
