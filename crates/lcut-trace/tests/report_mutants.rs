//! The report schema under test: a property test (random valid reports,
//! deterministic generator, survive a write and read unchanged) and damaged
//! report.json and trace files by the thousand (JSON-aware mutants of a
//! generated report and of one trace): each must be refused with an error
//! naming the file, or read into a report or trace that validates, can be
//! used, and writes back to itself. No single allocation may pass
//! [`ALLOC_BOUND`], whatever shapes a file claims. `LCUT_MUTANTS=N` runs more.

use std::path::Path;
use std::time::Duration;

use lcut_policy::Anchors;
use lcut_testkit::alloc::{LargestAlloc, largest_allocation};
use lcut_testkit::rand::rngs::StdRng;
use lcut_testkit::rand::{Rng, SeedableRng};
use lcut_testkit::{MutantRun, json_mutants, mutant_count};
use lcut_trace::{
    CutoffAccuracy, LayerCurves, LensTrace, ModelIdentity, PolicyPoint, PromptTrace,
    Recommendation, Report, RoutingCurves, RoutingOverlap, RoutingTrace, RunSettings,
    SCHEMA_VERSION, Series, Sweep, SweepPoint, Tensor2, Tensor3, Thresholds, TraceError,
    TraceHeader, read_json, read_report_json, speed_policy, write_report_json,
};

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc;

/// No single allocation may be larger (the seeds are a few kilobytes).
const ALLOC_BOUND: usize = 16 << 20;
const DEFAULT_MUTANTS: usize = 10_000;
const SEED: u64 = 20261125;

/// A float as traces hold them: mostly in [0, 1], sometimes NaN, negative,
/// tiny or large (never infinite: JSON has no infinity, and `null` reads
/// back as NaN).
fn float(rng: &mut StdRng) -> f32 {
    match rng.random_range(0..20) {
        0 => f32::NAN,
        1 => -rng.random::<f32>(),
        2 => f32::MIN_POSITIVE,
        3 => 3.0e38,
        _ => rng.random(),
    }
}

fn series(rng: &mut StdRng, n: usize) -> Series {
    Series((0..n).map(|_| float(rng)).collect())
}

fn tensor2(rng: &mut StdRng, shape: [usize; 2]) -> Tensor2 {
    let data = (0..shape[0] * shape[1]).map(|_| float(rng)).collect();
    Tensor2::new(shape, data).expect("shape")
}

fn tensor3(rng: &mut StdRng, shape: [usize; 3]) -> Tensor3 {
    let data = (0..shape.iter().product()).map(|_| float(rng)).collect();
    Tensor3::new(shape, data).expect("shape")
}

fn text(rng: &mut StdRng) -> String {
    let pieces = [
        "a",
        "é",
        "\"",
        "\\",
        "\n",
        "\u{1F389}",
        " ",
        "<|x|>",
        "\u{0}",
    ];
    (0..rng.random_range(0..6))
        .map(|_| pieces[rng.random_range(0..pieces.len())])
        .collect()
}

/// A series of `n` entries, or none (a run without the logit lens).
fn lens_series(rng: &mut StdRng, n: usize) -> Series {
    if rng.random_bool(0.5) {
        series(rng, n)
    } else {
        Series::default()
    }
}

/// A share in `[0, 1]`, or NaN.
fn unit(rng: &mut StdRng) -> f32 {
    if rng.random_bool(0.1) {
        f32::NAN
    } else {
        rng.random()
    }
}

fn units(rng: &mut StdRng, shape: [usize; 2]) -> Tensor2 {
    let data = (0..shape[0] * shape[1]).map(|_| unit(rng)).collect();
    Tensor2::new(shape, data).expect("shape")
}

/// How a random mixture-of-experts model of `l` layers routes: experts,
/// top-k, its sparse layers and the policy compared, if any.
struct Moe {
    experts: usize,
    top_k: usize,
    layers: Vec<usize>,
    policy: Option<String>,
}

fn moe(rng: &mut StdRng, l: usize) -> Option<Moe> {
    rng.random_bool(0.4).then(|| {
        let experts = rng.random_range(1..9);
        Moe {
            experts,
            top_k: rng.random_range(1..=experts),
            layers: (0..l).filter(|_| rng.random_bool(0.7)).collect(),
            policy: rng.random_bool(0.5).then(|| text(rng)),
        }
    })
}

