//! Soak: many generations in one process on the bundled model, each with a
//! random policy (full, `speed:C`, `speed:C+bos`, SlimInfer with random
//! valid cuts, budgets and options), a random prompt (chat-templated text of
//! random words and odd characters, or raw token ids; 2 to ~300 tokens, a
//! few too long on purpose), random sampling and prefill chunk, and a random
//! cancellation (the step callback returns false at a random step).
//!
//! After a warm-up of [`WARM_UP`] generations the process's resident memory
//! (`VmRSS`) and its thread count (`/proc/self/task`) are read; at the end
//! the resident memory may have grown by at most [`RSS_BOUND`] (64 MiB) and
//! the thread count must be back to the warm-up's. Every generation must
//! produce what it was asked for (no more tokens than the budget, exactly up
//! to the cancelling step when cancelled, K/V bytes equal to the cost
//! formula); a too-long prompt must be refused with `PromptTooLong`.
//!
//! [`DEFAULT_GENERATIONS`] (1,000) run by default, about 40 s in a debug
//! build on 2 cores; `LCUT_SOAK=N` runs N. The figures (generations,
//! seconds, resident memory after the warm-up and at the end, threads) are
//! printed at the end.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use lcut_engine::{
    EngineError, Generation, GenerationConfig, PreparedPrompt, Sampling, Session, StopReason,
    bundled,
};
use lcut_model::{DType, Device};
use lcut_policy::PolicySpec;
use lcut_testkit::rand::rngs::StdRng;
use lcut_testkit::rand::{Rng, SeedableRng};

/// Generations run without `LCUT_SOAK`.
const DEFAULT_GENERATIONS: usize = 1000;
/// Generations before the baseline is read (allocator pools, thread pools
/// and caches settle).
const WARM_UP: usize = 50;
/// Most the resident memory may grow between the warm-up and the end.
const RSS_BOUND: u64 = 64 << 20;
const SEED: u64 = 20261126;

/// Number of generations: `LCUT_SOAK` when set to a number, else the default.
fn generations() -> usize {
    std::env::var("LCUT_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_GENERATIONS)
}

/// Resident memory of this process, bytes (`VmRSS` of /proc/self/status).
fn resident_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS line")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb * 1024)
}

/// Threads of this process (entries of /proc/self/task).
fn threads() -> Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// A random policy the 4-layer bundled model accepts.
fn policy(rng: &mut StdRng, layers: usize) -> String {
    match rng.random_range(0..4) {
        0 => "full".into(),
        1 => format!("speed:{}", rng.random_range(1..=layers)),
        2 => format!("speed:{}+bos", rng.random_range(1..=layers)),
        _ => slim_policy(rng, layers),
    }
}

/// `slim:` with 1 to L-1 increasing cuts below the depth, non-increasing
/// budgets (shares or token counts) and random block, unit, window, swap,
/// sink and score options.
fn slim_policy(rng: &mut StdRng, layers: usize) -> String {
    let mut cuts: Vec<usize> = (1..layers).filter(|_| rng.random_bool(0.5)).collect();
    if cuts.is_empty() {
        cuts.push(rng.random_range(1..layers));
    }
    let shares = rng.random_bool(0.5);
    let mut budget: u32 = if shares {
        rng.random_range(10..=100)
    } else {
        rng.random_range(1..=256)
    };
    let pairs: Vec<String> = cuts
        .iter()
        .map(|c| {
            let b = if shares {
                format!("{c}@{budget}%")
            } else {
                format!("{c}@{budget}")
            };
            budget = rng.random_range(budget.div_ceil(2).max(1)..=budget);
            b
        })
        .collect();
    let block = [1, 2, 4, 8, 16, 64][rng.random_range(0..6)];
    let divisors: Vec<usize> = (1..=block).filter(|u| block % u == 0).collect();
    let unit = divisors[rng.random_range(0..divisors.len())];
    let score = ["unit", "avg", "max"][rng.random_range(0..3)];
    format!(
        "slim:{}+block:{block}+unit:{unit}+window:{}+swap:{}+sink:{}+score:{score}",
        pairs.join(","),
        rng.random_range(1..=8),
        [0.0, 0.5, 0.9, 1.0][rng.random_range(0..4)],
        rng.random_range(0..=2),
    )
}

/// Words of the bundled model's task, some it does not know, and odd text.
const WORDS: [&str; 24] = [
    "copy",
    ":",
    "[",
    "]",
    "the",
    "of",
    "and",
    "queen",
    "ocean",
    "lantern",
    "in",
    "it",
    "was",
    "zebra",
    "violin",
    "<|eot|>",
    "<s>",
    "unknown",
    "é\u{1F389}",
    "\u{202E}rtl",
    "\t",
    "x\u{0}y",
    "12345",
    "reverse",
];

