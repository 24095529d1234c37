//! The exact-match table of shipped task models under full depth and SPEED
//! at every cutoff, with and without the BoS anchor, as Markdown (one cell
//! is `lcut eval --model M --policy P --n N`; `lcut train` makes the models).
//!
//! ```text
//! cargo run --release -p lcut-train --example lcut-train -- table fixtures/models/copy-*
//! ```

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use lcut_train::{EvalOptions, run_eval};

#[derive(Parser)]
#[command(about = "Tables of lcut's bundled task models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Exact match of each model under full and speed:C(+bos) for C in 1..=L.
    Table {
        /// Model folders.
        models: Vec<PathBuf>,
        /// Held-out instances per cell.
        #[arg(long, default_value_t = 200)]
        n: usize,
        /// Seed of the held-out instances.
        #[arg(long, default_value_t = lcut_train::eval::DEFAULT_EVAL_SEED)]
        seed: u64,
    },
}

fn table(models: &[PathBuf], n: usize, seed: u64) -> Result<()> {
    let mut header: Option<Vec<String>> = None;
    for model in models {
        let cfg = lcut_model::ModelConfig::from_folder(model)?;
        let layers = cfg.num_layers;
        let mut policies = vec!["full".to_string()];
        for c in 1..=layers {
            policies.push(format!("speed:{c}+bos"));
            policies.push(format!("speed:{c}"));
        }
        if header.is_none() {
            let h = policies.clone();
            println!("| model | {} |", h.join(" | "));
            println!("|---|{}", "---:|".repeat(h.len()));
            header = Some(h);
        }
        let mut cells = Vec::new();
        for p in &policies {
            let r = run_eval(&EvalOptions {
                model: model.clone(),
                policy: p.clone(),
                n,
                seed,
            })?;
            eprintln!("{} {} {}", model.display(), r.policy, r.exact_match_line());
            cells.push(format!("{:.3}", r.exact_match));
        }
        let name = model
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        println!("| {name} | {} |", cells.join(" | "));
    }
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Table { models, n, seed } => table(&models, n, seed),
    }
}