/// A random valid routing of `steps` decode steps under `m`.
fn routing(rng: &mut StdRng, m: &Moe, steps: usize) -> RoutingTrace {
    let n = m.layers.len();
    let mut experts = Vec::new();
    for _ in 0..n * steps {
        let mut all: Vec<u32> = (0..m.experts as u32).collect();
        for i in 0..m.top_k {
            let j = rng.random_range(i..all.len());
            all.swap(i, j);
        }
        experts.extend_from_slice(&all[..m.top_k]);
    }
    RoutingTrace {
        num_experts: m.experts,
        top_k: m.top_k,
        layers: m.layers.clone(),
        entropy: units(rng, [n, steps]),
        experts,
        overlap: m.policy.as_ref().map(|p| RoutingOverlap {
            policy: p.clone(),
            overlap: units(rng, [n, steps]),
        }),
    }
}

/// A random ascending set of layers below `l` (a hybrid model's layers
/// without attention rows), empty half the time.
fn split_layers(rng: &mut StdRng, l: usize) -> Vec<usize> {
    match rng.random_bool(0.5) {
        true => (0..l).filter(|_| rng.random_bool(0.5)).collect(),
        false => Vec::new(),
    }
}

/// A random valid trace of `l` layers and `h` heads, routed as `m` says.
fn trace(rng: &mut StdRng, index: usize, l: usize, h: usize, m: Option<&Moe>) -> PromptTrace {
    let prompt_len = rng.random_range(2..40);
    let decode_start = rng.random_range(1..prompt_len);
    let header = TraceHeader {
        index,
        id: text(rng),
        prompt_tokens: if rng.random_bool(0.5) {
            (0..prompt_len).map(|_| text(rng)).collect()
        } else {
            vec![]
        },
        prompt_len,
        decode_start,
        anchor_len: rng.random_range(0..=decode_start),
    };
    let steps = rng.random_range(0..5);
    let mut t = PromptTrace::zeroed(header, l, h, steps, rng.random_range(2..12));
    let shape = [l, steps, h];
    t.bos = tensor3(rng, shape);
    t.anchor = tensor3(rng, shape);
    t.prefill = tensor3(rng, shape);
    t.decode = tensor3(rng, shape);
    t.self_mass = tensor3(rng, shape);
    t.prefill_entropy = tensor3(rng, shape);
    t.prompt_attention = tensor2(rng, [l, t.num_bins()]);
    t.generated = (0..steps).map(|_| text(rng)).collect();
    t.generated_ids = (0..steps).map(|_| rng.random()).collect();
    let mut q = decode_start;
    t.query_positions = (0..steps)
        .map(|_| {
            q += rng.random_range(1..3);
            q - 1
        })
        .collect();
    t.curvature_prompt = series(rng, l + 1);
    t.curvature_generated = series(rng, l + 1);
    if rng.random_bool(0.5) {
        let mut lens = LensTrace::empty(l + 1, steps);
        lens.logprob = tensor2(rng, [l + 1, steps]);
        lens.rank = tensor2(rng, [l + 1, steps]);
        lens.top1 = tensor2(rng, [l + 1, steps]);
        lens.kl = tensor2(rng, [l + 1, steps]);
        lens.top_ids = (0..(l + 1) * steps).map(|_| rng.random()).collect();
        t.lens = Some(lens);
    }
    t.routing = m.map(|m| routing(rng, m, steps));
    t.state_split_layers = split_layers(rng, l);
    t
}

