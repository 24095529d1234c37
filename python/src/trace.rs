//! `Session.trace` and `Trace`: one prompt's greedy run with the diagnostic
//! probe, its per-(layer, head, step) masses as numpy arrays, and one
//! decode step's attention row on demand.

use std::sync::Arc;

use lcut_engine::PreparedPrompt;
use lcut_engine::diagnose::{
    DiagnoseOptions, LabelledPrompt, PromptProgress, attention_row, routing_overlap_of,
    trace_prompt_under,
};
use lcut_policy::Policy;
use lcut_trace::{LayerCurves, PromptTrace};
use pyo3::prelude::*;

use crate::arrays::{f32_array, layers_heads_steps, series_array};
use crate::errors::{ErrorKind, detached, engine_err, lcut_error};
use crate::inputs::{PromptArg, budget, index, policy, prepare};
use crate::progress::Progress;
use crate::routing::Routing;
use crate::table::layer_table;

/// What a trace needs to run its generation again (for attention rows).
struct Replay {
    session: Arc<lcut_engine::Session>,
    prompt: PreparedPrompt,
    policy: Policy,
    opts: DiagnoseOptions,
}

/// One prompt's greedy run, seen by the diagnostic probe.
///
/// Per-(layer, head, step) arrays are float32 ``[layers, heads, steps]``:
/// ``prefill_mass[l, h, k]`` is the attention that head ``h`` of layer
/// ``l`` pays, at decode step ``k``, to the prompt tokens between the
/// anchors and the decode start. (lcut's files store these tensors
/// ``[layers, steps, heads]``; the API puts heads before steps so that
/// ``a[l, h]`` is one head's curve over the steps and ``a[l].mean(0)`` the
/// head mean at each step.) Step ``k`` is the query at
/// ``query_positions[k]``, whose output is ``ids[k]``; step 0 is the last
/// prompt token. The five masses (bos, anchor, prefill, decode, self) sum
/// to 1 at every (layer, head, step), with the learned sink's share
/// (``sink_mass``, gpt-oss) where the model has sinks.
#[pyclass(module = "lcut", name = "Trace", frozen)]
pub struct Trace {
    trace: PromptTrace,
    curves: LayerCurves,
    text: String,
    policy: String,
    prompt_ids: Option<Vec<u32>>,
    replay: Option<Replay>,
}

impl Trace {
    /// A `[sites, steps]` array of the trace's lens made by `values`, or
    /// `None` when the trace has no lens.
    fn lens_array(
        &self,
        py: Python<'_>,
        values: impl Fn(&lcut_trace::LensTrace) -> Vec<f32>,
    ) -> PyResult<Option<Py<PyAny>>> {
        self.trace
            .lens
            .as_ref()
            .map(|lens| f32_array(py, values(lens), &[lens.sites(), lens.steps()]))
            .transpose()
    }

    /// A trace read from a report: no session to repeat its run.
    pub fn from_report(trace: PromptTrace, policy: &str) -> PyResult<Self> {
        let curves = lcut_diag::aggregate(std::slice::from_ref(&trace))
            .map_err(|e| lcut_error(ErrorKind::Other, e.to_string()))?;
        Ok(Self {
            text: trace.generated.concat(),
            curves,
            trace,
            policy: policy.to_string(),
            prompt_ids: None,
            replay: None,
        })
    }
}

/// What `Session.trace` was asked for.
pub struct TraceArgs {
    /// The prompt.
    pub prompt: PromptArg,
    /// Greedy tokens to generate.
    pub max_new_tokens: usize,
    /// Through the chat template.
    pub chat: bool,
    /// The policy string.
    pub policy: String,
    /// A system message.
    pub system: Option<String>,
    /// Show a progress bar.
    pub progress: bool,
    /// Record the logit lens.
    pub lens: bool,
}

