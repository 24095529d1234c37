//! A loaded model folder: decoder, tokenizer and chat template together.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use lcut_model::{Decoder, ModelFiles, ResolvedModel, WeightMode};
use lcut_policy::Policy;

use crate::error::{EngineError, Result};
use crate::generate::{Generation, GenerationConfig, GenerationOutput, Sampling, Step};
use crate::prompt::PreparedPrompt;
use crate::template::ChatTemplate;
use crate::text_prompt::{SplitPrompt, chat_template, prepare_split, prepare_text};
use crate::tokenizer::TextTokenizer;

/// A model folder loaded for use.
pub struct Session {
    /// The decoder.
    pub model: Decoder,
    /// The tokenizer, when the folder has one.
    pub tokenizer: Option<TextTokenizer>,
    template: Option<ChatTemplate>,
    folder: PathBuf,
    name: String,
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
        Self::from_files(path, ModelFiles::open(path)?, mode, device)
    }

    /// Load a resolved model reference (a path, a hub cache name or an
    /// Ollama name, see [`lcut_model::store::resolve`]) in the format the
    /// resolver found.
    pub fn load_resolved(model: &ResolvedModel, mode: WeightMode, device: &Device) -> Result<Self> {
        let files = ModelFiles::open_format(&model.path, model.format)?;
        Self::load_resolved_files(model, files, mode, device)
    }

    /// [`Session::load_resolved`] from the model's files already opened
    /// (a caller that sized the run from them first).
    pub fn load_resolved_files(
        model: &ResolvedModel,
        files: ModelFiles,
        mode: WeightMode,
        device: &Device,
    ) -> Result<Self> {
        let mut session = Self::from_files(&model.path, files, mode, device)?;
        session.name = model.name();
        Ok(session)
    }

    /// Load model, tokenizer and chat template from a model's opened files
    /// (whose kind is decided: a resolver that knows a file is a GGUF under
    /// another name opens it as one); `path` names the model in messages.
    pub fn from_files(
        path: &Path,
        files: ModelFiles,
        mode: WeightMode,
        device: &Device,
    ) -> Result<Self> {
        // one opening of the files serves the tokenizer, the hash and the model
        let (tokenizer, config_hash) = match &files {
            ModelFiles::Gguf(file) => (
                Some(TextTokenizer::from_gguf(file.header(), path)?),
                lcut_trace::hash_bytes(file.header_bytes()),
            ),
            ModelFiles::Folder(folder) => {
                let config = folder.path.join("config.json");
                let bytes =
                    std::fs::read(&config).map_err(|source| lcut_model::ModelError::Io {
                        path: config,
                        source,
                    })?;
                (
                    TextTokenizer::from_folder(&folder.path)?,
                    lcut_trace::hash_bytes(&bytes),
                )
            }
        };
        let model = Decoder::from_files(files, mode, device)?;
        let template = chat_template(tokenizer.as_ref())?;
        Ok(Self {
            model,
            tokenizer,
            template,
            folder: path.to_path_buf(),
            name: path.display().to_string(),
            config_hash,
            adapter: None,
        })
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

    /// The model as the user named it: its path, or the hub cache or
    /// Ollama name it was resolved from.
    pub fn name(&self) -> &str {
        &self.name
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

    /// Prepare a prompt in two parts ([`SplitPrompt`]): the context before
    /// the decode start, the question and answer stem after it.
    pub fn prepare_split(
        &self,
        parts: SplitPrompt<'_>,
        use_template: bool,
    ) -> Result<PreparedPrompt> {
        prepare_split(
            self.tokenizer()?,
            self.template.as_ref(),
            self.model.config().bos_token_id,
            parts,
            use_template,
        )
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
        prepare_text(
            self.tokenizer()?,
            self.template.as_ref(),
            self.model.config().bos_token_id,
            (user, system),
            use_template,
        )
    }
}