/// A random prompt of roughly `len` tokens: chat-templated text (with a
/// system message now and then) or raw ids with a random decode start.
fn prompt(rng: &mut StdRng, session: &Session, len: usize) -> Result<PreparedPrompt> {
    if rng.random_bool(0.6) {
        let text: Vec<&str> = (0..len.max(1))
            .map(|_| WORDS[rng.random_range(0..WORDS.len())])
            .collect();
        // never blank: the prompt starts with a word
        let user = format!("copy {}", text.join(" "));
        let system = rng.random_bool(0.2).then_some("copy the span");
        Ok(session.prepare_text(&user, system, rng.random_bool(0.8))?)
    } else {
        let vocab = session.model.config().vocab_size as u32;
        // two tokens at least, so that BoS can be an anchor before the decode start
        let mut ids: Vec<u32> = (0..len.max(2))
            .map(|_| rng.random_range(0..vocab))
            .collect();
        if rng.random_bool(0.7) {
            ids[0] = session.model.config().bos_token_id.unwrap_or(0);
        }
        let start = rng.random_range(1..ids.len());
        Ok(PreparedPrompt::from_ids(ids, Some(start))?)
    }
}

/// Tallies of a soak run.
#[derive(Default)]
struct Tally {
    finished: usize,
    cancelled: usize,
    refused: usize,
    tokens: usize,
}

/// One random generation; asserts what it must produce.
fn one(rng: &mut StdRng, session: &Session, tally: &mut Tally) -> Result<()> {
    let layers = session.model.config().num_layers;
    let max_positions = session.model.config().max_position_embeddings;
    let len = if rng.random_bool(0.02) {
        max_positions + rng.random_range(0..64)
    } else {
        rng.random_range(1..=300)
    };
    let prompt = prompt(rng, session, len)?;
    let text = policy(rng, layers);
    let policy = text.parse::<PolicySpec>()?.resolve(layers)?;
    let sampling = if rng.random_bool(0.5) {
        Sampling::Greedy
    } else {
        Sampling::Sample {
            temperature: rng.random_range(0.1..2.0),
            top_k: rng.random_bool(0.5).then(|| rng.random_range(1..20)),
            top_p: rng.random_bool(0.5).then(|| rng.random_range(0.1..1.0)),
            seed: rng.random(),
        }
    };
    let max_new_tokens = rng.random_range(1..=24);
    let too_long = prompt.len() + max_new_tokens > max_positions;
    let config = GenerationConfig {
        max_new_tokens,
        sampling,
        stop_tokens: if rng.random_bool(0.5) {
            session.stop_tokens()
        } else {
            Vec::new()
        },
        prefill_chunk: [1, 7, 64, 512][rng.random_range(0..4)],
    };
    let generation = match Generation::new(&session.model, prompt, policy, config) {
        Err(EngineError::PromptTooLong { .. }) if too_long => {
            tally.refused += 1;
            return Ok(());
        }
        other => other.with_context(|| format!("{text}: generation"))?,
    };
    ensure!(
        !too_long,
        "a prompt past the model's positions was accepted"
    );
    // cancel at a random step half of the time
    let cancel_at = rng
        .random_bool(0.5)
        .then(|| rng.random_range(0..max_new_tokens));
    let out = generation
        .run(|step| Some(step.index) != cancel_at)
        .with_context(|| format!("{text}: run"))?;
    let n = out.tokens.len();
    ensure!((1..=max_new_tokens).contains(&n), "{text}: {n} tokens");
    match out.stop {
        StopReason::Cancelled => {
            ensure!(cancel_at == Some(n - 1), "{text}: cancelled at {n}");
            tally.cancelled += 1;
        }
        _ => {
            ensure!(cancel_at.is_none_or(|c| c >= n), "{text}: not cancelled");
            tally.finished += 1;
        }
    }
    ensure!(
        out.kv_bytes_held == out.kv_bytes_formula,
        "{text}: held {} vs formula {}",
        out.kv_bytes_held,
        out.kv_bytes_formula
    );
    ensure!(
        out.kv_bytes_held <= out.kv_bytes_full,
        "{text}: held > full"
    );
    tally.tokens += n;
    Ok(())
}

#[test]
fn generations_leak_neither_memory_nor_threads() -> Result<()> {
    let session = Session::load(
        &bundled(lcut_engine::BUNDLED_MODEL),
        DType::F32,
        &Device::Cpu,
    )?;
    let count = generations();
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut tally = Tally::default();
    let start = Instant::now();
    let mut baseline = None;
    for i in 0..count {
        if i == WARM_UP.min(count / 2) {
            baseline = Some((resident_bytes()?, threads()?));
        }
        one(&mut rng, &session, &mut tally).with_context(|| format!("generation {i}"))?;
    }
    let (rss_before, threads_before) = baseline.context("no warm-up")?;
    let (rss_after, threads_after) = (resident_bytes()?, threads()?);
    eprintln!(
        "soak: {count} generations in {:.1} s ({} finished, {} cancelled, {} refused as too long, \
         {} tokens); RSS {:.1} MiB after warm-up, {:.1} MiB at the end; threads {threads_before} \
         then {threads_after}",
        start.elapsed().as_secs_f64(),
        tally.finished,
        tally.cancelled,
        tally.refused,
        tally.tokens,
        rss_before as f64 / (1 << 20) as f64,
        rss_after as f64 / (1 << 20) as f64,
    );
    ensure!(
        rss_after <= rss_before + RSS_BOUND,
        "resident memory grew from {rss_before} to {rss_after} bytes"
    );
    ensure!(
        threads_after == threads_before,
        "{threads_before} threads after the warm-up, {threads_after} at the end"
    );
    ensure!(tally.cancelled > 0 && tally.finished > 0);
    Ok(())
}