/// Trace `args.prompt` on `session`.
pub fn run(
    py: Python<'_>,
    session: &Arc<lcut_engine::Session>,
    args: TraceArgs,
) -> PyResult<Trace> {
    let prompt = prepare(session, &args.prompt, args.chat, args.system.as_deref())?;
    let (_, resolved) = policy(&args.policy, session.model.config().num_layers)?;
    let opts = DiagnoseOptions {
        max_new_tokens: budget(args.max_new_tokens)?,
        use_chat_template: args.chat,
        lens: args.lens,
        ..DiagnoseOptions::default()
    };
    let labelled = LabelledPrompt {
        index: 0,
        id: "prompt".into(),
        prompt: prompt.clone(),
    };
    let mut bar = Progress::new(py, args.progress, args.max_new_tokens, "trace", "tok");
    let result = detached(py, || {
        let stops = session.stop_tokens();
        let strings = |ids: &[u32]| token_strings(session, ids);
        trace_prompt_under(
            &session.model,
            &labelled,
            resolved,
            &opts,
            &stops,
            &strings,
            &mut |p| tick(&mut bar, p),
        )
        .map_err(engine_err)
    });
    let mut trace = bar.finish(py, result)?;
    if !resolved.is_full_depth() && trace.routing.is_some() {
        // how far the policy's routing of its own tokens departs from the
        // full model's, as `diagnose --policy` records it
        let chunk = lcut_engine::GenerationConfig::default().prefill_chunk;
        let overlap = detached(py, || {
            routing_overlap_of(session, &prompt, &trace.generated_ids, resolved, chunk)
                .map_err(engine_err)
        })?;
        if let Some(routing) = trace.routing.as_mut() {
            routing.overlap = overlap;
        }
    }
    let curves = lcut_diag::aggregate(std::slice::from_ref(&trace))
        .map_err(|e| lcut_error(ErrorKind::Other, e.to_string()))?;
    Ok(Trace {
        text: session.generated_text(&trace.generated_ids),
        curves,
        trace,
        policy: resolved.to_string(),
        prompt_ids: Some(prompt.ids.clone()),
        replay: Some(Replay {
            session: Arc::clone(session),
            prompt,
            policy: resolved,
            opts,
        }),
    })
}

/// Each id's text (ids as numbers without a tokenizer).
fn token_strings(session: &lcut_engine::Session, ids: &[u32]) -> Vec<String> {
    match &session.tokenizer {
        Some(t) => t.token_strings(ids),
        None => ids.iter().map(u32::to_string).collect(),
    }
}

/// A prompt's progress on the bar (decode steps; prefill as a note).
fn tick(bar: &mut Progress, p: PromptProgress) -> bool {
    match p {
        PromptProgress::Prefill(p) => bar.tick(0, Some(&format!("prefill {}/{}", p.done, p.total))),
        PromptProgress::Step(n) => bar.tick(n, None),
    }
}

#[pymethods]
impl Trace {
    /// The prompt's id (``prompt`` for ``Session.trace``; the prompt set's id in a report).
    #[getter]
    fn id(&self) -> &str {
        &self.trace.id
    }

    /// The policy the generation ran under, resolved (``full``, ``speed:22+bos``).
    #[getter]
    fn policy(&self) -> &str {
        &self.policy
    }

    /// The prompt's token ids (None for a trace read from a report).
    #[getter]
    fn prompt_ids(&self) -> Option<Vec<u32>> {
        self.prompt_ids.clone()
    }

    /// The text of each prompt token (the heatmap's position labels).
    #[getter]
    fn tokens(&self) -> Vec<String> {
        self.trace.prompt_tokens.clone()
    }

    /// The text of each generated token.
    #[getter]
    fn generated(&self) -> Vec<String> {
        self.trace.generated.clone()
    }

    /// The generated token ids, one per decode step.
    #[getter]
    fn ids(&self) -> Vec<u32> {
        self.trace.generated_ids.clone()
    }

    /// The generated text, stop token left out (for a trace read from a
    /// report: its tokens' texts joined).
    #[getter]
    fn text(&self) -> &str {
        &self.text
    }

    /// Number of prompt tokens.
    #[getter]
    fn prompt_len(&self) -> usize {
        self.trace.prompt_len
    }

    /// The first decode-phase position (the chat template's generation
    /// prompt starts there; the last prompt token for a raw prompt).
    #[getter]
    fn decode_start(&self) -> usize {
        self.trace.decode_start
    }

    /// Number of anchor tokens (BoS: 1).
    #[getter]
    fn anchor_len(&self) -> usize {
        self.trace.anchor_len
    }

    /// The query position of each decode step.
    #[getter]
    fn query_positions(&self) -> Vec<usize> {
        self.trace.query_positions.clone()
    }

    /// Number of layers.
    #[getter]
    fn num_layers(&self) -> usize {
        self.trace.num_layers
    }

    /// Number of query heads.
    #[getter]
    fn num_heads(&self) -> usize {
        self.trace.num_heads
    }