/// A random valid report; the property test's generator and the mutants' seed.
fn report(rng: &mut StdRng) -> Report {
    let (l, h) = (rng.random_range(1..6), rng.random_range(1..4));
    let mut index = 0;
    let moe = moe(rng, l);
    let traces = (0..rng.random_range(0..3))
        .map(|_| {
            index += rng.random_range(1..4);
            trace(rng, index, l, h, moe.as_ref())
        })
        .collect();
    let steps = rng.random_range(0..6);
    let curves = LayerCurves {
        num_layers: l,
        num_heads: h,
        bos: series(rng, l),
        anchor: series(rng, l),
        prefill: series(rng, l),
        decode: series(rng, l),
        self_mass: series(rng, l),
        sink: match moe.as_ref() {
            Some(_) => series(rng, l),
            None => Series::default(),
        },
        entropy_head_mean: series(rng, l),
        entropy_weighted: series(rng, l),
        tail_mass: series(rng, l + 1),
        curvature_prompt: series(rng, l + 1),
        curvature_generated: series(rng, l + 1),
        straightening_prompt: series(rng, l + 1),
        straightening_generated: series(rng, l + 1),
        lens_prob: lens_series(rng, l + 1),
        lens_top1: lens_series(rng, l + 1),
        lens_formed: lens_series(rng, l + 1),
        lens_kl: lens_series(rng, l + 1),
        lens_log_rank: lens_series(rng, l + 1),
        knockout_kl: lens_series(rng, l),
        knockout_top1: lens_series(rng, l),
        prefill_by_head: tensor2(rng, [l, h]),
        prefill_by_step: tensor2(rng, [l, steps]),
        routing: moe.as_ref().map(|m| RoutingCurves {
            num_experts: m.experts,
            top_k: m.top_k,
            sparse_layers: m.layers.clone(),
            tokens: rng.random_range(0..100),
            entropy: series(rng, l),
            load: tensor2(rng, [l, m.experts]),
            overlap: match m.policy {
                Some(_) => series(rng, l),
                None => Series::default(),
            },
            policy: m.policy.clone(),
        }),
        state_split_layers: split_layers(rng, l),
    };
    let vote = |rng: &mut StdRng| rng.random_bool(0.7).then(|| rng.random_range(0..=l));
    let recommendation = Recommendation {
        l_cut: rng.random_range(1..=l),
        num_layers: l,
        votes: lcut_trace::Votes {
            tail_mass: vote(rng),
            selective_band: vote(rng),
            curvature_plateau: vote(rng),
        },
        tail_mass_dropped: float(rng),
        explanation: text(rng),
    };
    let sweep = rng.random_bool(0.5).then(|| Sweep {
        context_len: rng.random_range(0..100_000),
        points: (1..=l)
            .map(|c| SweepPoint {
                policy: speed_policy(c, [Anchors::Bos, Anchors::None][rng.random_range(0..2)]),
                top1_agreement: float(rng),
                mean_kl: float(rng),
                nll: float(rng),
                kv_bytes: rng.random(),
                kv_ratio: float(rng),
                prefill_flops: rng.random::<f64>() * 1e15,
                prefill_ratio: float(rng),
                tokens: rng.random_bool(0.5).then(|| rng.random_range(0..100)),
                routing_overlap: moe.as_ref().map(|_| rng.random()),
            })
            .collect(),
        knee: vote(rng),
        policies: (0..rng.random_range(0..3))
            .map(|i| PolicyPoint {
                policy: format!("slim:{i}@25%"),
                paired_with: rng.random_bool(0.5).then(|| format!("speed:{i}+bos")),
                top1_agreement: float(rng),
                mean_kl: float(rng),
                nll: float(rng),
                kv_ratio: float(rng),
                resident_ratio: float(rng),
                prefill_ratio: float(rng),
                equal_kv_cutoff: float(rng),
                swap_rate: float(rng),
                attention_recall: (0..l).map(|_| float(rng)).collect(),
                scorer_precision: vec![float(rng)],
                counts: rng.random_bool(0.5).then(|| lcut_trace::PolicyCounts {
                    tokens: rng.random_range(0..100),
                    prompts: rng.random_range(0..10),
                    steps: rng.random_range(0..100),
                    full_kv_bytes: rng.random::<f64>() * 1e9,
                    full_prefill_flops: rng.random::<f64>() * 1e15,
                }),
            })
            .collect(),
        accuracy: (1..=l)
            .map(|c| CutoffAccuracy {
                l_cut: c,
                anchors: "bos".into(),
                correct: rng.random_range(0..10),
                n: 10,
                accuracy: float(rng),
                interval: [0.1, 0.9],
            })
            .collect(),
        suite: rng.random_bool(0.5).then(|| lcut_trace::SuiteSource {
            path: text(rng),
            hash: text(rng),
            items: rng.random_range(0..10),
            shard: rng.random_bool(0.5).then_some([0, 2]),
        }),
        prompt_shard: rng.random_bool(0.5).then_some([1, 3]),
        made_by: (0..rng.random_range(0..3))
            .map(|_| lcut_trace::MadeBy {
                build: text(rng),
                isa: text(rng),
            })
            .collect(),
    });
    Report {
        schema_version: SCHEMA_VERSION,
        tool_version: text(rng),
        model: ModelIdentity {
            path: text(rng),
            config_hash: lcut_trace::hash_bytes(text(rng).as_bytes()),
            arch: "llama".into(),
            dtype: "f32".into(),
            num_layers: l,
            num_heads: h,
            num_kv_heads: rng.random_range(1..=h),
            head_dim: rng.random_range(1..256),
            hidden_size: rng.random::<u64>() as usize,
            intermediate_size: rng.random::<u64>() as usize,
            vocab_size: rng.random::<u64>() as usize,
            sliding_window: (0..l)
                .map(|_| rng.random_bool(0.5).then(|| rng.random_range(1..4096)))
                .collect(),
            layer_flops: match rng.random_bool(0.5) {
                true => (0..l)
                    .map(|_| lcut_trace::LayerFlops {
                        token: rng.random(),
                        per_key: rng.random(),
                        kv_projection: rng.random(),
                    })
                    .collect(),
                false => Vec::new(),
            },
            adapter: None,
        },
        settings: RunSettings {
            max_new_tokens: rng.random_range(0..1000),
            prompts_file: rng.random_bool(0.5).then(|| text(rng)),
            shard: rng.random_bool(0.3).then(|| (0, rng.random_range(1..8))),
            thresholds: Thresholds {
                tail_mass_max: rng.random(),
                entropy_max: rng.random(),
                mass_min: rng.random(),
                plateau_eps: rng.random(),
                agreement_drop_max: rng.random(),
            },
            chat_template_used: rng.random(),
            max_prompt_bins: rng.random_range(2..64),
            policy: rng.random_bool(0.3).then(|| text(rng)),
            routing_policy: moe.as_ref().and_then(|m| m.policy.clone()),
        },
        traces,
        curves,
        recommendation,
        sweep,
        made_by: (0..rng.random_range(0..3))
            .map(|_| lcut_trace::MadeBy {
                build: text(rng),
                isa: text(rng),
            })
            .collect(),
    }
}

