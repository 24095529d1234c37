//! `lcut train` and `lcut eval`: the bundled task models (see `lcut-train`).

use anyhow::Result;

/// Run `lcut train`.
pub fn train(args: &lcut_train::TrainArgs) -> Result<()> {
    lcut_train::run_train(args)
}

/// Run `lcut eval`; the last line printed is `exact_match=...`.
pub fn eval(args: &lcut_train::EvalArgs) -> Result<()> {
    let result = lcut_train::run_eval(args)?;
    println!("{}", result.exact_match_line());
    Ok(())
}