    /// Layers without attention rows (Qwen3.5's linear-attention layers)
    /// whose masses are their state split: ``prefill_mass`` the prompt's
    /// share of the layer's output, ``decode_mass`` the rest; empty where
    /// every layer attends.
    #[getter]
    fn state_split_layers(&self) -> Vec<usize> {
        self.trace.state_split_layers.clone()
    }

    /// Number of decode steps.
    #[getter]
    fn num_steps(&self) -> usize {
        self.trace.num_steps()
    }

    /// float32 [layers, heads, steps]: attention on the BoS token (position 0).
    #[getter]
    fn bos_mass(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        layers_heads_steps(py, &self.trace.bos)
    }

    /// float32 [layers, heads, steps]: attention on anchors other than BoS.
    #[getter]
    fn anchor_mass(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        layers_heads_steps(py, &self.trace.anchor)
    }

    /// float32 [layers, heads, steps]: attention on the prompt tokens
    /// between the anchors and the decode start (what SPEED drops above the cut).
    #[getter]
    fn prefill_mass(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        layers_heads_steps(py, &self.trace.prefill)
    }

    /// float32 [layers, heads, steps]: attention on decode-phase tokens before the query.
    #[getter]
    fn decode_mass(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        layers_heads_steps(py, &self.trace.decode)
    }

    /// float32 [layers, heads, steps]: attention of the query on itself.
    #[getter]
    fn self_mass(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        layers_heads_steps(py, &self.trace.self_mass)
    }

    /// float32 [layers, heads, steps]: attention on no key, the learned
    /// sink's share of each head's softmax (gpt-oss); None for a model
    /// without sinks.
    #[getter]
    fn sink_mass(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.trace
            .sink
            .as_ref()
            .map(|t| layers_heads_steps(py, t))
            .transpose()
    }

    /// How a mixture-of-experts model routed each decode step at its sparse
    /// layers (under a policy, beside the full model's routing of the same
    /// tokens); None for a dense model.
    #[getter]
    fn routing(&self) -> Option<Routing> {
        self.trace.routing.clone().map(Routing::new)
    }

    /// float32 [layers, heads, steps]: entropy of the attention over the
    /// prefill tokens, conditional on reading them, divided by
    /// ln(number of prefill tokens): 0 = one token, 1 = uniform. NaN where
    /// the prefill mass is 0.
    #[getter]
    fn entropy_heads(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let [l, s, h] = self.trace.prefill_entropy.shape();
        let normalised = self.trace.entropy_normalised();
        let data: Vec<f32> = normalised
            .view()
            .permuted_axes([0, 2, 1])
            .iter()
            .copied()
            .collect();
        f32_array(py, data, &[l, h, s])
    }

    /// float32 [layers]: the normalised prompt entropy per layer, weighted
    /// by prefill mass over heads and steps (the report's ``entropy_weighted``).
    #[getter]
    fn entropy(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        series_array(py, &self.curves.entropy_weighted)
    }

    /// float32 [layers]: the normalised prompt entropy per layer, plain mean over heads and steps.
    #[getter]
    fn entropy_head_mean(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        series_array(py, &self.curves.entropy_head_mean)
    }

    /// float32 [layers + 1]: curvature (mean turning angle, radians) of the
    /// prompt's hidden-state trajectory; index 0 is the embeddings, index
    /// ``l + 1`` the output of layer ``l``. NaN where the span has fewer
    /// than three usable tokens (under a policy, above the cut only the
    /// decode-phase prompt tokens exist).
    #[getter]
    fn curvature(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        series_array(py, &self.trace.curvature_prompt)
    }

    /// float32 [layers + 1]: curvature of the generated tokens' trajectory, indexed as ``curvature``.
    #[getter]
    fn curvature_generated(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        series_array(py, &self.trace.curvature_generated)
    }

    /// float32 [layers + 1, steps]: the logit lens, the probability of each
    /// step's token under each hidden state's final norm and LM head (row
    /// 0 the embeddings, row ``l + 1`` the output of layer ``l``; the last
    /// row is the model's own). None when the trace has no lens.
    #[getter]
    fn lens_prob(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.lens_array(py, |lens| {
            lens.logprob.data().iter().map(|l| l.exp()).collect()
        })
    }

    /// float32 [layers + 1, steps]: the lens's log-probability of each
    /// step's token (nats), rows as ``lens_prob``; None without a lens.
    #[getter]
    fn lens_logprob(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.lens_array(py, |lens| lens.logprob.data().to_vec())
    }