/// Equal as JSON: every number bit for bit (f32 and f64 print their
/// shortest exact form) and NaN equal to NaN (`null`), which `Report`'s own
/// `==` does not grant a NaN `tail_mass_dropped` or sweep figure.
fn same<T: serde::Serialize>(a: &T, b: &T) -> bool {
    serde_json::to_value(a).expect("JSON") == serde_json::to_value(b).expect("JSON")
}

#[test]
fn reports_survive_a_write_and_read_unchanged() {
    let dir = lcut_testkit::mutant_dir();
    let path = dir.path().join("report.json");
    let mut rng = StdRng::seed_from_u64(SEED);
    for i in 0..500 {
        let report = report(&mut rng);
        report
            .validate("generated")
            .expect("the generator makes valid reports");
        write_report_json(&path, &report).expect("write");
        let back = read_report_json(&path).expect("read");
        assert!(
            same(&back, &report),
            "report {i} (seed {SEED}) changed in a round trip"
        );
    }
}

/// Use a report that was read: what renderers and the merge do with one.
fn exercise(t: &PromptTrace) {
    let _ = t.mass_totals();
    let _ = t.entropy_normalised();
    let _ = (t.prefill_len(), t.num_bins(), t.num_steps());
    let _ = (t.bos.to_array(), t.prompt_attention.to_array());
}

fn assert_names_file(err: &TraceError, path: &Path) {
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "the error does not name the file: {msg}"
    );
}

