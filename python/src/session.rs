//! `lcut.load` and `Session`: a loaded model and every call that runs it.
//! The methods check their arguments here and hand the work to the modules
//! that wrap one engine entry point each.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::config::ModelConfig;
use crate::diagnose::{DiagnoseArgs, PromptsArg, SweepArg};
use crate::errors::{ErrorKind, engine_err, lcut_error};
use crate::eval::EvalArgs;
use crate::forward::{Forward, ForwardArgs};
use crate::generate::{GenerateArgs, Generation};
use crate::inputs::{PromptArg, policy, prepare, token_ids};
use crate::load::{LoadSource, model_path, open, open_device, weight_mode};
use crate::report::{Report, to_python};
use crate::trace::{Trace, TraceArgs};

/// Load a model for use from Python.
///
/// Args:
///     path: a model folder in the Hugging Face layout (config.json,
///         model.safetensors, tokenizer.json), a ``.gguf`` file, a Hugging
///         Face cache name ``ORG/NAME[@REV]`` or an Ollama name
///         ``NAME[:TAG]`` (found on disk, never downloaded). None loads the
///         small model bundled with lcut's sources (the source tree the
///         package was built from).
///     dtype: how the weights are held, as ``lcut --dtype``: ``"f32"``
///         (exact), ``"bf16"``, ``"f16"``, or ``"q"`` (a GGUF's matrices kept
///         quantized, activations in f32). The K/V cache follows ``lcut
///         --kv-dtype auto``: f16 for ``"q"``, the weights' dtype otherwise.
///     lora: a LoRA adapter folder (PEFT layout) merged into the weights.
///     device: ``"cpu"``, or ``"cuda"`` / ``"cuda:N"`` in a build with CUDA.
///
/// Returns:
///     A ``Session``.
///
/// Raises:
///     lcut.NotFoundError: (a FileNotFoundError) when the path is not there.
///     lcut.InvalidInputError: (a ValueError) for an unknown dtype or device.
///     lcut.LcutError: when the model cannot be read (the message says
///         which file and field).
///
/// Example:
///     >>> import lcut
///     >>> s = lcut.load("models/SmolLM2-135M-Instruct.Q4_1.gguf", dtype="q")
///     >>> s.generate("What is the capital of France?", policy="full").text
#[pyfunction]
#[pyo3(signature = (path = None, dtype = "f32", lora = None, device = "cpu"))]
pub fn load(
    py: Python<'_>,
    path: Option<PathBuf>,
    dtype: &str,
    lora: Option<PathBuf>,
    device: &str,
) -> PyResult<Session> {
    let source = LoadSource {
        path: model_path(path),
        mode: weight_mode(dtype)?,
        device_name: device.to_string(),
        device: open_device(device)?,
        lora,
    };
    let inner = open(py, &source)?;
    Ok(Session {
        inner: Arc::new(inner),
        source,
    })
}

/// A loaded model with its tokenizer and chat template (``lcut.load``).
///
/// Long calls (``trace``, ``generate``, ``diagnose``, ``eval``) release the
/// GIL, show a tqdm bar when tqdm is installed (``progress=False`` hides
/// it) and stop at the next prefill chunk or decode step on Ctrl-C,
/// raising KeyboardInterrupt; the session stays usable.
///
/// Policies are written as on lcut's command line: ``full``,
/// ``speed:C+bos`` (SPEED with cutoff C, a layer count or a fraction such
/// as ``3/4``, BoS kept as the anchor), ``speed:C``, ``selfonly:C+bos``,
/// ``slim:...`` (SlimInfer).
#[pyclass(module = "lcut", name = "Session", frozen)]
pub struct Session {
    inner: Arc<lcut_engine::Session>,
    source: LoadSource,
}

#[pymethods]
impl Session {
    /// The model's shape (``layers``, ``heads``, ``kv_heads``, ``hidden``,
    /// ``vocab``, ``arch``, ``chat_template``, ...).
    #[getter]
    fn config(&self) -> ModelConfig {
        ModelConfig::of(&self.inner)
    }