    /// float32 [layers + 1, steps]: the rank of each step's token under
    /// each hidden state's lens (1 = its first choice); None without a lens.
    #[getter]
    fn lens_rank(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.lens_array(py, |lens| lens.rank.data().to_vec())
    }

    /// float32 [layers + 1, steps]: 1 where the hidden state's lens ranks
    /// the step's token first, else 0; None without a lens.
    #[getter]
    fn lens_top1(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.lens_array(py, |lens| lens.top1.data().to_vec())
    }

    /// float32 [layers + 1, steps]: KL(final ‖ lens) of the next-token
    /// distributions, nats (0 in the last row); None without a lens.
    #[getter]
    fn lens_kl(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.lens_array(py, |lens| lens.kl.data().to_vec())
    }

    /// The token each hidden state's lens ranks first at each step,
    /// ``[layers + 1][steps]`` (decode them with ``Session.decode``); None
    /// without a lens.
    #[getter]
    fn lens_top_ids(&self) -> Option<Vec<Vec<u32>>> {
        self.trace.lens.as_ref().map(|lens| {
            lens.top_ids
                .chunks(lens.steps().max(1))
                .take(lens.sites())
                .map(<[u32]>::to_vec)
                .collect()
        })
    }

    /// Per step, the formation site: the smallest hidden state from which
    /// every later one's lens ranks the step's token first (``layers`` at
    /// most: the model's own logits always do). None without a lens.
    #[getter]
    fn lens_formation(&self) -> Option<Vec<usize>> {
        self.trace.lens.as_ref().map(|lens| {
            (0..lens.steps())
                .filter_map(|k| lens.formation(k))
                .collect()
        })
    }

    /// float32 [layers, bins]: attention the decode queries pay to each
    /// bin of prompt positions (summed over the bin), mean over heads and steps.
    #[getter]
    fn prompt_attention(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let [l, b] = self.trace.prompt_attention.shape();
        f32_array(py, self.trace.prompt_attention.data().to_vec(), &[l, b])
    }

    /// The prompt positions where the bins of ``prompt_attention`` start, and the end.
    #[getter]
    fn bin_edges(&self) -> Vec<usize> {
        self.trace.bin_edges.clone()
    }

    /// One row per layer, the columns of ``lcut.LAYER_METRICS`` for this
    /// prompt alone: a pandas DataFrame when pandas is installed, else a
    /// dict of numpy columns.
    fn layer_table(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        layer_table(py, &self.curves)
    }

    /// float32 [heads, query_positions[step] + 1]: the post-softmax
    /// attention of decode step ``step``'s query at ``layer``, one row per
    /// head over every key position (0 where the policy hides a key).
    ///
    /// A trace keeps reduced masses only, so the row is recorded on
    /// demand: the traced generation runs again up to that step (the same
    /// greedy run; an error if it produced other tokens) and only that
    /// row is copied out. Needs the session the trace came from (a trace
    /// read from a report has none).
    ///
    /// ``layer`` and ``step`` may count from the end (``-1``: the last).
    #[pyo3(signature = (layer, step, progress = false))]
    fn attention(
        &self,
        py: Python<'_>,
        layer: i64,
        step: i64,
        progress: bool,
    ) -> PyResult<Py<PyAny>> {
        let layer = index(layer, self.trace.num_layers, "layer")?;
        let step = index(step, self.trace.num_steps(), "decode step")?;
        let Some(replay) = &self.replay else {
            return Err(lcut_error(
                ErrorKind::Other,
                "this trace was read from a report, which keeps no attention rows: \
                 run Session.trace to get them",
            ));
        };
        let mut bar = Progress::new(py, progress, step + 1, "attention", "tok");
        let expected = &self.trace.generated_ids;
        let result = detached(py, || {
            let session = &replay.session;
            attention_row(
                &session.model,
                &replay.prompt,
                replay.policy,
                &replay.opts,
                &session.stop_tokens(),
                expected,
                (layer, step),
                &mut |p| tick(&mut bar, p),
            )
            .map_err(engine_err)
        });
        let row = bar.finish(py, result)?;
        f32_array(py, row.probs, &[row.heads, row.position + 1])
    }

    fn __repr__(&self) -> String {
        format!(
            "Trace(id={:?}, policy={:?}, prompt_len={}, steps={}, layers={}, heads={}, text={:?})",
            self.trace.id,
            self.policy,
            self.trace.prompt_len,
            self.trace.num_steps(),
            self.trace.num_layers,
            self.trace.num_heads,
            self.text
        )
    }
}
