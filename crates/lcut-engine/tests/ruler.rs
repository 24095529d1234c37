//! RULER-style tasks: written from a seed the same way every time, each
//! prompt sized to its target in the model's own tokens (its prompt and
//! its task's new tokens at most the target, and within one haystack unit
//! of it: `TOLERANCE` tokens), the question and answer stem after the
//! decode start; on the bundled model's word-level tokenizer and on
//! SmolLM2's own (skipped without the model unless CI=true).

#![allow(clippy::unwrap_used)]

use lcut_engine::PromptTokenizer;
use lcut_engine::suite::{RulerOptions, RulerTask, SuiteItem, generate_ruler, to_jsonl};

/// The largest haystack unit (a QA document, a UUID needle line) is under
/// this many tokens, so a sized prompt comes at least this close.
const TOLERANCE: usize = 64;

fn bundled() -> PromptTokenizer {
    PromptTokenizer::load(&lcut_testkit::workspace_root().join("fixtures/models/copy-full"))
        .unwrap()
}

fn options(target: usize, context: usize, samples: usize, seed: u64) -> RulerOptions {
    RulerOptions {
        target,
        context,
        samples,
        seed,
        tasks: RulerTask::ALL.to_vec(),
        completion: false,
    }
}

/// Every item within the tolerance of the target, its question after the
/// decode start and its answers in its context.
fn check_sized(tok: &PromptTokenizer, items: &[SuiteItem], target: usize) {
    for it in items {
        let p = it.prepare_tokenized(tok).unwrap();
        let total = p.len() + it.max_new_tokens.unwrap();
        assert!(
            total <= target && total + TOLERANCE >= target,
            "{}: {total} tokens for a target of {target}",
            it.id
        );
        // the decode phase starts with the question's first words
        let question = it.question.as_deref().unwrap();
        let words: Vec<&str> = question.split_whitespace().take(3).collect();
        let head = tok.tokenizer.encode(&words.join(" ")).unwrap();
        assert!(p.ids[p.decode_start..].starts_with(&head), "{}", it.id);
        for a in &it.answers {
            assert!(it.prompt.contains(a.as_str()), "{}: {a}", it.id);
        }
    }
}

#[test]
fn the_same_seed_writes_the_same_items_sized_to_the_target() {
    let tok = bundled();
    let a = generate_ruler(&tok, &options(448, 512, 2, 7)).unwrap();
    assert_eq!(a.len(), 26);
    assert_eq!(
        to_jsonl(&a),
        to_jsonl(&generate_ruler(&tok, &options(448, 512, 2, 7)).unwrap())
    );
    assert_ne!(
        to_jsonl(&a),
        to_jsonl(&generate_ruler(&tok, &options(448, 512, 2, 8)).unwrap())
    );
    check_sized(&tok, &a, 448);
    // a task's items do not depend on the other tasks asked for
    let only_vt = RulerOptions {
        tasks: vec![RulerTask::Vt],
        ..options(448, 512, 2, 7)
    };
    let vt = generate_ruler(&tok, &only_vt).unwrap();
    let in_all: Vec<&SuiteItem> = a.iter().filter(|i| i.kind == "vt").collect();
    assert_eq!(vt.iter().collect::<Vec<_>>(), in_all);
}

#[test]
fn completion_form_ends_the_question_in_the_answer_stem() {
    let tok = bundled();
    let opts = RulerOptions {
        completion: true,
        tasks: vec![RulerTask::NiahSingle1],
        ..options(448, 512, 1, 3)
    };
    let items = generate_ruler(&tok, &opts).unwrap();
    assert!(items[0].completion);
    let p = items[0].prepare_tokenized(&tok).unwrap();
    assert!(!p.chat_template_used);
    // the prompt ends in the answer stem (`... mentioned in the provided text is`)
    let stem = tok.tokenizer.encode("provided text is").unwrap();
    assert!(p.ids.ends_with(&stem));
    check_sized(&tok, &items, 448);
}

#[test]
fn on_smollm2_every_task_fits_1k_and_4k_in_its_own_tokens() {
    let Some(model) = lcut_testkit::real_model() else {
        return;
    };
    let tok = PromptTokenizer::load(&model).unwrap();
    for target in [1024, 4096] {
        let items = generate_ruler(&tok, &options(target, 8192, 2, 1)).unwrap();
        assert_eq!(items.len(), 26);
        check_sized(&tok, &items, target);
        for it in &items {
            assert!(!it.completion, "SmolLM2 has a chat template");
        }
    }
}
