//! The bundled full-depth model solves its task: exact match on a fixed
//! held-out set (50 instances, so the test takes seconds).

use std::path::Path;

use anyhow::{Result, ensure};
use lcut_train::{EvalArgs, run_eval};

#[test]
fn full_variant_solves_the_task_at_full_depth() -> Result<()> {
    let r = run_eval(&EvalArgs {
        model: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/copy-full"),
        policy: "full".to_string(),
        n: 50,
        seed: lcut_train::eval::DEFAULT_EVAL_SEED,
    })?;
    ensure!(r.n == 50);
    ensure!(
        r.exact_match >= 0.95,
        "copy-full at full depth: exact match {}",
        r.exact_match
    );
    // without retraining, cutting the prompt at the lowest layer breaks it
    let cut = run_eval(&EvalArgs {
        model: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/copy-full"),
        policy: "speed:1+bos".to_string(),
        n: 50,
        seed: lcut_train::eval::DEFAULT_EVAL_SEED,
    })?;
    ensure!(
        cut.exact_match <= 0.2,
        "speed:1+bos kept {} exact",
        cut.exact_match
    );
    Ok(())
}
