//! Text to a prompt's token ids without the model's weights: the tokenizer,
//! the chat template and the BoS id of a model folder or a GGUF file.

use std::path::{Path, PathBuf};

use lcut_model::gguf::{GgufFile, is_gguf_path};
use lcut_model::{ModelConfig, ModelFormat};

use crate::error::{EngineError, Result};
use crate::prompt::{PreparedPrompt, common_prefix};
use crate::template::{ChatTemplate, Message};
use crate::tokenizer::TextTokenizer;

/// What turns a text into a prompt: a model's tokenizer, its chat template
/// and its BoS id, read without its weights (`lcut tokenize`).
pub struct PromptTokenizer {
    /// The tokenizer.
    pub tokenizer: TextTokenizer,
    template: Option<ChatTemplate>,
    bos_token_id: Option<u32>,
}

impl PromptTokenizer {
    /// Read the tokenizer of a model folder (`tokenizer.json`,
    /// `tokenizer_config.json` for the chat template, `config.json` for the
    /// BoS id) or of a `.gguf` file (its header's metadata; the file is
    /// memory-mapped, its tensors are never read).
    pub fn load(path: &Path) -> Result<Self> {
        let format = match is_gguf_path(path) {
            true => ModelFormat::Gguf,
            false => ModelFormat::Folder,
        };
        Self::load_format(path, format)
    }

    /// [`PromptTokenizer::load`] for a model whose format is known (a
    /// resolved model reference: a store may keep a GGUF file under a hash).
    pub fn load_format(path: &Path, format: ModelFormat) -> Result<Self> {
        let (tokenizer, bos_token_id) = if format == ModelFormat::Gguf {
            let file = GgufFile::open(path)?;
            let tokenizer = TextTokenizer::from_gguf(file.header(), path)?;
            (tokenizer, file.config().bos_token_id)
        } else {
            let tokenizer =
                TextTokenizer::from_folder(path)?.ok_or_else(|| EngineError::NoTokenizer {
                    folder: PathBuf::from(path),
                })?;
            (tokenizer, ModelConfig::from_folder(path)?.bos_token_id)
        };
        Ok(Self {
            template: chat_template(Some(&tokenizer))?,
            tokenizer,
            bos_token_id,
        })
    }

    /// Whether the model has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The prompt of `user` (and `system`), as [`crate::Session::prepare_text`]
    /// makes it.
    pub fn prepare_text(
        &self,
        user: &str,
        system: Option<&str>,
        use_template: bool,
    ) -> Result<PreparedPrompt> {
        prepare_text(
            &self.tokenizer,
            self.template.as_ref(),
            self.bos_token_id,
            (user, system),
            use_template,
        )
    }
}

/// The chat template of `tokenizer`, compiled; `None` without a tokenizer
/// or a template.
pub(crate) fn chat_template(tokenizer: Option<&TextTokenizer>) -> Result<Option<ChatTemplate>> {
    let Some(tok) = tokenizer else {
        return Ok(None);
    };
    let Some(src) = &tok.chat_template else {
        return Ok(None);
    };
    ChatTemplate::new(src, tok.bos_token.as_deref(), tok.eos_token.as_deref())
        .map(Some)
        .map_err(|reason| EngineError::Template {
            path: tok.config_path().to_path_buf(),
            reason,
        })
}

/// A text prompt (`user`, and `system` when given): through `template` when
/// there is one and `use_template` is set (decode start = first token of the
/// generation prompt), otherwise raw with `bos` prepended when the model
/// names one (decode start = last token).
pub(crate) fn prepare_text(
    tok: &TextTokenizer,
    template: Option<&ChatTemplate>,
    bos: Option<u32>,
    (user, system): (&str, Option<&str>),
    use_template: bool,
) -> Result<PreparedPrompt> {
    if user.trim().is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    match (template, use_template) {
        (Some(tmpl), true) => templated(tok, tmpl, user, system),
        _ => {
            let mut ids = tok.encode(user)?;
            if let Some(bos) = bos
                && ids.first() != Some(&bos)
            {
                ids.insert(0, bos);
            }
            PreparedPrompt::from_ids(ids, None)
        }
    }
}

/// `user` (after `system`) through the chat template with its generation
/// prompt; the decode phase starts where the rendering without it ends.
fn templated(
    tok: &TextTokenizer,
    tmpl: &ChatTemplate,
    user: &str,
    system: Option<&str>,
) -> Result<PreparedPrompt> {
    let template_err = |reason: String| EngineError::Template {
        path: tok.config_path().to_path_buf(),
        reason,
    };
    let mut messages = Vec::new();
    if let Some(sys) = system {
        messages.push(Message::new("system", sys));
    }
    messages.push(Message::new("user", user));
    let with = tok.encode(&tmpl.render(&messages, true).map_err(template_err)?)?;
    let without = tok.encode(&tmpl.render(&messages, false).map_err(template_err)?)?;
    let mut decode_start = common_prefix(&with, &without);
    if decode_start >= with.len() {
        decode_start = with.len().saturating_sub(1);
    }
    let system_len = match system {
        Some(sys) => {
            let sys_ids = tok.encode(
                &tmpl
                    .render(&[Message::new("system", sys)], false)
                    .map_err(template_err)?,
            )?;
            (common_prefix(&sys_ids, &with) == sys_ids.len()).then_some(sys_ids.len())
        }
        None => None,
    };
    Ok(PreparedPrompt {
        system_len,
        chat_template_used: true,
        ..PreparedPrompt::from_ids(with, Some(decode_start))?
    })
}