#[test]
fn mutated_reports_never_panic() {
    let seed = serde_json::to_vec(&report(&mut StdRng::seed_from_u64(SEED + 1))).expect("JSON");
    let dir = lcut_testkit::mutant_dir();
    let path = dir.path().join("report.json");
    let count = mutant_count(DEFAULT_MUTANTS);
    let mut run = MutantRun::new("report.json", SEED);
    for (i, mutant) in json_mutants(&seed, SEED).take(count).enumerate() {
        run.check(i, &mutant, |mutant| {
            std::fs::write(&path, mutant).expect("write mutant");
            let read = match read_report_json(&path) {
                Ok(report) => {
                    report.validate("again").expect("a report read is valid");
                    report.traces.iter().for_each(exercise);
                    // written back (in memory: the atomic write syncs to disk) and read again
                    let text = serde_json::to_vec(&report).expect("encode");
                    let back: Report = serde_json::from_slice(&text).expect("decode");
                    assert!(
                        same(&back, &report),
                        "a report read does not write back to itself"
                    );
                    true
                }
                Err(e) => {
                    assert_names_file(&e, &path);
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
fn mutated_traces_never_panic() {
    let mut rng = StdRng::seed_from_u64(SEED + 2);
    // a routed trace: its routing's fields are mutated too
    let m = Moe {
        experts: 4,
        top_k: 2,
        layers: vec![0, 2],
        policy: Some("speed:2+bos".into()),
    };
    let seed = serde_json::to_vec(&trace(&mut rng, 3, 3, 2, Some(&m))).expect("JSON");
    let dir = lcut_testkit::mutant_dir();
    let path = dir.path().join("trace.json");
    let count = mutant_count(DEFAULT_MUTANTS);
    let mut run = MutantRun::new("trace", SEED);
    for (i, mutant) in json_mutants(&seed, SEED).take(count).enumerate() {
        run.check(i, &mutant, |mutant| {
            std::fs::write(&path, mutant).expect("write mutant");
            let read = match read_json::<PromptTrace>(&path, "trace") {
                Ok(t) => match t.validate(&path.display().to_string()) {
                    Ok(()) => {
                        exercise(&t);
                        let text = serde_json::to_vec(&t).expect("encode");
                        let back: PromptTrace = serde_json::from_slice(&text).expect("decode");
                        assert_eq!(back, t);
                        true
                    }
                    Err(e) => {
                        assert_names_file(&e, &path);
                        false
                    }
                },
                Err(e) => {
                    assert_names_file(&e, &path);
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
fn huge_claimed_shapes_and_counts_are_refused_unallocated() {
    let dir = lcut_testkit::mutant_dir();
    let path = dir.path().join("report.json");
    let good = report(&mut StdRng::seed_from_u64(SEED + 3));
    let doc = serde_json::to_value(&good).expect("JSON");
    let tera = serde_json::json!(1u64 << 40);
    let huge = serde_json::json!(usize::MAX);
    let three = serde_json::json!(3);
    let edits: [(&str, &[(&str, &serde_json::Value)]); 3] = [
        (
            "a 2^40 x 2^40 tensor",
            &[
                ("/curves/prefill_by_head/shape/0", &tera),
                ("/curves/prefill_by_head/shape/1", &tera),
            ],
        ),
        (
            "a tensor shape whose product overflows",
            &[
                ("/curves/prefill_by_step/shape/0", &huge),
                ("/curves/prefill_by_step/shape/1", &three),
            ],
        ),
        (
            "num_layers = usize::MAX",
            &[("/model/num_layers", &huge), ("/curves/num_layers", &huge)],
        ),
    ];
    for (what, edit) in edits {
        let mut bad = doc.clone();
        for (pointer, value) in edit {
            *bad.pointer_mut(pointer).expect("a field of the seed") = (*value).clone();
        }
        std::fs::write(&path, bad.to_string()).expect("write");
        let err = read_report_json(&path).expect_err(what);
        assert_names_file(&err, &path);
        assert!(largest_allocation() <= ALLOC_BOUND, "{what}");
    }
}

/// The model's per-layer FLOP coefficients are one per layer or none: a
/// report with another count is refused by name, not read as a model whose
/// upper layers fall back to the uniform shape.
#[test]
fn per_layer_flops_of_another_depth_are_refused() {
    let dir = lcut_testkit::mutant_dir();
    let path = dir.path().join("report.json");
    let mut r = report(&mut StdRng::seed_from_u64(SEED + 4));
    let one = lcut_trace::LayerFlops {
        token: 10,
        per_key: 4,
        kv_projection: 2,
    };
    r.model.layer_flops = vec![one; r.model.num_layers];
    write_report_json(&path, &r).expect("write");
    assert_eq!(read_report_json(&path).expect("read").model, r.model);
    r.model.layer_flops.push(one);
    std::fs::write(&path, serde_json::to_string(&r).expect("JSON")).expect("write");
    let err = read_report_json(&path).expect_err("one entry too many");
    assert_names_file(&err, &path);
    assert!(err.to_string().contains("layer_flops"), "{err}");
}
