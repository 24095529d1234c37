//! `lcut`: look inside a decoder-only language model layer by layer and
//! decide how shallow its prompt can be (SPEED: shallow prefill, deep decode).

mod args;
mod cmd_bench;
mod cmd_diagnose;
mod cmd_eval;
mod cmd_forward;
mod cmd_frontier;
mod cmd_generate;
mod cmd_leaderboard;
mod cmd_models;
mod cmd_paper;
mod cmd_parity;
mod cmd_recommend;
mod cmd_report;
mod cmd_suite;
mod cmd_sweep;
mod cmd_synth;
mod cmd_tokenize;
mod cmd_train;
mod cmd_train_lora;
mod common;
mod generate_file;
mod lora_opt;
mod memory_check;

use std::ffi::OsString;

use clap::{Parser, Subcommand};

/// Layer-wise diagnostics and SPEED generation for decoder-only LMs.
#[derive(Debug, Parser)]
#[command(name = "lcut", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Diagnose where generated tokens still read the prompt; recommend L_cut.
    Diagnose(cmd_diagnose::DiagnoseArgs),
    /// Teacher-forced quality and cost of SPEED at every cutoff.
    Sweep(cmd_sweep::SweepArgs),
    /// Render a run's report as html, md, csv or json.
    Report(cmd_report::ReportArgs),
    /// Merge shard runs into the report of the whole prompt set.
    Merge(cmd_report::MergeArgs),
    /// Accuracy against K/V held (or the compression ratio), one line per
    /// family, from `lcut eval` results or a leaderboard run: an HTML page
    /// and an SVG.
    Frontier(cmd_frontier::FrontierArgs),
    /// Train a bundled task model (full depth or SPEED-aware); with
    /// `--lora R`, a LoRA adapter for any model (as `train-lora`).
    Train(cmd_train::TrainArgs),
    /// Train a SPEED-aware LoRA adapter for a model by self-distillation
    /// (the full model's own continuations and distributions as targets);
    /// `lcut train --lora R ...` is the same command.
    TrainLora(cmd_train_lora::TrainLoraArgs),
    /// Exact match of a task model under a policy (the last line is
    /// `exact_match=...`), or any model on a task suite (`--suite`).
    Eval(cmd_eval::EvalCommand),
    /// Merge `lcut eval --suite --shard` results into the whole suite's result.
    EvalMerge(cmd_eval::EvalMergeArgs),
    /// Write the project's task suite from a seed.
    Suite(cmd_suite::SuiteArgs),
    /// Run one sequence and write logits, residuals and attention to safetensors.
    Forward(cmd_forward::ForwardArgs),
    /// Generate under a policy, optionally side by side with another.
    Generate(Box<cmd_generate::GenerateArgs>),
    /// TTFT, TPOT and KV bytes per policy and prompt length, as ratios to full.
    Bench(cmd_bench::BenchArgs),
    /// The SPEED paper's figures and tables for one model in one report
    /// (resumable, shardable): attention mass, timing, per-category layers,
    /// retrieval by length, the category table, repetition loops.
    Paper(Box<cmd_paper::PaperArgs>),
    /// Join the folders of `lcut paper --shard` runs into the whole run's report.
    PaperMerge(cmd_paper::PaperMergeArgs),
    /// Check logits on a device and dtype against the transformers reference cases.
    Parity(cmd_parity::ParityArgs),
    /// The SPEED cut and kept (layer, K/V head) pairs a K/V budget buys,
    /// from a diagnose report; writes the head file.
    Recommend(cmd_recommend::RecommendArgs),
    /// Token ids of a text (comma-separated on the last line); --chat renders it as a user message.
    Tokenize(cmd_tokenize::TokenizeArgs),
    /// The models in the Hugging Face hub cache and Ollama's store, named as --model takes them.
    Models(cmd_models::ModelsArgs),
    /// Write a random-weight model of a real checkpoint's shape (safetensors or GGUF).
    Synth(cmd_synth::SynthArgs),
}

/// Rust ignores SIGPIPE, so a write to a closed pipe (`lcut eval-merge ...
/// | head -3`) made `println!` panic. Take the default action back, as other
/// command-line tools do: the process ends quietly when its reader has gone.
#[allow(unsafe_code)]
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: called first thing in main, before any other thread exists;
    // SIG_DFL is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `lcut train --lora R ...` trains an adapter: the arguments of
/// `train-lora`. (`train` alone trains a bundled task model from scratch,
/// whose options — `--layers` as a count among them — differ.)
fn route_adapter_training(mut args: Vec<OsString>) -> Vec<OsString> {
    let lora = |a: &OsString| a == "--lora" || a.to_string_lossy().starts_with("--lora=");
    if args.get(1).is_some_and(|c| c == "train") && args.iter().skip(2).any(lora) {
        args[1] = "train-lora".into();
    }
    args
}

fn main() -> anyhow::Result<()> {
    quiet_on_closed_pipe();
    // before any other thread allocates (see `lcut_engine::heap`)
    lcut_engine::heap::keep_freed_buffers();
    // SAFETY: no other thread exists yet.
    #[allow(unsafe_code)]
    unsafe {
        lcut_engine::threads::pin_thread_count()
    };
    let cli = Cli::parse_from(route_adapter_training(std::env::args_os().collect()));
    match &cli.command {
        Command::Diagnose(a) => cmd_diagnose::run(a),
        Command::Sweep(a) => cmd_sweep::run(a),
        Command::Report(a) => cmd_report::run(a),
        Command::Frontier(a) => cmd_frontier::run(a),
        Command::Merge(a) => cmd_report::merge(a),
        Command::Train(a) => cmd_train::train(a),
        Command::TrainLora(a) => cmd_train_lora::run(a),
        Command::Eval(a) => cmd_eval::run(a),
        Command::EvalMerge(a) => cmd_eval::merge(a),
        Command::Suite(a) => cmd_suite::run(a),
        Command::Forward(a) => cmd_forward::run(a),
        Command::Generate(a) => cmd_generate::run(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::Paper(a) => cmd_paper::run(a),
        Command::PaperMerge(a) => cmd_paper::merge(a),
        Command::Parity(a) => cmd_parity::run(a),
        Command::Recommend(a) => cmd_recommend::run(a),
        Command::Tokenize(a) => cmd_tokenize::run(a),
        Command::Models(a) => cmd_models::run(a),
        Command::Synth(a) => cmd_synth::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Command {
        let args = line.split(' ').map(OsString::from).collect();
        Cli::parse_from(route_adapter_training(args)).command
    }

    #[test]
    fn train_with_lora_is_adapter_training() {
        let c = parse("lcut train --model m.gguf --lora 8 --policy speed:22+bos --out o");
        assert!(matches!(c, Command::TrainLora(_)), "{c:?}");
        let c = parse("lcut train --model m.gguf --lora=4 --policy speed:22+bos --out o");
        assert!(matches!(c, Command::TrainLora(_)), "{c:?}");
        let c = parse("lcut train --out o --policy speed:2+bos");
        assert!(matches!(c, Command::Train(_)), "{c:?}");
        // an option value that happens to read --lora elsewhere is left alone
        let c = parse("lcut eval --model m --suite s --lora a");
        assert!(matches!(c, Command::Eval(_)), "{c:?}");
    }
}
