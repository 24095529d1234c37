//! `lcut synth`: write a random-weight model of a real checkpoint's shape
//! (Llama-3.2-1B, Qwen2.5-1.5B, SmolLM3-3B, OLMo-3-7B, Llama-3.1-8B, and
//! the mixtures of experts Qwen3-30B-A3B and Mixtral-8x7B) as a Hugging
//! Face folder in safetensors or as a GGUF file, to exercise lcut (and
//! llama.cpp) at the sizes and layouts people use without downloading
//! anything.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use lcut_synth::{Format, WriteOptions, shapes, write_model};

/// Arguments of `lcut synth`.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Shape: llama-3.2-1b, qwen2.5-1.5b, smollm3-3b (NoPE every 4th layer),
    /// olmo-3-7b (norms after the blocks, sliding layers, YaRN),
    /// llama-3.1-8b, qwen3.5-9b (three linear-attention layers per full
    /// one), gemma-4-e2b (four sliding layers per full one, per-layer
    /// inputs, the top 20 layers reading earlier layers' K/V), gemma-4-e4b
    /// (five sliding layers per full one, per-layer inputs, the top 18
    /// reading earlier layers' K/V), gemma-4-26b-a4b (five sliding layers
    /// per full one whose keys are its values, 128 experts, 8 per token,
    /// beside every MLP), qwen3-30b-a3b (128 experts, 8 per token), qwen3.5-35b-a3b
    /// (Qwen3.5's layers, 256 experts, 8 per token, and a shared one),
    /// gpt-oss-20b (32 experts, 4 per token, sinks, sliding layers),
    /// mixtral-8x7b (8 experts, 2 per token) or small.
    #[arg(long)]
    pub shape: String,
    /// Format: safetensors-bf16, safetensors-f32 (a model folder), gguf-q4_0,
    /// gguf-q4_k, gguf-q4_k_m, gguf-q8_0 or gguf-mxfp4 (a GGUF file; q4_k_m
    /// mixes Q4_K and Q6_K as llama.cpp's Q4_K_M does; rows that are not
    /// whole 256-value blocks take Q5_0, Q5_1 or Q8_0 in their place, as
    /// llama.cpp's quantizer gives them; mxfp4 keeps the experts in MXFP4
    /// and the rest in Q8_0, as gpt-oss's own files).
    #[arg(long, value_parser = parse_format)]
    pub format: Format,
    /// Where to write it (a path that does not exist yet).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Give the shape this many layers (e.g. a 1B-wide model 32 layers deep,
    /// or 4 of Qwen3-30B-A3B's 48 to fit a small machine; the output says
    /// when the shape was cut).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Largest safetensors shard, bytes (Hugging Face's 5 GB by default).
    #[arg(long, default_value_t = lcut_synth::write::DEFAULT_SHARD_BYTES)]
    pub shard_bytes: u64,
}

/// The parameter count of `shape`, with the share a token runs where it
/// has experts: `30532122624 parameters (3353032704 run per token)`.
fn parameters(shape: &shapes::ModelShape) -> String {
    let all = shape.parameter_count();
    match shape.experts {
        Some(_) => format!(
            "{all} parameters ({} run per token)",
            shape.active_parameter_count()
        ),
        None => format!("{all} parameters"),
    }
}

fn parse_format(s: &str) -> std::result::Result<Format, String> {
    s.parse::<Format>().map_err(|e| e.to_string())
}

/// Run `lcut synth`.
pub fn run(args: &SynthArgs) -> Result<()> {
    let full = shapes::named(&args.shape)?;
    let shape = match args.layers {
        Some(layers) => full.clone().with_layers(layers),
        None => full.clone(),
    };
    let opts = WriteOptions {
        seed: args.seed,
        max_shard_bytes: args.shard_bytes,
    };
    eprintln!(
        "{} ({}, {} layers) as {} to {}",
        shape.name,
        parameters(&shape),
        shape.sizes.num_layers,
        args.format,
        args.out.display()
    );
    let (layers, of) = (shape.sizes.num_layers, full.sizes.num_layers);
    if layers != of {
        let cut = if layers < of { "reduced" } else { "deepened" };
        eprintln!(
            "{cut} to {layers} of {}'s {of} layers (--layers): the full shape has {}",
            full.name,
            parameters(&full)
        );
    }
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let written = write_model(&shape, args.format, &args.out, &opts, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .with_context(|| format!("writing {}", args.out.display()))?;
    bar.finish_and_clear();
    let depth = if layers == of {
        String::new()
    } else {
        format!("; {layers} of {}'s {of} layers", full.name)
    };
    println!(
        "wrote {} ({:.2} GB of weights{depth})",
        written.path.display(),
        written.weight_bytes as f64 / 1e9
    );
    Ok(())
}
