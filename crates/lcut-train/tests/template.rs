//! The chat template in `tokenizer_config.json`, rendered with minijinja the
//! way Hugging Face renders it, and tokenised with `tokenizer.json`, gives
//! exactly the ids the trainer trains on.

use anyhow::{Context, Result, ensure};
use lcut_train::task::{Instance, Stream, TaskKind, TaskSpec};
use lcut_train::vocab::{self, id};
use minijinja::{Environment, context};
use tokenizers::Tokenizer;

struct Files {
    tokenizer: Tokenizer,
    template: String,
    bos: String,
    eos: String,
}

fn files() -> Result<Files> {
    let dir = tempfile::tempdir()?;
    let tok_path = dir.path().join("tokenizer.json");
    std::fs::write(&tok_path, vocab::tokenizer_json().to_string())?;
    let tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let cfg = vocab::tokenizer_config_json();
    let field = |name: &str| -> Result<String> {
        cfg[name]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("tokenizer_config.json has no string {name}"))
    };
    Ok(Files {
        tokenizer,
        template: field("chat_template")?,
        bos: field("bos_token")?,
        eos: field("eos_token")?,
    })
}

fn render(f: &Files, messages: minijinja::Value, add_generation_prompt: bool) -> Result<String> {
    let mut env = Environment::new();
    env.add_template("chat", &f.template)?;
    Ok(env.get_template("chat")?.render(context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => f.bos.clone(),
        eos_token => f.eos.clone(),
    })?)
}

fn encode(f: &Files, text: &str) -> Result<Vec<u32>> {
    Ok(f.tokenizer
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .get_ids()
        .to_vec())
}

#[test]
fn template_and_tokenizer_give_the_training_ids() -> Result<()> {
    let f = files()?;
    ensure!(f.bos == vocab::BOS && f.eos == vocab::EOT);
    let spec = TaskSpec {
        tasks: vec![TaskKind::Copy, TaskKind::Reverse],
        ..TaskSpec::default()
    };
    for i in 0..50 {
        let inst = Instance::generate(&spec, 3, Stream::Eval, i);
        let user = context! { role => "user", content => inst.user_content.clone() };
        let with_gen = render(&f, vec![user.clone()].into(), true)?;
        ensure!(with_gen == vocab::render_prompt(&inst.user_content));
        let ids = encode(&f, &with_gen)?;
        ensure!(
            ids == inst.prompt,
            "{with_gen:?}\n  -> {ids:?}\n  trainer {:?}",
            inst.prompt
        );
        // The generation prompt adds exactly the assistant marker: the decode start s.
        let without = encode(&f, &render(&f, vec![user.clone()].into(), false)?)?;
        ensure!(without.len() + 1 == ids.len() && ids.starts_with(&without));
        ensure!(ids[without.len()] == id::ASSISTANT && without.len() == inst.decode_start());
        // A finished conversation renders as the whole training sequence.
        let assistant = context! { role => "assistant", content => inst.answer_content() };
        let full = encode(&f, &render(&f, vec![user, assistant].into(), false)?)?;
        ensure!(full == inst.sequence(), "{full:?} vs {:?}", inst.sequence());
        // Decoding the answer ids gives the assistant's text back.
        let answer = &inst.answer[..inst.answer.len() - 1];
        let text = f
            .tokenizer
            .decode(answer, true)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        ensure!(text == inst.answer_content(), "{text:?}");
    }
    Ok(())
}
