//! `lcut suite`: (re)write the project's task suite from a seed.

use std::path::PathBuf;

use anyhow::Result;
use lcut_engine::suite;

use crate::common::write_atomic;

/// Arguments of `lcut suite`.
#[derive(Debug, clap::Args)]
pub struct SuiteArgs {
    /// Seed of the generators.
    #[arg(long, default_value_t = suite::SMOLLM2_SUITE_SEED)]
    pub seed: u64,
    /// Where to write the JSON Lines.
    #[arg(long, default_value = suite::SMOLLM2_SUITE)]
    pub out: PathBuf,
}

/// Run `lcut suite`: write the suite and print its composition.
pub fn run(args: &SuiteArgs) -> Result<()> {
    let items = suite::generate(args.seed);
    write_atomic(&args.out, suite::to_jsonl(&items).as_bytes())?;
    let mut kinds: Vec<(&str, usize)> = Vec::new();
    for it in &items {
        match kinds.iter_mut().find(|(k, _)| *k == it.kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((&it.kind, 1)),
        }
    }
    let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}={n}")).collect();
    println!(
        "wrote {} items to {} ({})",
        items.len(),
        args.out.display(),
        parts.join(" ")
    );
    Ok(())
}
