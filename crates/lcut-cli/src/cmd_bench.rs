//! `lcut bench`: TTFT, TPOT and KV bytes per policy and prompt length as
//! ratios against the full model measured in the same run; and, with
//! `--vs-candle`, plain decode speed against candle-transformers' Llama.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use indicatif::ProgressBar;
use lcut_engine::diagnose::predicted_prefill_flops_ratio;
use lcut_engine::{Generation, GenerationConfig, GenerationOutput, PreparedPrompt};
use lcut_model::probes::PhaseMassProbe;
use lcut_model::{
    Decoder, LlamaShape, LogitRows, ModelFormat, ResolvedModel, WeightMode, argmax_rows,
    default_attention_block_elems,
};
use lcut_policy::{Policy, PolicySpec, TokenPhases};
use lcut_synth::RandomLlama;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;

use crate::args::PolicyList;
use crate::common::{RunSize, count_bar, ensure_fits, parse_len, resolve_model, write_atomic};
use lcut_kernels::bandwidth::{DEFAULT_BYTES, measure_read};

/// Arguments of `lcut bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// LoRA adapter options (`--lora DIR`, `--lora-mode`).
    #[command(flatten)]
    pub lora: crate::lora_opt::LoraArgs,
    /// The model and how it loads (`--model`, `--dtype`, `--kv-dtype`,
    /// `--device`).
    #[command(flatten)]
    pub load: crate::common::ModelArgs,
    /// Policies to compare, separated by `,` or `;` (`slim:4@2k,8@1k` stays
    /// whole); `full` is always measured too.
    #[arg(long, default_value = "full,speed:3/4+bos")]
    policies: PolicyList,
    /// Prompt lengths, comma-separated (256, 1k, 4k, ...).
    #[arg(long, default_value = "256,1k,2k")]
    prompt_lengths: String,
    /// New tokens per run.
    #[arg(long, default_value_t = 32)]
    new_tokens: usize,
    /// Runs per (policy, length); the median is reported.
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// Most attention scores (heads x queries x keys) computed at once;
    /// the device's default when not given (2^30 on a GPU, 2^28 on the CPU).
    #[arg(long)]
    attention_block: Option<usize>,
    /// Random model: layers.
    #[arg(long, default_value_t = 12)]
    layers: usize,
    /// Random model: hidden size.
    #[arg(long, default_value_t = 512)]
    hidden: usize,
    /// Random model: query heads.
    #[arg(long, default_value_t = 8)]
    heads: usize,
    /// Random model: key/value heads.
    #[arg(long, default_value_t = 2)]
    kv_heads: usize,
    /// Random model: MLP width.
    #[arg(long, default_value_t = 1408)]
    intermediate: usize,
    /// Random model: vocabulary.
    #[arg(long, default_value_t = 32000)]
    vocab: usize,
    /// Compare plain decoding with candle-transformers' Llama instead.
    #[arg(long)]
    vs_candle: bool,
    /// Also time decoding with the phase-mass probe on every step (full
    /// model, first prompt length) against decoding without it.
    #[arg(long)]
    probe_cost: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One measured (policy, prompt length).
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    /// Policy as written.
    pub policy: String,
    /// Prompt tokens.
    pub prompt_len: usize,
    /// New tokens.
    pub new_tokens: usize,
    /// Time to first token, s (median).
    pub ttft_s: f64,
    /// Time per output token, s (median).
    pub tpot_s: f64,
    /// K/V bytes held at the end.
    pub kv_bytes: u64,
    /// K/V bytes by the cost formula.
    pub kv_bytes_formula: u64,
    /// K/V bytes decode reads at the end (SlimInfer's active blocks; the
    /// held bytes for static policies).
    pub kv_bytes_resident: u64,
    /// Predicted prefill matmul FLOPs over the full model's (the FLOP model
    /// with the tokens each layer ran): compare with `ttft_ratio`.
    pub prefill_flops_ratio: f64,
    /// Estimated peak memory of the run (weights, K/V, one attention block,
    /// activations), bytes.
    pub peak_bytes_estimate: u64,
    /// TTFT / TTFT(full) at this length.
    pub ttft_ratio: f64,
    /// TPOT / TPOT(full).
    pub tpot_ratio: f64,
    /// KV / KV(full).
    pub kv_ratio: f64,
    /// Bytes a decode step reads at the end: every weight once and the K/V
    /// decode reads (`kv_bytes_resident`).
    pub bytes_per_token: u64,
    /// `bytes_per_token` over TPOT, GB/s.
    pub gb_per_s: f64,
    /// The TPOT ratio the bytes predict: bytes_per_token / full's.
    pub tpot_ratio_predicted: f64,
    /// The machine's read bandwidth measured before the run with as many
    /// threads as decoding uses, GB/s.
    pub read_bandwidth_gb_s: f64,
}

