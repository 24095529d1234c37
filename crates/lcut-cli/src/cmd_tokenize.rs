//! `lcut tokenize`: the ids a model's tokenizer gives a text, optionally
//! as one user message through the model's chat template.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::args::{DeviceArg, DtypeArg, KvDtypeArg, WeightArg};
use crate::common::open_session;

/// Arguments of `lcut tokenize`.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// Model folder or `.gguf` file (default: the bundled model).
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
    let session = open_session(
        &args.model,
        WeightArg::Dense(DtypeArg::F32),
        KvDtypeArg::Auto,
        DeviceArg::Cpu,
    )?;
    let ids = if args.chat {
        session.prepare_text(&args.text, None, true)?.ids
    } else {
        session
            .tokenizer
            .as_ref()
            .with_context(|| format!("{} has no tokenizer", session.folder().display()))?
            .encode_with_special_tokens(&args.text)?
    };
    if args.verbose
        && let Some(tok) = &session.tokenizer
    {
        let pieces = tok.token_pieces(&ids);
        for ((id, piece), text) in ids.iter().zip(pieces).zip(tok.token_strings(&ids)) {
            println!("{id}\t{piece:?}\t{text:?}");
        }
    }
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    println!("{}", list.join(","));
    Ok(())
}
