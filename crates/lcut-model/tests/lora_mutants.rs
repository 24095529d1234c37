//! Damaged LoRA adapters by the thousand: deterministic mutants of two
//! adapter folders for the llama-gqa reference case, the one Python `peft`
//! wrote (`fixtures/oracle/lora/adapter`: seven modules of layers 1 and 4,
//! rsLoRA) and one lcut writes (`all-linear`, with `lcut_policy` and the
//! base's fingerprint). Both files are damaged: `adapter_config.json` by
//! JSON-aware mutants (wrong types, huge, negative and non-finite numbers,
//! duplicated, missing and renamed keys, invalid UTF-8, deep nesting,
//! truncation at every token), `adapter_model.safetensors` by byte damage,
//! header damage with the length prefix kept consistent, and cuts at every
//! boundary of its header and tensors. Each folder is read
//! (`LoraAdapter::read`) and, when it reads, put into the model
//! (`Decoder::apply_lora`, merged or on the fly in turn) and run.
//!
//! Each must be refused with an error naming the adapter's file, or load
//! correctly: every pair has the config's rank, a model it was put into
//! runs, and an adapter that reads back as the seed's (same config, same
//! matrices) gives the seed's logits exactly. No single allocation may pass
//! [`ALLOC_BOUND`] (64 MiB, as for model files), whatever a file claims.
//! `LCUT_MUTANTS=N` runs N per file.

use std::path::Path;
use std::time::Duration;

use lcut_model::lora::{
    CONFIG_FILE, LoraAdapter, LoraError, LoraMode, Targets, WEIGHTS_FILE, write_adapter,
};
use lcut_model::{DType, Decoder, Device, ModelError};
use lcut_testkit::alloc::{LargestAlloc, largest_allocation};
use lcut_testkit::{MutantRun, json_mutants, mutant_count, oracle_case, safetensors_mutants};

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc;

/// No single allocation may be larger (the adapters are 21 kB, the model
/// 1.2 MB; a header may claim terabytes).
const ALLOC_BOUND: usize = 64 << 20;
const DEFAULT_MUTANTS: usize = 10_000;
const SEED: u64 = 20261127;
const CASE: &str = "llama-gqa";
const IDS: [u32; 3] = [1, 5, 9];
/// No single mutant may take longer than this (a near hang).
const SLOWEST: Duration = Duration::from_secs(5);

/// A seed adapter: its two files, what it reads as, and the logits of the
/// base model with it merged.
struct Seed {
    name: &'static str,
    config: Vec<u8>,
    weights: Vec<u8>,
    adapter: LoraAdapter,
    logits: Vec<f32>,
}

fn base() -> Decoder {
    Decoder::load(&oracle_case(CASE), DType::F32, &Device::Cpu).expect("the base model")
}

fn logits(model: &Decoder) -> lcut_model::Result<Vec<f32>> {
    Ok(model
        .teacher_forced_logits(&IDS, None)?
        .flatten_all()?
        .to_vec1()?)
}

fn seed(name: &'static str, folder: &Path, model: &Decoder) -> Seed {
    let adapter = LoraAdapter::read(folder).expect("the seed adapter reads");
    let mut adapted = model.clone();
    adapted
        .apply_lora(&adapter, LoraMode::Merge)
        .expect("the seed adapter applies");
    Seed {
        name,
        config: std::fs::read(folder.join(CONFIG_FILE)).expect("seed config"),
        weights: std::fs::read(folder.join(WEIGHTS_FILE)).expect("seed weights"),
        adapter,
        logits: logits(&adapted).expect("the adapted seed runs"),
    }
}

/// The two seeds: peft's fixture, and the same matrices written by lcut as
/// an `all-linear` adapter that records its policy and the base's fingerprint.
fn seeds(model: &Decoder) -> (Vec<Seed>, tempfile::TempDir) {
    let peft_dir = oracle_case("lora").join("adapter");
    let peft = seed("peft adapter", &peft_dir, model);
    let written = lcut_testkit::mutant_dir();
    let mut config = peft.adapter.config.clone();
    config.targets = Targets::AllLinear;
    config.use_rslora = false;
    config.policy = Some("speed:4+bos".into());
    config.base_fingerprint = Some(model.lora_fingerprint().expect("fingerprint"));
    write_adapter(written.path(), &config, &peft.adapter.pairs).expect("write the lcut seed");
    let lcut = seed("lcut adapter", written.path(), model);
    (vec![peft, lcut], written)
}