/// How each (policy, prompt length) is timed: `lcut bench`'s options, and
/// `lcut paper`'s Figure 2, which times the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rounds {
    /// New tokens per run.
    pub new_tokens: usize,
    /// Runs per (policy, length); the median is reported.
    pub repeats: usize,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
}

impl BenchArgs {
    /// The timing options.
    fn rounds(&self) -> Rounds {
        Rounds {
            new_tokens: self.new_tokens,
            repeats: self.repeats,
            prefill_chunk: self.prefill_chunk,
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// A prompt of `len` random token ids (from 3 up) after `bos`.
pub fn random_prompt(len: usize, vocab: usize, bos: u32, seed: u64) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids: Vec<u32> = (0..len)
        .map(|_| rng.random_range(3..vocab as u32))
        .collect();
    ids[0] = bos;
    ids
}

/// The random-weight model of the shape in the arguments.
fn random_shape(args: &BenchArgs) -> RandomLlama {
    RandomLlama {
        shape: LlamaShape {
            vocab_size: args.vocab,
            hidden_size: args.hidden,
            intermediate_size: args.intermediate,
            num_layers: args.layers,
            num_heads: args.heads,
            num_kv_heads: args.kv_heads,
            rope_theta: 10000.0,
            rms_norm_eps: 1e-5,
            max_position_embeddings: 1 << 18,
            layout: lcut_model::Layout::Llama,
        },
        seed: 7,
    }
}

fn describe(args: &BenchArgs) {
    eprintln!(
        "random-weight llama: {} layers, hidden {}, {} heads, {} KV heads, MLP {}, vocab {}",
        args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate, args.vocab
    );
}

/// One short untimed generation per policy before measuring: the first use
/// of each kernel loads it (and on a GPU compiles its PTX for the device),
/// which would otherwise land in the first measured TTFT. A mixture's
/// experts, packed when a token first reads them, are all packed first
/// (llama.cpp's warm-up reads every expert too), or a short run would time
/// the packing of the experts its few tokens happen to choose.
pub fn warm_up(
    model: &Decoder,
    policies: &[Policy],
    lengths: &[usize],
    prefill_chunk: usize,
    bos: u32,
) -> Result<()> {
    let packed = model.pack_deferred()?;
    if packed > 0 {
        eprintln!(
            "packed {packed} expert matrices before timing (they pack on first use otherwise)"
        );
    }
    let len = lengths.iter().copied().min().unwrap_or(64).clamp(8, 256);
    let prompt =
        PreparedPrompt::from_ids(random_prompt(len, model.config().vocab_size, bos, 0), None)?;
    for policy in policies {
        let config = GenerationConfig {
            max_new_tokens: 2,
            prefill_chunk,
            ..GenerationConfig::default()
        };
        Generation::new(model, prompt.clone(), *policy, config)?.run(|_| true)?;
    }
    Ok(())
}

/// One policy's rounds at one prompt length.
#[derive(Default, Clone)]
pub struct PolicyRuns {
    /// Each round's output.
    outs: Vec<GenerationOutput>,
    /// The prefill's predicted FLOPs over the full model's, from what each
    /// layer ran and projected (the last round's).
    prefill_flops_ratio: f64,
}

/// Every policy on `prompt`, `rounds.repeats` rounds; rounds interleave the
/// policies so that load changes on the machine hit every policy alike.
pub fn measure_rounds(
    model: &Decoder,
    prompt: &PreparedPrompt,
    policies: &[Policy],
    rounds: Rounds,
    bar: &ProgressBar,
) -> Result<Vec<PolicyRuns>> {
    let len = prompt.len();
    let mut runs = vec![PolicyRuns::default(); policies.len()];
    for _ in 0..rounds.repeats.max(1) {
        for (k, policy) in policies.iter().enumerate() {
            bar.set_message(format!("{policy} @ {len}"));
            let config = GenerationConfig {
                max_new_tokens: rounds.new_tokens,
                prefill_chunk: rounds.prefill_chunk,
                ..GenerationConfig::default()
            };
            let mut generation = Generation::new(model, prompt.clone(), *policy, config)?;
            // chunk by chunk, so that a long prefill shows where it is
            generation.prefill_with(None, |p| {
                bar.set_message(format!("{policy} @ {len}: prefill {}/{}", p.done, p.total));
                true
            })?;
            bar.set_message(format!("{policy} @ {len}: decode"));
            let vis = generation.sequence().visibility();
            runs[k].prefill_flops_ratio = predicted_prefill_flops_ratio(model, vis, len);
            runs[k].outs.push(generation.run(|_| true)?);
            bar.inc(1);
        }
    }
    Ok(runs)
}

/// One policy's row at one prompt length: medians over its rounds, K/V
/// checked against the cost formula, the FLOP prediction and peak memory
/// (ratios against full are filled in by the caller).
fn bench_row(
    model: &Decoder,
    policy: &Policy,
    runs: &PolicyRuns,
    at: LengthPoint,
    rounds: Rounds,
) -> Result<BenchRow> {
    let LengthPoint {
        len,
        block,
        bandwidth,
    } = at;
    let outs = &runs.outs;
    let out = outs.last().context("no run")?;
    let ttft = outs.iter().map(|o| o.timing.ttft_s).collect();
    let tpot = outs.iter().map(|o| o.timing.tpot_s).collect();
    let median_tpot = median(tpot);
    let bytes = model.decode_weight_bytes() as u64 + out.kv_bytes_resident;
    if out.kv_bytes_held != out.kv_bytes_formula {
        bail!(
            "{policy}: caches hold {} bytes but the cost formula says {}",
            out.kv_bytes_held,
            out.kv_bytes_formula
        );
    }
    let peak = lcut_model::memory::estimate(
        model.config(),
        model.dtype(),
        out.kv_bytes_formula,
        len + rounds.new_tokens,
        rounds.prefill_chunk,
        block,
    )
    .for_prefill_path(
        (model.device(), &[policy.kind()]),
        model.config(),
        model.dtype(),
        (len + rounds.new_tokens, rounds.prefill_chunk),
    )
    .with_weights(model.weight_bytes() as u64);
    Ok(BenchRow {
        policy: policy.to_string(),
        prompt_len: len,
        new_tokens: out.tokens.len(),
        peak_bytes_estimate: peak.total(),
        ttft_s: median(ttft),
        tpot_s: median_tpot,
        kv_bytes: out.kv_bytes_held,
        kv_bytes_formula: out.kv_bytes_formula,
        kv_bytes_resident: out.kv_bytes_resident,
        prefill_flops_ratio: runs.prefill_flops_ratio,
        ttft_ratio: 1.0,
        tpot_ratio: 1.0,
        kv_ratio: 1.0,
        bytes_per_token: bytes,
        gb_per_s: bytes as f64 / median_tpot / 1e9,
        tpot_ratio_predicted: 1.0,
        read_bandwidth_gb_s: bandwidth,
    })
}

/// Run `lcut bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    let mode = args.load.dtype.mode();
    let dtype = mode.activation_dtype();
    let device = args.load.device.open()?;
    let resolved = args.load.model.as_deref().map(resolve_model).transpose()?;
    let is_gguf = |m: &ResolvedModel| m.format == ModelFormat::Gguf;
    if mode == WeightMode::Quantized && !resolved.as_ref().is_some_and(is_gguf) {
        bail!("--dtype q runs a GGUF file's quantized weights: give one with --model");
    }
    if args.vs_candle {
        return against_candle(args, resolved.as_ref(), mode, &device);
    }
    let lengths = args
        .prompt_lengths
        .split(',')
        .map(parse_len)
        .collect::<Result<Vec<_>>>()?;
    let longest = lengths.iter().max().copied().unwrap_or(0) + args.new_tokens;
    let block = args
        .attention_block
        .unwrap_or_else(|| default_attention_block_elems(&device));
    let size = RunSize {
        dtype,
        kv_dtype: args.load.kv_dtype(),
        total_len: longest,
        chunk: args.prefill_chunk,
        block,
        weights_loaded: false,
    };
    let mut model = bench_model(args, resolved.as_ref(), &device, size)?;
    model.set_attention_block_elems(block);
    model.set_kv_dtype(args.load.kv_dtype())?;
    let cfg = model.config();
    let policies = bench_policies(args, cfg.num_layers, cfg.num_kv_heads)?;
    if let Some(note) = crate::common::press_layers_note(&model, &policies) {
        eprintln!("{note}");
    }
    let bos = model.config().bos_token_id.unwrap_or(1);
    let total = lengths.len() * policies.len() * args.repeats.max(1);
    let bar = count_bar(total, "runs");
    let bandwidth = read_bandwidth(&model, &device, &args.load.device.to_string());
    warm_up(&model, &policies, &lengths, args.prefill_chunk, bos)?;
    let mut rows = Vec::new();
    for &len in &lengths {
        let ids = random_prompt(len, model.config().vocab_size, bos, len as u64);
        let prompt = PreparedPrompt::from_ids(ids, None)?;
        let runs = measure_rounds(&model, &prompt, &policies, args.rounds(), &bar)?;
        let at = LengthPoint {
            len,
            block,
            bandwidth,
        };
        rows.extend(rows_at_length(&model, &policies, &runs, at, args.rounds())?);
    }
    bar.finish_and_clear();
    print_rows(&rows);
    if args.probe_cost {
        probe_cost(&model, lengths[0], args, bos)?;
    }
    if let Some(path) = &args.json {
        write_atomic(path, serde_json::to_string_pretty(&rows)?.as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// `--vs-candle`: plain decoding against candle-transformers' Llama, on the
/// model given or a random one of the shape in the arguments (written to a
/// temporary folder, which candle-transformers loads).
fn against_candle(
    args: &BenchArgs,
    resolved: Option<&ResolvedModel>,
    mode: WeightMode,
    device: &Device,
) -> Result<()> {
    if mode == WeightMode::Quantized {
        bail!("--vs-candle compares dense f32/bf16/f16 models; drop --dtype q");
    }
    if resolved.is_some_and(|m| m.format == ModelFormat::Gguf) {
        bail!("--vs-candle loads candle-transformers' Llama from a model folder, not a GGUF file");
    }
    let tmp = tempfile::tempdir()?;
    let folder = match resolved {
        Some(m) => m.path.clone(),
        None => {
            describe(args);
            let dir = tmp.path().join("random-llama");
            random_shape(args).write(&dir)?;
            dir
        }
    };
    vs_candle(args, &folder, mode.activation_dtype(), device)
}

/// The model measured: the one given (with its adapter), or a random one of
/// the shape in the arguments, loaded on `device`; refused when a run of
/// `size` would not fit in memory.
fn bench_model(
    args: &BenchArgs,
    resolved: Option<&ResolvedModel>,
    device: &Device,
    size: RunSize,
) -> Result<Decoder> {
    let mode = args.load.dtype.mode();
    Ok(match resolved {
        Some(resolved) => {
            let mut model = Decoder::load_format(&resolved.path, resolved.format, mode, device)
                .with_context(|| format!("loading {resolved}"))?;
            args.lora.apply(&mut model, &args.policies.texts())?;
            let loaded = RunSize {
                weights_loaded: true,
                ..size
            };
            ensure_fits(model.config(), device, &loaded)?;
            model
        }
        None => {
            describe(args);
            let shape = random_shape(args);
            ensure_fits(&shape.config()?, device, &size)?;
            shape.build(size.dtype, device)?
        }
    })
}

/// `full`, then the policies of the arguments (each once), resolved for a
/// model of `num_layers` layers and `kv_heads` K/V heads.
fn bench_policies(args: &BenchArgs, num_layers: usize, kv_heads: usize) -> Result<Vec<Policy>> {
    let mut specs: Vec<PolicySpec> = vec![PolicySpec::full()];
    for spec in &args.policies.0 {
        if !specs.contains(spec) {
            specs.push(*spec);
        }
    }
    Ok(specs
        .iter()
        .map(|s| lcut_engine::heads::resolve_spec(s, num_layers, kv_heads, None))
        .collect::<Result<Vec<_>, _>>()?)
}

/// Where rows are measured: a prompt length, the attention block the run
/// used and the machine's read bandwidth (NaN when not measured).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LengthPoint {
    /// Prompt tokens.
    pub len: usize,
    /// Attention scores computed at once.
    pub block: usize,
    /// Read bandwidth, GB/s.
    pub bandwidth: f64,
}

/// The rows of every policy at one prompt length, with their ratios to
/// full's (the first policy).
pub fn rows_at_length(
    model: &Decoder,
    policies: &[Policy],
    runs: &[PolicyRuns],
    at: LengthPoint,
    rounds: Rounds,
) -> Result<Vec<BenchRow>> {
    let mut at_len: Vec<BenchRow> = Vec::new();
    for (policy, policy_runs) in policies.iter().zip(runs) {
        at_len.push(bench_row(model, policy, policy_runs, at, rounds)?);
    }
    let full = at_len[0].clone();
    for r in &mut at_len {
        r.ttft_ratio = r.ttft_s / full.ttft_s;
        r.tpot_ratio = r.tpot_s / full.tpot_s;
        r.kv_ratio = r.kv_bytes as f64 / full.kv_bytes as f64;
        r.tpot_ratio_predicted = r.bytes_per_token as f64 / full.bytes_per_token as f64;
    }
    Ok(at_len)
}

/// The CPU's read bandwidth with as many threads as decoding uses, printed
/// with what a decode step reads and the kernels' level; NaN on a GPU,
/// where the host's bandwidth says nothing of the run (the rows' GB/s is
/// then the device's achieved figure alone).
fn read_bandwidth(model: &Decoder, device: &Device, label: &str) -> f64 {
    let weights_mb = model.decode_weight_bytes() as f64 / 1e6;
    if !device.is_cpu() {
        eprintln!("on {label}: a decode step reads {weights_mb:.1} MB of weights");
        crate::memory_check::say_attention_path(model);
        return f64::NAN;
    }
    let threads = rayon::current_num_threads();
    let bandwidth = measure_read(DEFAULT_BYTES, threads, 3).gb_per_s;
    eprintln!(
        "read bandwidth with {threads} thread(s): {bandwidth:.1} GB/s; a decode step reads {weights_mb:.1} MB of weights ({} kernels, {}{})",
        lcut_kernels::Isa::detect().name(),
        prefetch_note(lcut_kernels::quant::prefetch::distance()),
        pages_note(
            lcut_kernels::quant::huge_page_bytes(),
            lcut_kernels::quant::huge_pages_turned_off()
        )
    );
    bandwidth
}

/// How much of the process's memory sits on huge pages, as the bench
/// prints it after the prefetch note (nothing where the kernel does not
/// say); `declined_by_user` when `LCUT_HUGE_PAGES=0` asked for none.
fn pages_note(huge_bytes: Option<usize>, declined_by_user: bool) -> String {
    let var = lcut_kernels::quant::HUGE_PAGES_VAR;
    match huge_bytes {
        None => String::new(),
        Some(0) if declined_by_user => format!("; weights on 4 KiB pages ({var}=0)"),
        Some(0) => {
            "; no huge pages: the kernel gave none (transparent huge pages off?)".to_string()
        }
        Some(bytes) => format!("; {:.1} MB on 2 MiB pages", bytes as f64 / 1e6),
    }
}

/// How the decode products prefetch their weights, as the bench prints it.
fn prefetch_note(distance: usize) -> String {
    match distance {
        0 => "no software prefetch".to_string(),
        bytes => format!("weights prefetched {bytes} B ahead"),
    }
}

/// The table `lcut bench` prints: ratios against full measured in the
/// same run, with the FLOP model's prediction beside the TTFT ratio and the
/// byte model's (weights + K/V decode reads, over full's) beside the TPOT
/// ratio; bytes a decode step reads and the GB/s that makes.
fn print_rows(rows: &[BenchRow]) {
    let width = rows
        .iter()
        .map(|r| r.policy.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "{:<width$} {:>7} {:>10} {:>10} {:>12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>6} {:>9}",
        "policy",
        "prompt",
        "TTFT ms",
        "TPOT ms",
        "KV bytes",
        "TTFT x",
        "FLOP x",
        "TPOT x",
        "bytes x",
        "KV x",
        "res. x",
        "MB/tok",
        "GB/s",
        "peak GiB"
    );
    for r in rows {
        let full_kv = r.kv_bytes as f64 / r.kv_ratio.max(f64::MIN_POSITIVE);
        println!(
            "{:<width$} {:>7} {:>10.1} {:>10.2} {:>12} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>8.1} {:>6.1} {:>9.1}",
            r.policy,
            r.prompt_len,
            r.ttft_s * 1e3,
            r.tpot_s * 1e3,
            r.kv_bytes,
            r.ttft_ratio,
            r.prefill_flops_ratio,
            r.tpot_ratio,
            r.tpot_ratio_predicted,
            r.kv_ratio,
            r.kv_bytes_resident as f64 / full_kv,
            r.bytes_per_token as f64 / 1e6,
            r.gb_per_s,
            r.peak_bytes_estimate as f64 / f64::from(1u32 << 30)
        );
    }
}

/// Decode tokens/s of the full model after a `len`-token prompt with and
/// without the phase-mass probe on every step, interleaved rounds; the
/// probe must not change the tokens.
fn probe_cost(model: &Decoder, len: usize, args: &BenchArgs, bos: u32) -> Result<()> {
    let ids = random_prompt(len, model.config().vocab_size, bos, 11);
    let steps = args.new_tokens.max(2);
    let (mut plain, mut probed) = (Vec::new(), Vec::new());
    for _ in 0..args.repeats.max(1) {
        let (p, pt) = time_lcut(model, &ids, steps, false)?;
        let (q, qt) = time_lcut(model, &ids, steps, true)?;
        if pt != qt {
            bail!("the probe changed the tokens: {pt:?} vs {qt:?}");
        }
        plain.push(p.decode_tok_s);
        probed.push(q.decode_tok_s);
    }
    let (p, q) = (median(plain), median(probed));
    println!(
        "phase-mass probe on every decode step (prompt {len}): {p:.1} tok/s without, {q:.1} with, time ratio {:.3}",
        p / q
    );
    Ok(())
}

/// Decode timing of one engine: prefill seconds and decode tokens/s.
#[derive(Debug, Clone, Copy, Serialize)]
struct DecodeSpeed {
    prefill_s: f64,
    decode_tok_s: f64,
}

/// Greedy decoding timed the same way for both engines: `prefill` runs the
/// prompt and gives the first token; `step(token, i)` feeds token `i - 1`
/// of the output and gives token `i`.
fn time_greedy(
    steps: usize,
    prefill: impl FnOnce() -> Result<u32>,
    mut step: impl FnMut(u32, usize) -> Result<u32>,
) -> Result<(DecodeSpeed, Vec<u32>)> {
    let t0 = Instant::now();
    let mut next = prefill()?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut tokens = vec![next];
    let t1 = Instant::now();
    for i in 1..steps {
        next = step(next, i)?;
        tokens.push(next);
    }
    let decode_s = t1.elapsed().as_secs_f64();
    Ok((
        DecodeSpeed {
            prefill_s,
            decode_tok_s: (steps - 1) as f64 / decode_s,
        },
        tokens,
    ))
}

fn time_lcut(
    model: &Decoder,
    ids: &[u32],
    steps: usize,
    with_probe: bool,
) -> Result<(DecodeSpeed, Vec<u32>)> {
    let mut seq = model.new_full_sequence();
    seq.reserve(ids.len() + steps);
    let phases = TokenPhases::raw_prompt(ids.len(), 1)?;
    let mut probe = PhaseMassProbe::new(phases);
    let seq = std::cell::RefCell::new(seq);
    time_greedy(
        steps,
        || {
            let out = model.forward(&mut seq.borrow_mut(), ids, LogitRows::Last, None)?;
            Ok(argmax_rows(&out.logits.context("logits")?)?[0])
        },
        |next, _| {
            let p: Option<&mut dyn lcut_model::Probe> =
                if with_probe { Some(&mut probe) } else { None };
            let out = model.forward(&mut seq.borrow_mut(), &[next], LogitRows::Last, p)?;
            Ok(argmax_rows(&out.logits.context("logits")?)?[0])
        },
    )
}

#[allow(unsafe_code)]
fn load_candle_llama(
    folder: &std::path::Path,
    dtype: DType,
    device: &Device,
) -> Result<(
    candle_transformers::models::llama::Llama,
    candle_transformers::models::llama::Config,
)> {
    use candle_transformers::models::llama::{Llama, LlamaConfig};
    let cfg: LlamaConfig =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json"))?)?;
    let cfg = cfg.into_config(false);
    // SAFETY: the benchmark's own freshly written weights, mapped read-only.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(
            &[folder.join("model.safetensors")],
            dtype,
            device,
        )?
    };
    Ok((Llama::load(vb, &cfg)?, cfg))
}

fn time_candle(
    folder: &std::path::Path,
    dtype: DType,
    device: &Device,
    ids: &[u32],
    steps: usize,
) -> Result<(DecodeSpeed, Vec<u32>)> {
    use candle_transformers::models::llama::Cache;
    let (llama, cfg) = load_candle_llama(folder, dtype, device)?;
    let cache = std::cell::RefCell::new(Cache::new(true, dtype, &cfg, device)?);
    let run = |input: &[u32], pos: usize| -> Result<u32> {
        let input = Tensor::new(input, device)?.unsqueeze(0)?;
        let logits = llama.forward(&input, pos, &mut cache.borrow_mut())?;
        Ok(argmax_rows(&logits.to_dtype(DType::F32)?)?[0])
    };
    time_greedy(
        steps,
        || run(ids, 0),
        |next, i| run(&[next], ids.len() + i - 1),
    )
}

fn vs_candle(
    args: &BenchArgs,
    folder: &std::path::Path,
    dtype: DType,
    device: &Device,
) -> Result<()> {
    let model = Decoder::load_format(
        folder,
        ModelFormat::Folder,
        WeightMode::Dense(dtype),
        device,
    )?;
    let len = args
        .prompt_lengths
        .split(',')
        .next()
        .map(parse_len)
        .transpose()?
        .unwrap_or(256);
    let ids = random_prompt(len, model.config().vocab_size, 1, 11);
    let steps = args.new_tokens.max(2);
    let repeats = args.repeats.max(1);
    let (mut candle, mut plain, mut probed) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..repeats {
        eprintln!(
            "round {}/{repeats}: prompt {len}, {steps} decode steps",
            r + 1
        );
        let (c, ct) = time_candle(folder, dtype, device, &ids, steps)?;
        let (p, pt) = time_lcut(&model, &ids, steps, false)?;
        let (q, qt) = time_lcut(&model, &ids, steps, true)?;
        if pt != qt {
            bail!("the probe changed the tokens: {pt:?} vs {qt:?}");
        }
        let agree = ct.iter().zip(&pt).filter(|(a, b)| a == b).count();
        eprintln!(
            "  greedy tokens equal to candle-transformers': {agree}/{}",
            ct.len()
        );
        candle.push(c.decode_tok_s);
        plain.push(p.decode_tok_s);
        probed.push(q.decode_tok_s);
    }
    let (c, p, q) = (median(candle), median(plain), median(probed));
    println!("decode tokens/s (median of {repeats}):");
    println!("  candle-transformers llama  {c:>8.1}");
    println!(
        "  lcut, probes off           {p:>8.1}   speed ratio vs candle {:.3}",
        p / c
    );
    println!(
        "  lcut, phase-mass probe on  {q:>8.1}   time ratio vs probes off {:.3}",
        p / q
    );
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "prompt_len": len, "decode_steps": steps, "repeats": repeats,
            "candle_tok_s": c, "lcut_tok_s": p, "lcut_probe_tok_s": q,
            "speed_ratio_vs_candle": p / c, "probe_time_ratio": p / q,
        });
        write_atomic(path, serde_json::to_string_pretty(&json)?.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pages_note_says_how_much_is_on_huge_pages_or_why_none() {
        assert_eq!(pages_note(None, false), "");
        assert!(pages_note(Some(0), false).contains("the kernel gave none"));
        assert!(pages_note(Some(0), true).contains("LCUT_HUGE_PAGES=0"));
        assert_eq!(
            pages_note(Some(3_893_248 * 1024), false),
            "; 3986.7 MB on 2 MiB pages"
        );
    }
}
