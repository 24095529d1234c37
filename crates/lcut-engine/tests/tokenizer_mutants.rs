//! Damaged tokenizers and chat templates by the thousand: JSON-aware mutants
//! of the bundled model's `tokenizer.json` and `tokenizer_config.json`, and
//! byte-level mutants of its Jinja chat template, and byte-level mutants of
//! a Gemma 4 GGUF vocabulary (`tokenizer.ggml.model = gemma4`). Each must
//! load (and then
//! encode, decode and render) or be refused with an error naming the file,
//! never panic; a template must stop within its fuel. No single allocation
//! may pass [`ALLOC_BOUND`]. `LCUT_MUTANTS=N` runs more.

use std::path::Path;
use std::time::{Duration, Instant};

use lcut_engine::{ChatTemplate, Message, TextTokenizer};
use lcut_model::gguf::GgufHeader;
use lcut_testkit::alloc::{LargestAlloc, largest_allocation};
use lcut_testkit::{MutantRun, json_mutants, mutant_count, mutants, oracle_case, workspace_root};

#[global_allocator]
static ALLOC: LargestAlloc = LargestAlloc;

/// No single allocation may be larger (minijinja itself allows a repeated
/// string of 100 MB; the seeds are a few kilobytes).
const ALLOC_BOUND: usize = 128 << 20;
const DEFAULT_MUTANTS: usize = 10_000;
const SEED: u64 = 20261126;
/// A template past its fuel stops well within this.
const SLOWEST: Duration = Duration::from_secs(5);

fn bundled() -> std::path::PathBuf {
    workspace_root().join("fixtures/models/copy-full")
}

/// A folder with the bundled tokenizer files.
fn folder() -> tempfile::TempDir {
    let dir = lcut_testkit::mutant_dir();
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(bundled().join(name), dir.path().join(name)).expect("copy");
    }
    dir
}

fn messages() -> Vec<Message> {
    vec![
        Message::new("system", "be brief"),
        Message::new("user", "copy : a [ castle eagle ] b"),
    ]
}

/// Use a tokenizer that loaded: encode, decode, name tokens, render its
/// template. Errors are allowed (with the file named); panics are not.
fn exercise(t: &TextTokenizer) {
    let text = "copy : with [ castle eagle ] <|user|> é \u{0} ";
    if let Ok(ids) = t.encode(text) {
        let _ = t.decode(&ids);
        let _ = t.token_strings(&ids);
        let _ = t.token_pieces(&ids);
    }
    let _ = t.encode_with_special_tokens(text);
    let _ = t.token_strings(&[0, 1, u32::MAX]);
    if let Some(source) = &t.chat_template {
        render(source, t.bos_token.as_deref(), t.eos_token.as_deref());
    }
}

/// Compile and render a template; an error must be a message, a render
/// must finish in bounded time.
fn render(source: &str, bos: Option<&str>, eos: Option<&str>) -> bool {
    let start = Instant::now();
    let ok = match ChatTemplate::new(source, bos, eos) {
        Ok(t) => {
            let a = t.render(&messages(), true);
            let b = t.render(&messages(), false);
            if let Err(e) = a.as_ref().and(b.as_ref()) {
                assert!(!e.is_empty());
            }
            a.is_ok() && b.is_ok()
        }
        Err(e) => {
            assert!(!e.is_empty());
            false
        }
    };
    assert!(
        start.elapsed() < SLOWEST,
        "a template ran {:?}",
        start.elapsed()
    );
    ok
}

fn check_file(dir: &Path, name: &str, mutant: &[u8]) -> bool {
    std::fs::write(dir.join(name), mutant).expect("write mutant");
    let loaded = match TextTokenizer::from_folder(dir) {
        Ok(Some(t)) => {
            exercise(&t);
            true
        }
        Ok(None) => panic!("the tokenizer went missing"),
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(name), "the error does not name {name}: {msg}");
            false
        }
    };
    assert!(largest_allocation() <= ALLOC_BOUND);
    loaded
}

fn mutate_file(name: &str, seed: u64) {
    let dir = folder();
    let good = std::fs::read(bundled().join(name)).expect("fixture");
    let mut run = MutantRun::new(name, seed);
    for (i, mutant) in json_mutants(&good, seed)
        .take(mutant_count(DEFAULT_MUTANTS))
        .enumerate()
    {
        run.check(i, &mutant, |m| check_file(dir.path(), name, m));
    }
    run.finish(SLOWEST);
}

#[test]
fn mutated_tokenizer_json_never_panics() {
    mutate_file("tokenizer.json", SEED);
}

#[test]
fn mutated_tokenizer_config_never_panics() {
    mutate_file("tokenizer_config.json", SEED + 1);
}

#[test]
fn mutated_chat_templates_never_panic_or_hang() {
    let t = TextTokenizer::from_folder(&bundled())
        .expect("loads")
        .expect("has a tokenizer");
    let source = t.chat_template.clone().expect("has a template");
    let mut run = MutantRun::new("chat template", SEED + 2);
    for (i, mutant) in mutants(source.as_bytes(), source.len(), SEED + 2)
        .take(mutant_count(DEFAULT_MUTANTS))
        .enumerate()
    {
        run.check(i, &mutant, |m| {
            let text = String::from_utf8_lossy(m);
            render(&text, t.bos_token.as_deref(), t.eos_token.as_deref())
        });
    }
    run.finish(SLOWEST);
}

#[test]
fn an_endless_template_in_tokenizer_config_is_a_named_error_in_bounded_time() {
    let dir = folder();
    let config = serde_json::json!({
        "bos_token": "<s>",
        "chat_template": "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}",
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("write");
    let t = TextTokenizer::from_folder(dir.path())
        .expect("loads")
        .expect("has a tokenizer");
    let template = ChatTemplate::new(t.chat_template.as_deref().expect("template"), None, None)
        .expect("compiles");
    let start = Instant::now();
    let err = template
        .render(&messages(), true)
        .expect_err("runs out of fuel");
    assert!(err.contains("fuel"), "{err}");
    assert!(start.elapsed() < SLOWEST, "took {:?}", start.elapsed());
}

/// A Gemma 4 GGUF vocabulary (`fixtures/oracle/gemma4-vocab/vocab.gguf`:
/// tokens, types, merges, special ids, all header) damaged byte by byte:
/// its tokenizer is built and used, or refused with an error naming the
/// file; never a panic.
#[test]
fn mutated_gemma4_gguf_vocabularies_never_panic() {
    let path = oracle_case("gemma4-vocab").join("vocab.gguf");
    let good = std::fs::read(&path).expect("fixture");
    let shown = Path::new("vocab.gguf");
    let mut run = MutantRun::new("gemma4 vocab.gguf", SEED + 2);
    for (i, mutant) in mutants(&good, good.len(), SEED + 2)
        .take(mutant_count(DEFAULT_MUTANTS))
        .enumerate()
    {
        run.check(i, &mutant, |m| {
            let Ok(header) = GgufHeader::parse(m, shown) else {
                return false;
            };
            let loaded = match TextTokenizer::from_gguf(&header, shown) {
                Ok(t) => {
                    exercise(&t);
                    true
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("vocab.gguf"),
                        "the error does not name the file: {msg}"
                    );
                    false
                }
            };
            assert!(largest_allocation() <= ALLOC_BOUND);
            loaded
        });
    }
    run.finish(SLOWEST);
}
