//! Shards of a prompt set or suite written `I/N`, or `auto/N` with the
//! index taken from a cluster job array: Slurm's `SLURM_ARRAY_TASK_ID`
//! (less `SLURM_ARRAY_TASK_MIN`, so `--array=1-4` works too) or a
//! Kubernetes Indexed Job's `JOB_COMPLETION_INDEX`.

use crate::error::{EngineError, Result};

/// The variables `auto/N` reads, in order.
pub const SHARD_INDEX_VARS: [&str; 2] = ["SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX"];

/// Parse `I/N` or `auto/N` with the process environment.
pub fn parse_shard(text: &str) -> Result<(usize, usize)> {
    parse_shard_with(text, |var| std::env::var(var).ok())
}

/// Parse `I/N` or `auto/N`, reading variables through `env`; the result
/// is `(i, n)` with `0 <= i < n`.
pub fn parse_shard_with(
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(usize, usize)> {
    let bad = || EngineError::BadShard {
        text: text.to_string(),
    };
    let (i, n) = text.trim().split_once('/').ok_or_else(bad)?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    let i = match i.trim() {
        "auto" => index_from_env(n, &env)?,
        i => i.parse().map_err(|_| bad())?,
    };
    if n == 0 || i >= n {
        return Err(EngineError::Shard { index: i, count: n });
    }
    Ok((i, n))
}

/// The shard index a job array gives this task.
fn index_from_env(count: usize, env: &impl Fn(&str) -> Option<String>) -> Result<usize> {
    let number = |var: &'static str, value: String| {
        value
            .trim()
            .parse::<usize>()
            .map_err(|_| EngineError::BadShardIndex { var, value })
    };
    let [slurm, k8s] = SHARD_INDEX_VARS;
    if let Some(id) = env(slurm) {
        let id = number(slurm, id)?;
        let min = match env("SLURM_ARRAY_TASK_MIN") {
            Some(m) => number("SLURM_ARRAY_TASK_MIN", m)?,
            None => 0,
        };
        return Ok(id.saturating_sub(min));
    }
    match env(k8s) {
        Some(v) => number(k8s, v),
        None => Err(EngineError::NoShardIndex { count }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn explicit_shards_parse_and_are_checked() {
        assert_eq!(parse_shard_with("1/4", env(&[])).unwrap(), (1, 4));
        assert!(matches!(
            parse_shard_with("4/4", env(&[])),
            Err(EngineError::Shard { index: 4, count: 4 })
        ));
        for text in ["x", "1/x", "-1/4", "1-4"] {
            assert!(matches!(
                parse_shard_with(text, env(&[])),
                Err(EngineError::BadShard { .. })
            ));
        }
    }

    #[test]
    fn auto_reads_slurm_then_kubernetes() {
        let slurm = [("SLURM_ARRAY_TASK_ID", "2"), ("JOB_COMPLETION_INDEX", "0")];
        assert_eq!(parse_shard_with("auto/4", env(&slurm)).unwrap(), (2, 4));
        // --array=1-4: task ids 1..=4 are shards 0..=3
        let from_one = [("SLURM_ARRAY_TASK_ID", "4"), ("SLURM_ARRAY_TASK_MIN", "1")];
        assert_eq!(parse_shard_with("auto/4", env(&from_one)).unwrap(), (3, 4));
        let k8s = [("JOB_COMPLETION_INDEX", "3")];
        assert_eq!(parse_shard_with("auto/4", env(&k8s)).unwrap(), (3, 4));
        assert!(matches!(
            parse_shard_with("auto/4", env(&[("JOB_COMPLETION_INDEX", "5")])),
            Err(EngineError::Shard { index: 5, count: 4 })
        ));
    }

    #[test]
    fn auto_without_a_job_array_is_a_named_error() {
        let err = parse_shard_with("auto/4", env(&[])).unwrap_err();
        assert!(matches!(err, EngineError::NoShardIndex { count: 4 }));
        assert!(err.to_string().contains("SLURM_ARRAY_TASK_ID"));
        let err = parse_shard_with("auto/2", env(&[("JOB_COMPLETION_INDEX", "one")]));
        assert!(matches!(err, Err(EngineError::BadShardIndex { .. })));
    }
}
