//! Damaged prompt sets by the thousand: mutants of the bundled JSON Lines
//! prompt set (one line damaged JSON-aware, or the file damaged byte-wise),
//! each read as a prompt set. Each must be refused with an error naming the
//! file (and the line, where one is at fault), or read into prompts that
//! are the file's lines: non-empty, ids unique, no more prompts than lines.
//! `LCUT_MUTANTS=N` runs more.

use std::time::Duration;

use lcut_engine::diagnose::read_prompt_set;
use lcut_testkit::alloc::{LargestAlloc, largest_allocation};
use lcut_testkit::rand::rngs::StdRng;
use lcut_testkit::rand::{Rng, SeedableRng};
use lcut_testkit::{JsonMutants, MutantRun, json_mutants, mutant_count, mutants, workspace_root};

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc;

/// No single allocation may be larger (the seed is 1 kB).
const ALLOC_BOUND: usize = 16 << 20;
const DEFAULT_MUTANTS: usize = 10_000;
const SEED: u64 = 20261127;

#[test]
fn mutated_prompt_sets_never_panic() {
    let good = std::fs::read(workspace_root().join("fixtures/prompts/copy.jsonl")).expect("seed");
    let lines: Vec<&[u8]> = good.split(|&b| b == b'\n').collect();
    let mut per_line: Vec<JsonMutants> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| json_mutants(l, SEED + i as u64))
        .collect();
    let mut bytes = mutants(&good, good.len(), SEED);
    let mut rng = StdRng::seed_from_u64(SEED);
    let dir = lcut_testkit::mutant_dir();
    let path = dir.path().join("prompts.jsonl");
    let mut run = MutantRun::new("prompt set", SEED);
    for i in 0..mutant_count(DEFAULT_MUTANTS) {
        let mutant = if rng.random_bool(0.7) {
            let at = rng.random_range(0..per_line.len());
            let damaged = per_line[at].next().expect("endless");
            let mut out: Vec<Vec<u8>> = lines.iter().map(|l| l.to_vec()).collect();
            out[at] = damaged;
            out.join(&b'\n')
        } else {
            bytes.next().expect("endless")
        };
        run.check(i, &mutant, |mutant| {
            std::fs::write(&path, mutant).expect("write mutant");
            let read = match read_prompt_set(&path) {
                Ok(prompts) => {
                    let text = std::str::from_utf8(mutant).expect("a set read is UTF-8");
                    assert!(!prompts.is_empty());
                    assert!(prompts.len() <= text.lines().count());
                    assert!(prompts.iter().all(|p| !p.user.trim().is_empty()));
                    let mut ids: Vec<&str> = prompts.iter().map(|p| p.id.as_str()).collect();
                    ids.sort_unstable();
                    ids.dedup();
                    assert_eq!(ids.len(), prompts.len(), "two prompts share an id");
                    true
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(&path.display().to_string()),
                        "the error does not name the file: {msg}"
                    );
                    false
                }
            };
            assert!(largest_allocation() <= ALLOC_BOUND);
            read
        });
    }
    run.finish(Duration::from_secs(5));
}

#[test]
fn duplicate_prompt_ids_are_refused_naming_the_line() {
    let dir = lcut_testkit::mutant_dir();
    let path = dir.path().join("p.jsonl");
    std::fs::write(
        &path,
        "{\"id\":\"a\",\"prompt\":\"x\"}\n{\"id\":\"b\",\"prompt\":\"y\"}\n{\"id\":\"a\",\"prompt\":\"z\"}\n",
    )
    .expect("write");
    let err = read_prompt_set(&path).expect_err("two prompts named a");
    let msg = err.to_string();
    assert!(msg.contains("line 3") && msg.contains("\"a\""), "{msg}");
    // an unnamed prompt is named by its line, which may clash too
    std::fs::write(
        &path,
        "{\"id\":\"line2\",\"prompt\":\"x\"}\n{\"prompt\":\"y\"}\n",
    )
    .expect("write");
    assert!(read_prompt_set(&path).is_err());
}
