//! A loaded model folder: decoder, tokenizer and chat template together.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use lcut_model::gguf::{GgufFile, is_gguf_path};
use lcut_model::lora::{LoraAdapter, LoraMode};
use lcut_model::{Decoder, WeightMode};
use lcut_policy::Policy;

use crate::error::{EngineError, Result};
use crate::generate::{Generation, GenerationConfig, GenerationOutput, Sampling, Step};
use crate::prompt::{PreparedPrompt, common_prefix};
use crate::template::{ChatTemplate, Message};
use crate::tokenizer::TextTokenizer;

/// What a report records of the adapter in `dir`: its files' hash (taken
/// by [`LoraAdapter::read`]), its trained-for policy, its rank and how it
/// was put in (`merge` or `fly`).
pub fn adapter_identity(
    dir: &Path,
    adapter: &LoraAdapter,
    mode: LoraMode,
) -> lcut_trace::AdapterIdentity {
    lcut_trace::AdapterIdentity {
        path: dir.display().to_string(),
        hash: adapter.hash.clone(),
        policy: adapter.config.policy.clone(),
        rank: adapter.config.r,
        mode: match mode {
            LoraMode::Merge => "merge",
            LoraMode::OnTheFly => "fly",
        }
        .into(),
    }
}

/// A model folder loaded for use.
pub struct Session {
    /// The decoder.
    pub model: Decoder,
    /// The tokenizer, when the folder has one.
    pub tokenizer: Option<TextTokenizer>,
    template: Option<ChatTemplate>,
    folder: PathBuf,
    config_hash: String,
    /// The LoRA adapter put into `model`, when there is one (reports name it
    /// in the model's identity).
    pub adapter: Option<lcut_trace::AdapterIdentity>,
}

impl Session {
    /// Load model, tokenizer and chat template from a model folder or a
    /// `.gguf` file, with weights converted to `dtype`.
    pub fn load(path: &Path, dtype: DType, device: &Device) -> Result<Self> {
        Self::load_as(path, WeightMode::Dense(dtype), device)
    }

    /// Load model, tokenizer and chat template from a model folder or a
    /// `.gguf` file, dense or with a GGUF's matrices kept quantized.
    pub fn load_as(path: &Path, mode: WeightMode, device: &Device) -> Result<Self> {
        let (model, tokenizer, config_hash) = if is_gguf_path(path) {
            // one parse of the file serves the tokenizer, the hash and the model
            let file = GgufFile::open(path)?;
            let tokenizer = TextTokenizer::from_gguf(file.header(), path)?;
            let hash = lcut_trace::hash_bytes(file.header_bytes());
            (
                Decoder::from_gguf(file, mode, device)?,
                Some(tokenizer),
                hash,
            )
        } else {
            let model = Decoder::load_as(path, mode, device)?;
            let config = path.join("config.json");
            let bytes = std::fs::read(&config).map_err(|source| lcut_model::ModelError::Io {
                path: config,
                source,
            })?;
            let hash = lcut_trace::hash_bytes(&bytes);
            (model, TextTokenizer::from_folder(path)?, hash)
        };
        let template = match &tokenizer {
            Some(tok) => match &tok.chat_template {
                Some(src) => Some(
                    ChatTemplate::new(src, tok.bos_token.as_deref(), tok.eos_token.as_deref())
                        .map_err(|reason| EngineError::Template {
                            path: tok.config_path().to_path_buf(),
                            reason,
                        })?,
                ),
                None => None,
            },
            None => None,
        };
        Ok(Self {
            model,
            tokenizer,
            template,
            folder: path.to_path_buf(),
            config_hash,
            adapter: None,
        })
    }

    /// Put the LoRA adapter in `dir` (PEFT layout) into the model, `mode`
    /// saying how, and record it for reports ([`Session::adapter`]);
    /// returns the adapter read (its trained-for policy, rank, sites).
    pub fn apply_lora(&mut self, dir: &Path, mode: LoraMode) -> Result<LoraAdapter> {
        let adapter = LoraAdapter::read(dir).map_err(lcut_model::ModelError::from)?;
        self.model.apply_lora(&adapter, mode)?;
        self.adapter = Some(adapter_identity(dir, &adapter, mode));
        Ok(adapter)
    }

    /// Hash of what describes the model: `config.json`'s bytes, or a GGUF
    /// file's header (metadata and tensor directory).
    pub fn config_hash(&self) -> &str {
        &self.config_hash
    }

    /// The model folder or GGUF file.
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// Whether the model has a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    fn tokenizer(&self) -> Result<&TextTokenizer> {
        self.tokenizer
            .as_ref()
            .ok_or_else(|| EngineError::NoTokenizer {
                folder: self.folder.clone(),
            })
    }

    /// Tokens that end a generation: the config's EoS ids and the tokenizer's EoS.
    pub fn stop_tokens(&self) -> Vec<u32> {
        let mut stops = self.model.config().eos_token_ids.clone();
        if let Some(tok) = &self.tokenizer
            && let Some(id) = tok.eos_token.as_deref().and_then(|t| tok.token_id(t))
            && !stops.contains(&id)
        {
            stops.push(id);
        }
        stops
    }

    /// The text of generated `tokens`, stop tokens left out (empty without
    /// a tokenizer).
    pub fn generated_text(&self, tokens: &[u32]) -> String {
        let stops = self.stop_tokens();
        let kept: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|t| !stops.contains(t))
            .collect();
        self.tokenizer
            .as_ref()
            .map_or_else(String::new, |tok| tok.decode(&kept))
    }

    /// Greedy generation of at most `max_new_tokens` tokens, ending at
    /// [`Session::stop_tokens`], with the default prefill chunk.
    pub fn greedy_config(&self, max_new_tokens: usize) -> GenerationConfig {
        GenerationConfig {
            max_new_tokens,
            sampling: Sampling::Greedy,
            stop_tokens: self.stop_tokens(),
            ..GenerationConfig::default()
        }
    }

    /// The greedy continuation of `prompt` under `policy`: at most
    /// `max_new_tokens` tokens ending at [`Session::stop_tokens`], the prompt
    /// prefilled `prefill_chunk` tokens at a time. `on_step` sees each token
    /// with the logits it was chosen from, and returns false to stop.
    pub fn continue_greedy(
        &self,
        prompt: &PreparedPrompt,
        policy: Policy,
        max_new_tokens: usize,
        prefill_chunk: usize,
        on_step: impl FnMut(&Step) -> bool,
    ) -> Result<GenerationOutput> {
        let config = GenerationConfig {
            prefill_chunk,
            ..self.greedy_config(max_new_tokens)
        };
        Generation::new(&self.model, prompt.clone(), policy, config)?.run(on_step)
    }

    /// Prepare a text prompt: through the chat template when the model has
    /// one and `use_template` is set (decode start = first token of the
    /// generation prompt), otherwise raw with BoS prepended when the model
    /// names one (decode start = last token).
    pub fn prepare_text(
        &self,
        user: &str,
        system: Option<&str>,
        use_template: bool,
    ) -> Result<PreparedPrompt> {
        let tok = self.tokenizer()?;
        if user.trim().is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        match (&self.template, use_template) {
            (Some(tmpl), true) => {
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
            _ => {
                let mut ids = tok.encode(user)?;
                if let Some(bos) = self.model.config().bos_token_id
                    && ids.first() != Some(&bos)
                {
                    ids.insert(0, bos);
                }
                PreparedPrompt::from_ids(ids, None)
            }
        }
    }
}
