//! `lcut eval`'s suite run on the real model (SmolLM2-135M-Instruct), on a
//! handful of short items of the committed suite: the full model answers
//! them, SPEED at 22 of 30 holds less K/V, and its quality against full is
//! measured teacher-forced. Skips without the model outside CI.

use lcut_engine::Session;
use lcut_engine::suite::{self, SMOLLM2_SUITE, SuiteEvalOptions};
use lcut_model::{DType, Device};
use lcut_testkit::real_model;

#[test]
fn a_few_suite_items_under_full_and_speed() {
    let Some(model) = real_model() else { return };
    let session = Session::load(&model, DType::F32, &Device::Cpu).unwrap();
    let all = suite::read_suite(&lcut_engine::workspace_root().join(SMOLLM2_SUITE)).unwrap();
    let ids = [
        "retrieval-256-end-00",
        "copy-00",
        "choice-00",
        "arithmetic-00",
    ];
    let items: Vec<_> = ids
        .iter()
        .map(|id| all.iter().find(|i| i.id == *id).unwrap().clone())
        .collect();
    let opts = SuiteEvalOptions {
        policies: vec!["full".into(), "speed:22+bos".into()],
        max_new_tokens: 20,
        ..SuiteEvalOptions::default()
    };
    let mut seen = 0;
    let out = suite::evaluate_suite(&session, None, &items, &opts, &mut |rs| {
        assert_eq!(rs.len(), 2);
        seen += 1;
    })
    .unwrap();
    assert_eq!(seen, items.len());
    let (full, speed) = (&out[0], &out[1]);
    // the full model is good at these kinds (fixtures/suites/README.md)
    assert!(full[0].correct, "{:?}", full[0].full_generation);
    assert!(full.iter().filter(|r| r.correct).count() >= 2);
    for (f, s) in full.iter().zip(speed) {
        assert_eq!((f.agree, f.kl_sum), (f.forced_tokens, 0.0));
        assert_eq!(s.full_correct, f.correct);
        assert_eq!(s.forced_tokens, f.forced_tokens);
        assert!(s.agree <= s.forced_tokens && s.kl_sum >= 0.0);
        assert!(s.kv_bytes_held < s.kv_bytes_full, "{}", s.id);
    }
    let scores = suite::summarize(speed);
    assert!(scores[0].kv_ratio > 0.5 && scores[0].kv_ratio < 1.0);
    // the calibration's shortcut (one full prefill reused for every cutoff)
    // answers as the policies' own runs do
    let cut_opts = suite::CutoffEvalOptions {
        cuts: vec![22, 30],
        anchors: vec![lcut_policy::Anchors::Bos],
        max_new_tokens: 20,
        prefill_chunk: 512,
        shard: None,
        memory_budget: None,
    };
    let by_cut = suite::accuracy_by_cutoff(&session, &items, &cut_opts, &mut |_, _| true).unwrap();
    let count = |rs: &[suite::ItemResult]| rs.iter().filter(|r| r.correct).count();
    assert_eq!((by_cut[0].l_cut, by_cut[0].correct), (22, count(speed)));
    assert_eq!((by_cut[1].l_cut, by_cut[1].correct), (30, count(full)));
    assert!(suite::smallest_cut_within(&by_cut, 0.02).is_some());
}

/// The SPEED-aware adapter the project ships for SmolLM2: it says which
/// policy it was trained for, and under that policy it brings the model
/// back toward the full model it was distilled from (teacher-forced top-1
/// agreement up, KL down on suite items none of its prompts came from).
#[test]
fn the_shipped_adapter_brings_speed_back_toward_the_full_model() {
    let Some(model) = real_model() else { return };
    let root = lcut_engine::workspace_root();
    let base = Session::load(&model, DType::F32, &Device::Cpu).unwrap();
    let mut adapted = Session::load(&model, DType::F32, &Device::Cpu).unwrap();
    let used = adapted
        .put_adapter(
            &root.join("fixtures/adapters/smollm2-speed22-bos"),
            lcut_model::lora::LoraMode::Merge,
            &["speed:22+bos".into()],
        )
        .unwrap();
    assert_eq!(used.identity.policy.as_deref(), Some("speed:22+bos"));
    assert!(used.warnings.is_empty(), "{:?}", used.warnings);
    let all = suite::read_suite(&root.join(SMOLLM2_SUITE)).unwrap();
    let items: Vec<_> = ["copy-01", "lookup-00", "choice-01", "arithmetic-01"]
        .iter()
        .map(|id| all.iter().find(|i| i.id == *id).unwrap().clone())
        .collect();
    let opts = SuiteEvalOptions {
        policies: vec!["speed:22+bos".into()],
        max_new_tokens: 16,
        ..SuiteEvalOptions::default()
    };
    let plain = suite::evaluate_suite(&base, None, &items, &opts, &mut |_| {}).unwrap();
    let with = suite::evaluate_suite(&adapted, Some(&base), &items, &opts, &mut |_| {}).unwrap();
    let total = |rs: &[suite::ItemResult]| -> (usize, usize, f64) {
        rs.iter().fold((0, 0, 0.0), |(a, n, kl), r| {
            (a + r.agree, n + r.forced_tokens, kl + r.kl_sum)
        })
    };
    let (agree_plain, n_plain, kl_plain) = total(&plain[0]);
    let (agree_with, n_with, kl_with) = total(&with[0]);
    assert_eq!(
        n_plain, n_with,
        "both are forced on the full model's tokens"
    );
    assert!(
        agree_with > agree_plain && kl_with < kl_plain,
        "adapter: {agree_with}/{n_with} agree, KL {kl_with:.2}; \
         without: {agree_plain}/{n_plain}, KL {kl_plain:.2}"
    );
}
