//! Everything a `lcut paper` run needs before its first part, checked
//! before any work: the model and its adapters, the suite, the settings
//! (a `--max-len` past the model's context, a cut out of range, a shard
//! without `--cut` and an adapter without its policy are named errors),
//! and the description of the run its folder must match.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use lcut_engine::Session;
use lcut_engine::suite::{SuiteItem, read_suite_hashed};
use lcut_model::lora::LoraMode;
use lcut_policy::{CutSpec, PolicySpec};
use lcut_trace::{AdapterIdentity, SuiteSource};

use super::args::{PaperArgs, Settings};
use super::plan::{Sizes, check_policies, compared_policies, speed_bos};
use super::store::Manifest;
use crate::common::{RunSize, ensure_fits, model_or_bundled, parse_len};

/// The suite the bundled model runs with by default, relative to the
/// repository root.
pub const BUNDLED_SUITE: &str = "fixtures/suites/copy.jsonl";

/// A model with one adapter put in, and the policy it was trained for.
pub struct Adapted {
    /// The adapted model.
    pub session: Session,
    /// The adapter.
    pub identity: AdapterIdentity,
    /// Its trained-for policy.
    pub policy: PolicySpec,
}

/// A run ready to start.
pub struct Setup {
    /// The model without adapters.
    pub session: Session,
    /// One adapted model per `--lora`.
    pub adapters: Vec<Adapted>,
    /// The suite's items.
    pub items: Vec<SuiteItem>,
    /// The shard `(i, n)`, when one.
    pub shard: Option<(usize, usize)>,
    /// The settings.
    pub settings: Settings,
    /// What the folder must match (the suite with the shard among it).
    pub manifest: Manifest,
    /// The memory an item's policies plan their groups for (not a
    /// setting: a run resumed on another machine plans for its own).
    pub memory_budget: Option<u64>,
}

/// The sizes of the preset with the user's overrides.
fn sizes(args: &PaperArgs) -> Sizes {
    let p = Sizes::preset(args.quick);
    Sizes {
        items_per_kind: args.items_per_kind.unwrap_or(p.items_per_kind),
        diag_new_tokens: args.diag_new_tokens.unwrap_or(p.diag_new_tokens),
        answer_tokens: args.max_new_tokens.unwrap_or(p.answer_tokens),
        loop_tokens: args.loop_tokens.unwrap_or(p.loop_tokens),
        timing_new_tokens: args.new_tokens.unwrap_or(p.timing_new_tokens),
        repeats: args.repeats.unwrap_or(p.repeats).max(1),
        max_prompt_bins: p.max_prompt_bins,
    }
}

/// `--max-len`, at most the model's context (`quick`: at most 1k by default).
fn max_len(args: &PaperArgs, context: usize) -> Result<usize> {
    match &args.max_len {
        Some(text) => {
            let n = parse_len(text)?;
            if n > context {
                bail!(
                    "--max-len {text} ({n} tokens) is past the model's context of {context} tokens \
                     (its max_position_embeddings); give at most {context}"
                );
            }
            Ok(n)
        }
        None if args.quick => Ok(context.min(Sizes::QUICK_MAX_LEN)),
        None => Ok(context),
    }
}

/// `--cut` resolved against the depth, checked with every policy it makes.
fn cut(args: &PaperArgs, layers: usize, shard: Option<(usize, usize)>) -> Result<Option<usize>> {
    let Some(text) = &args.cut else {
        if shard.is_some() {
            bail!(
                "--shard needs --cut: each shard would otherwise compare at the cut \
                 recommended on its own items, and the shards could not be joined"
            );
        }
        return Ok(None);
    };
    let spec: PolicySpec = format!("speed:{text}")
        .parse()
        .with_context(|| format!("--cut {text}: expected a layer count or a fraction like 3/4"))?;
    let c = match spec.cut {
        CutSpec::Layers(n) => n,
        CutSpec::Fraction(f) => (f * layers as f64).round() as usize,
    };
    let mut all = compared_policies(c);
    all.push(speed_bos(c));
    check_policies(&all, layers).with_context(|| format!("--cut {text}"))?;
    Ok(Some(c))
}

