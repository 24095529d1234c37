//! `Session.forward`: one sequence under a policy, its logits and
//! per-layer records as numpy arrays (what `lcut forward` writes).

use lcut_engine::PreparedPrompt;
use lcut_engine::forward::{ForwardOptions, MAX_RECORDED_ATTENTION, forward};
use pyo3::prelude::*;

use crate::arrays::{array, f32_array, stacked_array, tensor_array};
use crate::errors::{candle_err, detached, engine_err, invalid};
use crate::inputs::{index, policy, token_ids};

/// The result of ``Session.forward``.
///
/// ``logits`` holds the rows of positions ``decode_start .. len(ids) - 1``
/// (the rows ``lcut forward`` writes for a policy; for ``full`` it writes
/// every row, and ``decode_start=0`` gives them all here). The per-layer
/// records are ``None`` when not asked for.
#[pyclass(module = "lcut", name = "Forward", frozen)]
pub struct Forward {
    /// float32 [rows, vocab]: logits of positions ``decode_start ..``.
    #[pyo3(get)]
    pub logits: Py<PyAny>,
    /// The token ids run.
    #[pyo3(get)]
    pub ids: Vec<u32>,
    /// First position with a logits row.
    #[pyo3(get)]
    pub decode_start: usize,
    /// The policy, resolved against the model's depth (``speed:22+bos``).
    #[pyo3(get)]
    pub policy: String,
    /// float32 [len(ids), hidden]: the embeddings entering layer 0, or None.
    #[pyo3(get)]
    pub embeddings: Option<Py<PyAny>>,
    /// float32 [layers, len(ids), hidden]: the residual stream after each
    /// layer, or None. Under a policy other than ``full``, rows of tokens
    /// that do not exist at a layer (prompt tokens above the cut) are NaN.
    #[pyo3(get)]
    pub layer_out: Option<Py<PyAny>>,
    /// float32 [layers, heads, len(ids), len(ids)]: post-softmax attention
    /// (query, key), or None. 0 where a query does not see a key; under a
    /// policy, rows of queries absent at a layer are 0 too.
    #[pyo3(get)]
    pub attention: Option<Py<PyAny>>,
    /// float32 [layers + 1, len(ids)]: the logit lens, or None. At hidden
    /// state i (0 the embeddings, l + 1 the output of layer l) of each
    /// position, the log-probability under that state's final norm and LM
    /// head of the token the last layer ranks first there; NaN where a
    /// policy keeps the position out of a layer.
    #[pyo3(get)]
    pub lens_logprob: Option<Py<PyAny>>,
    /// The sparse layers of a mixture-of-experts model (the routing
    /// arrays' first axis), or None.
    #[pyo3(get)]
    pub sparse_layers: Option<Vec<usize>>,
    /// float32 [sparse layers, len(ids), num_experts]: the router's
    /// probability of each expert for each token, or None. NaN where a
    /// policy keeps the token out of the layer.
    #[pyo3(get)]
    pub router_probs: Option<Py<PyAny>>,
    /// int64 [sparse layers, len(ids), top_k]: the experts each token runs,
    /// most probable first, or None; -1 where a policy keeps the token out
    /// of the layer.
    #[pyo3(get)]
    pub experts: Option<Py<PyAny>>,
    /// float32 [sparse layers, len(ids), top_k]: the chosen experts' weights
    /// in the layer's output, or None; NaN where the token is kept out.
    #[pyo3(get)]
    pub expert_weights: Option<Py<PyAny>>,
}

#[pymethods]
impl Forward {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let shape = self.logits.bind(py).getattr("shape")?.repr()?;
        Ok(format!(
            "Forward(policy={:?}, tokens={}, decode_start={}, logits shape {shape})",
            self.policy,
            self.ids.len(),
            self.decode_start
        ))
    }
}

/// What `Session.forward` was asked for.
pub struct ForwardArgs {
    /// Token ids, unchecked.
    pub ids: Vec<i64>,
    /// The policy string.
    pub policy: String,
    /// First logits row (negative: from the end); the last token when `None`.
    pub decode_start: Option<i64>,
    /// Record the residual stream.
    pub residuals: bool,
    /// Record attention.
    pub attention: bool,
    /// Compute the logit lens.
    pub lens: bool,
    /// Record a mixture's routing.
    pub routing: bool,
}

/// Run `args` on `session`.
pub fn run(py: Python<'_>, session: &lcut_engine::Session, args: ForwardArgs) -> PyResult<Forward> {
    let cfg = session.model.config();
    let ids = token_ids(&args.ids, cfg.vocab_size)?;
    let (spec, resolved) = policy(&args.policy, cfg.num_layers)?;
    let start = match args.decode_start {
        Some(i) if !ids.is_empty() => Some(index(i, ids.len(), "decode_start")?),
        _ => None,
    };
    let prompt = PreparedPrompt::from_ids(ids, start).map_err(engine_err)?;
    let t = prompt.len();
    if args.attention && t > MAX_RECORDED_ATTENTION {
        return Err(invalid(format!(
            "{t} tokens: recording attention [heads, T, T] would need {} MB per layer; \
             pass attention=False",
            cfg.num_heads * t * t * 4 / 1_000_000
        )));
    }
    let opts = ForwardOptions {
        residuals: args.residuals,
        attention: args.attention,
        lens: args.lens,
        routing: args.routing,
    };
    let mut record = detached(py, || {
        forward(&session.model, &prompt, &spec, opts).map_err(engine_err)
    })?;
    let s = prompt.decode_start;
    // the full model has a row for every position; keep those from s on
    let logits = record
        .logits
        .narrow(0, s - record.first_row, t - s)
        .map_err(candle_err)?;
    let optional = |ts: &[candle_core::Tensor]| -> PyResult<Option<Py<PyAny>>> {
        if ts.is_empty() {
            Ok(None)
        } else {
            stacked_array(py, ts).map(Some)
        }
    };
    let (sparse_layers, router_probs, experts, expert_weights) = match record.routing.take() {
        Some(r) => {
            let (layers, t) = (r.layers.len(), r.tokens);
            (
                Some(r.layers),
                Some(f32_array(py, r.probs, &[layers, t, r.num_experts])?),
                Some(array(py, r.experts, &[layers, t, r.top_k])?),
                Some(f32_array(py, r.weights, &[layers, t, r.top_k])?),
            )
        }
        None => (None, None, None, None),
    };
    Ok(Forward {
        sparse_layers,
        router_probs,
        experts,
        expert_weights,
        logits: tensor_array(py, &logits)?,
        decode_start: s,
        policy: resolved.to_string(),
        embeddings: record
            .embeddings
            .as_ref()
            .map(|e| tensor_array(py, e))
            .transpose()?,
        layer_out: optional(&record.layer_out)?,
        attention: optional(&record.attention)?,
        lens_logprob: record
            .lens_logprob
            .as_ref()
            .map(|e| tensor_array(py, e))
            .transpose()?,
        ids: prompt.ids,
    })
}
