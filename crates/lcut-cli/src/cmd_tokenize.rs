//! `lcut tokenize`: the ids a model's tokenizer gives a text, optionally
//! as one user message through the model's chat template. Reads only the
//! tokenizer (and the chat template and BoS id), never the weights.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use lcut_engine::PromptTokenizer;

use crate::common::{model_or_bundled, resolve_model};

/// Arguments of `lcut tokenize`.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// Model: a folder, a GGUF file, a Hugging Face cache name
    /// `ORG/NAME[@REV][:FILE]` or an Ollama name `NAME[:TAG]` (`lcut models`
    /// lists them); the bundled model by default. Only its tokenizer is read.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// TEXT is one user message, rendered with the model's chat template and
    /// its generation prompt.
    #[arg(long)]
    pub chat: bool,
    /// Show each token (id, vocabulary piece, text) before the id list.
    #[arg(long)]
    pub verbose: bool,
    /// The text to tokenize.
    pub text: String,
}

/// Print the ids, comma-separated, on the last line.
pub fn run(args: &TokenizeArgs) -> Result<()> {
    let model = resolve_model(&model_or_bundled(&args.model))?;
    let prompter = PromptTokenizer::load_format(&model.path, model.format)
        .with_context(|| format!("loading the tokenizer of {model}"))?;
    let tok = &prompter.tokenizer;
    let ids = if args.chat {
        prompter.prepare_text(&args.text, None, true)?.ids
    } else {
        tok.encode_with_special_tokens(&args.text)?
    };
    if args.verbose {
        let pieces = tok.token_pieces(&ids);
        for ((id, piece), text) in ids.iter().zip(pieces).zip(tok.token_strings(&ids)) {
            println!("{id}\t{piece:?}\t{text:?}");
        }
    }
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    println!("{}", list.join(","));
    Ok(())
}