/// The matrices of two adapters are the same, bit for bit.
fn same_pairs(a: &LoraAdapter, b: &LoraAdapter) -> bool {
    let bits = |t: &lcut_model::Tensor| -> Option<Vec<u32>> {
        let v: Vec<f32> = t.flatten_all().ok()?.to_vec1().ok()?;
        Some(v.into_iter().map(f32::to_bits).collect())
    };
    a.pairs.len() == b.pairs.len()
        && a.pairs.iter().zip(&b.pairs).all(|((sa, pa), (sb, pb))| {
            sa == sb
                && pa.a.dims() == pb.a.dims()
                && pa.b.dims() == pb.b.dims()
                && bits(&pa.a) == bits(&pb.a)
                && bits(&pa.b) == bits(&pb.b)
        })
}

/// An error that names the adapter's folder, not a bare backend error.
fn assert_named(msg: &str, bare: bool, dir: &Path) {
    assert!(!bare, "a bare backend error, naming no file: {msg}");
    assert!(
        msg.contains(&dir.display().to_string()),
        "the error does not name the adapter's file: {msg}"
    );
}

/// Read the adapter in `dir`, put it into `model` by `mode` and run it;
/// true when it loaded, false when it was refused with a named error.
fn check_folder(dir: &Path, model: &Decoder, seed: &Seed, mode: LoraMode) -> bool {
    let loaded = match LoraAdapter::read(dir) {
        Err(e) => {
            assert_named(&e.to_string(), matches!(e, LoraError::Candle(_)), dir);
            false
        }
        Ok(adapter) => {
            let r = adapter.config.r;
            for pair in adapter.pairs.values() {
                assert_eq!(pair.a.dims()[0], r, "lora_A's rank is not r");
                assert_eq!(pair.b.dims()[1], r, "lora_B's rank is not r");
            }
            let mut adapted = model.clone();
            match adapted.apply_lora(&adapter, mode) {
                Err(e) => {
                    let bare = match &e {
                        ModelError::Candle(_) => true,
                        ModelError::Lora(l) => matches!(**l, LoraError::Candle(_)),
                        _ => false,
                    };
                    assert_named(&e.to_string(), bare, dir);
                    false
                }
                Ok(()) => {
                    let got = logits(&adapted).expect("an adapted model runs");
                    assert_eq!(got.len(), seed.logits.len());
                    if adapter.config == seed.adapter.config && same_pairs(&adapter, &seed.adapter)
                    {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        if mode == LoraMode::Merge {
                            assert_eq!(bits(&got), bits(&seed.logits), "the seed's adapter");
                        } else {
                            // on the fly adds the same product in another order
                            for (g, w) in got.iter().zip(&seed.logits) {
                                assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
                            }
                        }
                    }
                    true
                }
            }
        }
    };
    assert!(
        largest_allocation() <= ALLOC_BOUND,
        "an allocation of {} bytes",
        largest_allocation()
    );
    loaded
}

/// Runs `LCUT_MUTANTS` (10,000) mutants of one file (`file`) of the
/// seeds, split evenly between them; `stream` makes a seed's mutants of
/// that file.
fn run_mutants(
    file: &str,
    stream: impl for<'s> Fn(&'s Seed) -> Box<dyn Iterator<Item = Vec<u8>> + 's>,
) {
    let model = base();
    let (seeds, _written) = seeds(&model);
    let dir = lcut_testkit::mutant_dir();
    let count = mutant_count(DEFAULT_MUTANTS);
    let per_seed = count.div_ceil(seeds.len());
    let mut run = MutantRun::new(file, SEED);
    let mut i = 0;
    for seed in &seeds {
        std::fs::write(dir.path().join(CONFIG_FILE), &seed.config).expect("config");
        std::fs::write(dir.path().join(WEIGHTS_FILE), &seed.weights).expect("weights");
        for mutant in stream(seed).take(per_seed) {
            let mode = [LoraMode::Merge, LoraMode::OnTheFly][i % 2];
            run.check(i, &mutant, |mutant| {
                std::fs::write(dir.path().join(file), mutant).expect("write mutant");
                check_folder(dir.path(), &model, seed, mode)
            });
            i += 1;
        }
    }
    assert!(run.finish(SLOWEST) >= count);
}

#[test]
fn mutated_adapter_configs_never_panic() {
    run_mutants(CONFIG_FILE, |s| Box::new(json_mutants(&s.config, SEED)));
}

#[test]
fn mutated_adapter_weights_never_panic() {
    run_mutants(WEIGHTS_FILE, |s| {
        Box::new(safetensors_mutants(&s.weights, SEED))
    });
}

#[test]
fn the_seeds_load_and_differ_from_the_base() {
    let model = base();
    let (seeds, _dir) = seeds(&model);
    let plain = logits(&model).expect("the base runs");
    for s in &seeds {
        assert_ne!(s.logits, plain, "{}: the adapter changes nothing", s.name);
        assert!(!s.adapter.pairs.is_empty(), "{}", s.name);
    }
}
