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

    /// A prompt in two parts, as [`crate::Session::prepare_split`] makes it.
    pub fn prepare_split(
        &self,
        parts: SplitPrompt<'_>,
        use_template: bool,
    ) -> Result<PreparedPrompt> {
        prepare_split(
            &self.tokenizer,
            self.template.as_ref(),
            self.bos_token_id,
            parts,
            use_template,
        )
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

/// A prompt in two parts, as kvpress's pipeline and RULER's tasks split it:
/// the context, which a policy may compress, before the decode start; the
/// question and the answer stem after it, in the decode phase (at full
/// depth under SPEED, never compressed by a press).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitPrompt<'a> {
    /// The context (the user message's first part).
    pub context: &'a str,
    /// The question that follows it in the user message.
    pub question: &'a str,
    /// The start of the answer, after the generation prompt (chat) or after
    /// the question and a newline (completion); may be empty.
    pub answer_prefix: &'a str,
    /// A system message (the model's default when absent).
    pub system: Option<&'a str>,
}

/// Stands for the question while the chat template renders the context;
/// the rendering is cut here (kvpress cuts at a run of `#`).
const QUESTION_MARK: &str = "\u{1}lcut-question\u{1}";

/// A prompt in two parts, the context and the question tokenized apart (as
/// kvpress does) and joined, the decode start at the question's first
/// token. With a chat template (and `use_template`): the template's
/// rendering of one user message (after `system`), cut where the question
/// goes; the question, the rest of the rendering (end of turn, generation
/// prompt) and the answer stem follow. Without: BoS (when the model names
/// one) and the context; then the question, a newline and the answer stem.
pub(crate) fn prepare_split(
    tok: &TextTokenizer,
    template: Option<&ChatTemplate>,
    bos: Option<u32>,
    parts: SplitPrompt<'_>,
    use_template: bool,
) -> Result<PreparedPrompt> {
    if parts.context.trim().is_empty() || parts.question.trim().is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let template_err = |reason: String| EngineError::Template {
        path: tok.config_path().to_path_buf(),
        reason,
    };
    let (mut ids, tail, system_len) = match (template, use_template) {
        (Some(tmpl), true) => {
            let mut messages = Vec::new();
            if let Some(sys) = parts.system {
                messages.push(Message::new("system", sys));
            }
            let user = format!("{}{QUESTION_MARK}", parts.context);
            messages.push(Message::new("user", &user));
            let rendered = tmpl.render(&messages, true).map_err(template_err)?;
            let Some((head, tail)) = rendered.split_once(QUESTION_MARK) else {
                return Err(template_err(
                    "the rendering does not keep the user message whole, so the question \
                     cannot be put after the context"
                        .into(),
                ));
            };
            let ids = tok.encode(head)?;
            let system_len = match parts.system {
                Some(sys) => {
                    let sys_ids = tok.encode(
                        &tmpl
                            .render(&[Message::new("system", sys)], false)
                            .map_err(template_err)?,
                    )?;
                    (common_prefix(&sys_ids, &ids) == sys_ids.len()).then_some(sys_ids.len())
                }
                None => None,
            };
            (
                ids,
                format!("{}{tail}{}", parts.question, parts.answer_prefix),
                system_len,
            )
        }
        _ => {
            let mut ids = tok.encode(parts.context)?;
            if let Some(bos) = bos
                && ids.first() != Some(&bos)
            {
                ids.insert(0, bos);
            }
            let tail = format!("{}\n{}", parts.question, parts.answer_prefix);
            (ids, tail, None)
        }
    };
    let decode_start = ids.len();
    ids.extend(tok.encode(&tail)?);
    Ok(PreparedPrompt {
        system_len,
        chat_template_used: template.is_some() && use_template,
        ..PreparedPrompt::from_ids(ids, Some(decode_start))?
    })
}