    /// The model folder or GGUF file.
    #[getter]
    fn path(&self) -> String {
        self.source.path.display().to_string()
    }

    /// The device the model runs on, as given to ``load``.
    #[getter]
    fn device(&self) -> &str {
        &self.source.device_name
    }

    /// The LoRA adapter in the model (path, hash, trained-for policy, rank,
    /// mode) as a dict, or None.
    #[getter]
    fn adapter(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.inner
            .adapter
            .as_ref()
            .map(|a| to_python(py, a))
            .transpose()
    }

    /// The token ids lcut runs for ``text``: through the chat template
    /// when ``chat`` is set (and the model has one), else raw with BoS
    /// prepended when the model names one.
    ///
    /// Raises:
    ///     lcut.InvalidInputError: (a ValueError) for an empty text.
    #[pyo3(signature = (text, chat = false, system = None))]
    fn tokenize(&self, text: &str, chat: bool, system: Option<&str>) -> PyResult<Vec<u32>> {
        Ok(self
            .inner
            .prepare_text(text, system, chat)
            .map_err(engine_err)?
            .ids)
    }

    /// A prompt as lcut runs it: a dict with ``ids``, ``decode_start``
    /// (the first decode-phase token: the generation prompt's first token
    /// under the chat template, else the last token) and ``system_len``.
    #[pyo3(signature = (prompt, chat = true, system = None))]
    fn prepare<'py>(
        &self,
        py: Python<'py>,
        prompt: PromptArg,
        chat: bool,
        system: Option<&str>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = prepare(&self.inner, &prompt, chat, system)?;
        let d = PyDict::new(py);
        d.set_item("ids", p.ids)?;
        d.set_item("decode_start", p.decode_start)?;
        d.set_item("system_len", p.system_len)?;
        Ok(d)
    }

    /// The text of token ids.
    ///
    /// Raises:
    ///     lcut.InvalidInputError: (a ValueError) for ids outside the vocabulary.
    fn decode(&self, ids: Vec<i64>) -> PyResult<String> {
        let ids = token_ids(&ids, self.inner.model.config().vocab_size)?;
        let tok = self.tokenizer()?;
        Ok(tok.decode(&ids))
    }

    /// The text of each token id on its own (labels for plots).
    fn token_strings(&self, ids: Vec<i64>) -> PyResult<Vec<String>> {
        let ids = token_ids(&ids, self.inner.model.config().vocab_size)?;
        Ok(self.tokenizer()?.token_strings(&ids))
    }

    /// A policy string resolved against this model's depth
    /// (``"speed:3/4+bos"`` -> ``"speed:22+bos"`` on 30 layers).
    ///
    /// Raises:
    ///     lcut.InvalidInputError: (a ValueError) for a malformed policy or a cutoff out of range.
    fn resolve_policy(&self, policy_text: &str) -> PyResult<String> {
        Ok(policy(policy_text, self.inner.model.config().num_layers)?
            .1
            .to_string())
    }

    /// Run token ids through the model under a policy, as ``lcut forward``.
    ///
    /// The full model is teacher-forced in one pass; any other policy runs
    /// the incremental path (the prompt before ``decode_start`` at once,
    /// then each later token one by one), the logits exactly those of
    /// ``lcut forward --policy`` for the same ids.
    ///
    /// Args:
    ///     ids: token ids.
    ///     policy: the visibility policy.
    ///     decode_start: the first decode-phase position, and the first
    ///         logits row returned (negative: from the end); default the
    ///         last token.
    ///     residuals: record the embeddings and each layer's output.
    ///     attention: record each layer's attention [heads, T, T] (at most
    ///         2048 tokens).
    ///     lens: the logit lens, ``lens_logprob`` [layers + 1, len(ids)].
    ///     routing: a mixture-of-experts model's routing of every token at
    ///         every sparse layer (``router_probs``, ``experts``,
    ///         ``expert_weights``; None for a dense model).
    ///
    /// Returns:
    ///     A ``Forward`` with ``logits`` float32 [len(ids) - decode_start, vocab].
    ///
    /// Raises:
    ///     lcut.InvalidInputError: (a ValueError) for ids outside the
    ///         vocabulary, a bad policy or decode_start.
    #[pyo3(signature = (ids, policy = "full", decode_start = None, residuals = true, attention = true, lens = false, routing = true))]
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        py: Python<'_>,
        ids: Vec<i64>,
        policy: &str,
        decode_start: Option<i64>,
        residuals: bool,
        attention: bool,
        lens: bool,
        routing: bool,
    ) -> PyResult<Forward> {
        let args = ForwardArgs {
            ids,
            policy: policy.to_string(),
            decode_start,
            residuals,
            attention,
            lens,
            routing,
        };
        crate::forward::run(py, &self.inner, args)
    }

    /// Generate greedily from a prompt with the diagnostic probe attached
    /// and return what it saw: attention masses per (layer, head, decode
    /// step), prompt entropy, curvature.
    ///
    /// Args:
    ///     prompt: text (or token ids).
    ///     max_new_tokens: greedy tokens to generate (EoS may stop earlier).
    ///     chat: wrap the text in the model's chat template.
    ///     policy: the policy the generation runs under (``full`` for the
    ///         diagnostics of the unmodified model).
    ///     system: a system message for the chat template.
    ///     progress: show a progress bar (tqdm).
    ///     lens: also record the logit lens of every step (``lens_prob``,
    ///         ``lens_rank``, ...; an LM-head product per layer per step).
    ///
    /// Returns:
    ///     A ``Trace``; its arrays are [layers, heads, steps].
    #[pyo3(signature = (prompt, max_new_tokens = 16, chat = true, policy = "full", system = None, progress = true, lens = false))]
    #[allow(clippy::too_many_arguments)]
    fn trace(
        &self,
        py: Python<'_>,
        prompt: PromptArg,
        max_new_tokens: usize,
        chat: bool,
        policy: &str,
        system: Option<String>,
        progress: bool,
        lens: bool,
    ) -> PyResult<Trace> {
        let args = TraceArgs {
            prompt,
            max_new_tokens,
            chat,
            policy: policy.to_string(),
            system,
            progress,
            lens,
        };
        crate::trace::run(py, &self.inner, args)
    }

    /// Generate greedily under a policy, timed, with the K/V bytes held.
    ///
    /// Args:
    ///     prompt: text (or token ids).
    ///     policy: the policy to generate under.
    ///     max_new_tokens: most tokens to generate.
    ///     compare: another policy (e.g. ``"full"``) to run in lockstep on
    ///         the same prompt; its output and the per-step agreement come
    ///         back in ``Generation.compare`` / ``.agreement``.
    ///     chat: wrap the text in the model's chat template.
    ///     system: a system message for the chat template.
    ///     progress: show a progress bar (tqdm).
    ///
    /// Returns:
    ///     A ``Generation`` (``text``, ``ids``, ``ttft_s``, ``tpot_s``, ``kv_bytes``, ...).
    #[pyo3(signature = (prompt, policy = "speed:3/4+bos", max_new_tokens = 64, compare = None, chat = true, system = None, progress = true))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: PromptArg,
        policy: &str,
        max_new_tokens: usize,
        compare: Option<String>,
        chat: bool,
        system: Option<String>,
        progress: bool,
    ) -> PyResult<Generation> {
        let args = GenerateArgs {
            prompt,
            policy: policy.to_string(),
            max_new_tokens,
            compare,
            chat,
            system,
            progress,
        };
        crate::generate::run(py, &self.inner, args)
    }

    /// Run the diagnostics over a prompt set and recommend a cutoff, as
    /// ``lcut diagnose`` (and with ``sweep``, ``lcut sweep``).
    ///
    /// Args:
    ///     prompts: a list of prompts (strings, or dicts with ``prompt`` and
    ///         optional ``id`` and ``system``), or the path of a JSON Lines
    ///         prompt set; None takes the prompt set bundled with lcut.
    ///     sweep: also measure SPEED+BoS at every cutoff (True) or at the
    ///         cutoffs listed, teacher-forced on the full model's greedy
    ///         continuation (agreement, KL, NLL, costs).
    ///     out: a folder to save ``report.json`` into.
    ///     max_new_tokens: greedy tokens per prompt.
    ///     chat: wrap prompts in the model's chat template.
    ///     progress: show a progress bar (tqdm).
    ///     lens: also record the logit lens (``lcut diagnose --lens``).
    ///
    /// Returns:
    ///     A ``Report``.
    #[pyo3(signature = (prompts = None, sweep = SweepArg::Flag(false), out = None, max_new_tokens = 16, chat = true, progress = true, lens = false))]
    #[allow(clippy::too_many_arguments)]
    fn diagnose(
        &self,
        py: Python<'_>,
        prompts: Option<PromptsArg<'_>>,
        sweep: SweepArg,
        out: Option<PathBuf>,
        max_new_tokens: usize,
        chat: bool,
        progress: bool,
        lens: bool,
    ) -> PyResult<Report> {
        let args = DiagnoseArgs {
            prompts,
            sweep,
            out,
            max_new_tokens,
            chat,
            progress,
            lens,
        };
        crate::diagnose::run(py, &self.inner, args)
    }

    /// Score a task suite under a policy, as ``lcut eval --suite``: each
    /// item's greedy answer under the policy and under the full model
    /// (the base model when an adapter is loaded), and the policy
    /// teacher-forced on the full model's answer.
    ///
    /// Args:
    ///     suite: a suite file (JSON Lines with answers and scoring rules,
    ///         e.g. ``fixtures/suites/smollm2.jsonl``).
    ///     policy: a policy, or a list of policies (one result each).
    ///     max_new_tokens: most tokens per answer.
    ///     progress: show a progress bar (tqdm).
    ///
    /// Returns:
    ///     A dict (a list of dicts for a list of policies): ``accuracy``,
    ///     ``ci95``, ``correct``, ``n``, ``full_correct``, ``kept_of_full``,
    ///     ``top1_agreement``, ``mean_kl``, ``kv_ratio`` over the whole
    ///     suite, then ``scores`` per kind and length and every item in ``items``.
    #[pyo3(signature = (suite, policy, max_new_tokens = 24, progress = true))]
    fn eval(
        &self,
        py: Python<'_>,
        suite: PathBuf,
        policy: Bound<'_, PyAny>,
        max_new_tokens: usize,
        progress: bool,
    ) -> PyResult<Py<PyAny>> {
        let single = policy.extract::<String>().ok();
        let policies = match &single {
            Some(p) => vec![p.clone()],
            None => policy.extract::<Vec<String>>()?,
        };
        let args = EvalArgs {
            suite,
            policies,
            max_new_tokens,
            progress,
        };
        let mut results = crate::eval::run(py, &self.inner, &self.source, args)?;
        match single {
            Some(_) if results.len() == 1 => Ok(results.remove(0)),
            _ => Ok(pyo3::types::PyList::new(py, results)?.into_any().unbind()),
        }
    }

    fn __repr__(&self) -> String {
        let cfg = self.inner.model.config();
        format!(
            "Session(path={:?}, arch={:?}, layers={}, dtype={:?}, device={:?})",
            self.source.path.display().to_string(),
            cfg.arch.model_type(),
            cfg.num_layers,
            self.inner.model.weight_mode().name(),
            self.source.device_name
        )
    }
}

impl Session {
    fn tokenizer(&self) -> PyResult<&lcut_engine::TextTokenizer> {
        self.inner.tokenizer.as_ref().ok_or_else(|| {
            lcut_error(
                ErrorKind::Other,
                lcut_engine::EngineError::NoTokenizer {
                    folder: self.source.path.clone(),
                }
                .to_string(),
            )
        })
    }
}