/// `--retrieval-cuts`, each in `1..=layers`.
fn retrieval_cuts(args: &PaperArgs, layers: usize) -> Result<Option<Vec<usize>>> {
    let Some(text) = &args.retrieval_cuts else {
        return Ok(None);
    };
    let cuts = text
        .split(',')
        .map(|c| {
            let n: usize = c
                .trim()
                .parse()
                .with_context(|| format!("--retrieval-cuts: {c:?} is not a layer count"))?;
            check_policies(&[speed_bos(n)], layers)
                .with_context(|| format!("--retrieval-cuts {text}"))?;
            Ok(n)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(cuts))
}

/// The adapted models of `--lora`, each with the policy it was trained for.
fn adapters(args: &PaperArgs, layers: usize) -> Result<Vec<Adapted>> {
    args.lora
        .iter()
        .map(|dir| {
            let mut session = args.load.load()?;
            let used = session.put_adapter(dir, LoraMode::Merge, &[])?;
            let Some(text) = used.identity.policy.clone() else {
                bail!(
                    "--lora {}: the adapter records no policy it was trained for \
                     (lcut_policy in adapter_config.json), so its table row has no policy",
                    dir.display()
                );
            };
            let policy: PolicySpec = text
                .parse()
                .with_context(|| format!("--lora {}: its lcut_policy", dir.display()))?;
            check_policies(&[policy], layers)
                .with_context(|| format!("--lora {}", dir.display()))?;
            eprintln!("{}", used.description);
            Ok(Adapted {
                session,
                identity: used.identity,
                policy,
            })
        })
        .collect()
}

/// The suite given, or the bundled model's.
fn suite_path(args: &PaperArgs) -> Result<PathBuf> {
    match (&args.suite, &args.load.model) {
        (Some(s), _) => Ok(s.clone()),
        (None, None) => Ok(lcut_engine::bundled(BUNDLED_SUITE)),
        (None, Some(m)) => bail!(
            "--suite is needed with --model {} (the bundled suite is for the bundled model)",
            m.display()
        ),
    }
}

impl Setup {
    /// Load and check everything of `args`.
    pub fn load(args: &PaperArgs) -> Result<Self> {
        let shard = args
            .shard
            .as_deref()
            .map(lcut_engine::shard::parse_shard)
            .transpose()?;
        let path = suite_path(args)?;
        let (items, hash) = read_suite_hashed(&path)?;
        let session = args.load.load()?;
        let cfg = session.model.config().clone();
        let layers = cfg.num_layers;
        let cut = cut(args, layers, shard)?;
        let retrieval_cuts = retrieval_cuts(args, layers)?;
        let max_len = max_len(args, cfg.max_position_embeddings)?;
        let device = args.load.device.open()?;
        let size = RunSize {
            dtype: args.load.dtype.mode().activation_dtype(),
            kv_dtype: session.model.kv_dtype(),
            total_len: max_len,
            chunk: args.prefill_chunk,
            block: session.model.attention_block_elems(),
            weights_loaded: true,
        };
        ensure_fits(&cfg, &device, &size).with_context(|| format!("--max-len {max_len}"))?;
        let adapters = adapters(args, layers)?;
        let settings = Settings {
            quick: args.quick,
            cut,
            retrieval_cuts,
            max_len,
            sizes: sizes(args),
            prefill_chunk: args.prefill_chunk.max(1),
            dtype: args.load.dtype.name(),
            kv_dtype: format!("{:?}", args.load.kv_dtype()).to_lowercase(),
            device: args.load.device.to_string(),
            adapters: adapters.iter().map(|a| a.identity.clone()).collect(),
        };
        let suite = SuiteSource {
            path: path.display().to_string(),
            hash,
            items: items.len(),
            shard: shard.map(|(i, n)| [i, n]),
        };
        let manifest = Manifest {
            tool_version: lcut_engine::diagnose::tool_version(),
            model: lcut_engine::diagnose::model_identity(&session)?,
            suite,
            settings: serde_json::to_value(&settings)?,
        };
        let memory_budget = crate::common::planned_budget(&session)?;
        Ok(Self {
            session,
            adapters,
            items,
            shard,
            settings,
            manifest,
            memory_budget,
        })
    }

    /// The kinds of the suite's items, in suite order.
    pub fn kinds(&self) -> Vec<&str> {
        self.items.iter().map(|i| i.kind.as_str()).collect()
    }
}

/// The model argument as it was given, or the bundled model's folder.
pub fn model_arg(args: &PaperArgs) -> String {
    model_or_bundled(&args.load.model).display().to_string()
}
