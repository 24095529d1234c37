//! The committed task suite is exactly what `lcut suite` writes from its
//! seed, stays small, and reads back with every kind well represented.

use lcut_engine::suite::{self, SMOLLM2_SUITE, SMOLLM2_SUITE_SEED};

#[test]
fn committed_suite_is_what_the_generator_writes() {
    let path = lcut_engine::workspace_root().join(SMOLLM2_SUITE);
    let committed = std::fs::read_to_string(&path).expect("the committed suite");
    let written = suite::to_jsonl(&suite::generate(SMOLLM2_SUITE_SEED));
    assert!(
        committed == written,
        "{SMOLLM2_SUITE} differs from the generator: run `lcut suite --seed {SMOLLM2_SUITE_SEED} --out {SMOLLM2_SUITE}`"
    );
    assert!(committed.len() < 400_000, "{} bytes", committed.len());
    let items = suite::read_suite(&path).expect("the suite reads");
    assert!(items.len() >= 200);
    for kind in ["retrieval", "copy", "lookup", "choice", "arithmetic"] {
        assert!(
            items.iter().filter(|i| i.kind == kind).count() >= 40,
            "{kind}"
        );
    }
    for len in ["256", "512", "1k", "2k"] {
        for depth in ["start", "middle", "end"] {
            assert!(
                items
                    .iter()
                    .any(|i| i.length == len && i.variant.as_deref() == Some(depth))
            );
        }
    }
}

/// The suite in completion form (for base models) is the same items,
/// written by `lcut suite --form completion` from the same seed.
#[test]
fn committed_completion_suite_is_what_the_generator_writes() {
    use lcut_engine::suite::{COMPLETION_SUITE, Form};
    let path = lcut_engine::workspace_root().join(COMPLETION_SUITE);
    let committed = std::fs::read_to_string(&path).expect("the committed suite");
    let written = suite::to_jsonl(&suite::generate_in(SMOLLM2_SUITE_SEED, Form::Completion));
    assert!(
        committed == written,
        "{COMPLETION_SUITE} differs from the generator: run `lcut suite --form completion`"
    );
    assert!(committed.len() < 400_000, "{} bytes", committed.len());
    let items = suite::read_suite(&path).expect("the suite reads");
    let chat = suite::generate(SMOLLM2_SUITE_SEED);
    assert_eq!(items.len(), chat.len());
    for (k, c) in items.iter().zip(&chat) {
        assert!(k.prompt.starts_with(&c.prompt) && k.prompt.len() > c.prompt.len());
        assert_eq!((&k.id, &k.answer), (&c.id, &c.answer));
    }
}
