//! The shipped models in `fixtures/models` solve their task: accuracy bands
//! on a fixed held-out set (50 instances), and the miniature of the paper's
//! table (20 instances per cell, so the test takes seconds in a debug
//! build): each variant under full depth and under SPEED at every cutoff,
//! with and without the BoS anchor. `fixtures/models/README.md` has the same
//! table at 200 instances per cell.

use std::path::{Path, PathBuf};

use anyhow::{Result, ensure};
use lcut_train::{EvalOptions, run_eval};

const SEED: u64 = lcut_train::eval::DEFAULT_EVAL_SEED;
const VARIANTS: [&str; 3] = ["copy-full", "copy-speed3-bos", "copy-speed3-noanchor"];

fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name)
}

fn exact(name: &str, policy: &str, n: usize) -> Result<f64> {
    let r = run_eval(&EvalOptions {
        model: model(name),
        policy: policy.to_string(),
        n,
        seed: SEED,
    })?;
    ensure!(r.n == n && r.per_task.iter().map(|t| t.n).sum::<usize>() == n);
    Ok(r.exact_match)
}

#[test]
fn full_variant_solves_the_task_at_full_depth() -> Result<()> {
    let em = exact("copy-full", "full", 50)?;
    ensure!(em >= 0.95, "copy-full at full depth: exact match {em}");
    // Without SPEED training, cutting the prompt at the lowest layer breaks it.
    let cut = exact("copy-full", "speed:1+bos", 50)?;
    ensure!(cut <= 0.2, "copy-full under speed:1+bos kept {cut} exact");
    Ok(())
}

#[test]
fn speed_variants_solve_the_task_at_their_cutoff() -> Result<()> {
    for (name, policy) in [
        ("copy-speed3-bos", "speed:3/4+bos"),
        ("copy-speed3-noanchor", "speed:3/4"),
    ] {
        let em = exact(name, policy, 50)?;
        ensure!(em >= 0.9, "{name} under {policy}: exact match {em}");
    }
    Ok(())
}

/// (variant, policy, lowest accepted exact match, highest accepted) at 20
/// instances per cell.
const BANDS: [(&str, &str, f64, f64); 5] = [
    // The full-depth model reads the prompt in its top layer: cutting it
    // there breaks the copy; SPEED fine-tuning moves the reading below.
    ("copy-full", "speed:3+bos", 0.0, 0.3),
    ("copy-speed3-bos", "speed:3+bos", 0.9, 1.0),
    ("copy-speed3-noanchor", "speed:3", 0.9, 1.0),
    // No variant copies when the prompt exists in layer 0 alone.
    ("copy-speed3-bos", "speed:1+bos", 0.0, 0.3),
    ("copy-speed3-noanchor", "speed:1", 0.0, 0.3),
];

#[test]
fn the_table_of_variants_and_cutoffs() -> Result<()> {
    const N: usize = 20;
    let layers = lcut_model::ModelConfig::from_folder(&model(VARIANTS[0]))?.num_layers;
    let mut policies = vec!["full".to_string()];
    for c in 1..=layers {
        policies.push(format!("speed:{c}+bos"));
        policies.push(format!("speed:{c}"));
    }
    // One thread per variant: the cells are independent.
    let rows: Vec<Result<Vec<f64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = VARIANTS
            .iter()
            .map(|v| {
                let policies = &policies;
                s.spawn(move || policies.iter().map(|p| exact(v, p, N)).collect())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("eval thread panicked")))
            })
            .collect()
    });
    println!("| model | {} |", policies.join(" | "));
    println!("|---|{}", "---:|".repeat(policies.len()));
    let mut table = Vec::new();
    for (v, row) in VARIANTS.iter().zip(rows) {
        let row = row?;
        println!(
            "| {v} | {} |",
            row.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        // A cutoff at full depth is the full model.
        ensure!(row[0] == row[2 * layers - 1] && row[0] == row[2 * layers]);
        table.push((*v, row));
    }
    for (v, p, lo, hi) in BANDS {
        let Some((_, row)) = table.iter().find(|(name, _)| *name == v) else {
            anyhow::bail!("no row for {v}");
        };
        let Some(i) = policies.iter().position(|q| q == p) else {
            anyhow::bail!("no column for {p}");
        };
        ensure!(
            row[i] >= lo && row[i] <= hi,
            "{v} under {p}: exact match {} outside [{lo}, {hi}]",
            row[i]
        );
    }
    Ok(())
}
