//! `Report`: a diagnostic run's report (the recommended L_cut with each
//! signal's vote, the per-layer curves, the traces and an optional
//! sweep), saved and read as `report.json`, the file `lcut diagnose` writes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::{f32_array, series_array};
use crate::errors::{ErrorKind, lcut_error, trace_err};
use crate::table::layer_table;
use crate::trace::Trace;

/// The file a report folder holds.
pub const REPORT_FILE: &str = "report.json";

/// A diagnostic report: what ``Session.diagnose`` returns and
/// ``lcut diagnose --out DIR`` writes as ``DIR/report.json``.
#[pyclass(module = "lcut", name = "Report", frozen)]
pub struct Report {
    /// The report.
    pub report: Arc<lcut_trace::Report>,
}

/// `path` itself when it names a file, else `path/report.json`.
fn report_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(REPORT_FILE)
    } else {
        path.to_path_buf()
    }
}

/// A serde value as Python objects (through JSON: NaN is written as null).
pub fn to_python<T: serde::Serialize>(py: Python<'_>, value: &T) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| lcut_error(ErrorKind::Other, format!("encoding as JSON: {e}")))?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

impl Report {
    /// Write `report.json` into `dir` (created when missing), atomically;
    /// returns the file.
    pub fn save_to(&self, dir: &Path) -> PyResult<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| {
            lcut_error(ErrorKind::Other, format!("creating {}: {e}", dir.display()))
        })?;
        let path = dir.join(REPORT_FILE);
        lcut_trace::write_report_json(&path, &self.report).map_err(trace_err)?;
        Ok(path)
    }
}

#[pymethods]
impl Report {
    /// Read a report: a ``report.json`` file, or a folder holding one
    /// (what ``lcut diagnose --out DIR`` or ``Report.save(DIR)`` wrote).
    /// The schema version and every shape are checked.
    ///
    /// Raises:
    ///     lcut.NotFoundError: (a FileNotFoundError) when there is no such file.
    ///     lcut.LcutError: when the file is not a report of this schema.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Self> {
        let file = report_file(&path);
        if !file.exists() {
            return Err(lcut_error(
                ErrorKind::NotFound,
                format!(
                    "report {} does not exist (give a report.json or the folder holding it)",
                    file.display()
                ),
            ));
        }
        let report = lcut_trace::read_report_json(&file).map_err(trace_err)?;
        Ok(Self {
            report: Arc::new(report),
        })
    }

    /// Write ``report.json`` into the folder ``dir`` (created when
    /// missing) through a temporary file, so that a reader never sees half
    /// a report; returns the file's path. ``lcut report`` renders it.
    fn save(&self, dir: PathBuf) -> PyResult<String> {
        Ok(self.save_to(&dir)?.display().to_string())
    }

    /// The recommended cutoff L_cut (layers ``0 .. L_cut - 1`` keep the prompt).
    #[getter]
    fn recommended_l_cut(&self) -> usize {
        self.report.recommendation.l_cut
    }

    /// Layers of the model.
    #[getter]
    fn num_layers(&self) -> usize {
        self.report.recommendation.num_layers
    }

    /// Each signal's vote for L_cut (None where a signal abstains):
    /// ``tail_mass``, ``selective_band``, ``curvature_plateau``.
    #[getter]
    fn votes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let v = &self.report.recommendation.votes;
        let d = PyDict::new(py);
        d.set_item("tail_mass", v.tail_mass)?;
        d.set_item("selective_band", v.selective_band)?;
        d.set_item("curvature_plateau", v.curvature_plateau)?;
        Ok(d)
    }

    /// Share of decode-to-prompt attention the recommended cut drops.
    #[getter]
    fn tail_mass_dropped(&self) -> f32 {
        self.report.recommendation.tail_mass_dropped
    }

    /// The recommendation in words: each vote and the choice.
    #[getter]
    fn explanation(&self) -> &str {
        &self.report.recommendation.explanation
    }

    /// The sweep's knee (the cutoff where quality stops holding), or None
    /// without a sweep or when no cutoff holds.
    #[getter]
    fn knee(&self) -> Option<usize> {
        self.report.sweep.as_ref().and_then(|s| s.knee)
    }

    /// The model's identity (path, hash, arch, dtype, shape, adapter) as a dict.
    #[getter]
    fn model(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, &self.report.model)
    }

    /// The run's settings (new tokens, prompts file, thresholds, ...) as a dict.
    #[getter]
    fn settings(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, &self.report.settings)
    }

    /// The sweep as a dict (points per cutoff: agreement, KL, NLL, costs), or None.
    #[getter]
    fn sweep(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.report
            .sweep
            .as_ref()
            .map(|s| to_python(py, s))
            .transpose()
    }

    /// The ids of the prompts, in run order.
    #[getter]
    fn prompts(&self) -> Vec<String> {
        self.report.traces.iter().map(|t| t.id.clone()).collect()
    }

    /// Every prompt's trace (full-depth runs; ``Trace.attention`` needs a
    /// session, so use ``Session.trace`` for attention rows).
    #[getter]
    fn traces(&self) -> PyResult<Vec<Trace>> {
        self.report
            .traces
            .iter()
            .map(|t| Trace::from_report(t.clone(), "full"))
            .collect()
    }

    /// Layers without attention rows (Qwen3.5's linear-attention layers)
    /// whose curves come from their state split (the prompt's share of the
    /// layer's output); empty where every layer attends.
    #[getter]
    fn state_split_layers(&self) -> Vec<usize> {
        self.report.curves.state_split_layers.clone()
    }

    /// The aggregated per-layer curves, one float32 array per entry of
    /// ``lcut.LAYER_METRICS`` (keyed by its name; per-cut and
    /// per-hidden-state series have ``num_layers + 1`` entries).
    #[getter]
    fn curves<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for m in lcut_trace::LAYER_METRICS {
            d.set_item(m.name, series_array(py, m.series(&self.report.curves))?)?;
        }
        Ok(d)
    }

    /// The routing over every prompt's decode steps (a mixture-of-experts
    /// model), or None for a dense model: a dict of ``num_experts``,
    /// ``top_k``, ``sparse_layers``, ``tokens`` (decode tokens routed),
    /// ``entropy`` (float32 [layers]: mean normalised router entropy, NaN at
    /// dense layers), ``load`` (float32 [layers, num_experts]: each expert's
    /// share of the top-k slots; rows of sparse layers sum to 1), ``overlap``
    /// (float32 [layers]: the mean top-k overlap of ``policy``'s routing
    /// with the full model's, or None) and ``policy``.
    #[getter]
    fn routing<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(r) = &self.report.curves.routing else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("num_experts", r.num_experts)?;
        d.set_item("top_k", r.top_k)?;
        d.set_item("sparse_layers", r.sparse_layers.clone())?;
        d.set_item("tokens", r.tokens)?;
        d.set_item("entropy", series_array(py, &r.entropy.0)?)?;
        d.set_item(
            "load",
            f32_array(py, r.load.data().to_vec(), &r.load.shape())?,
        )?;
        let overlap = match r.overlap.0.is_empty() {
            true => None,
            false => Some(series_array(py, &r.overlap.0)?),
        };
        d.set_item("overlap", overlap)?;
        d.set_item("policy", r.policy.clone())?;
        Ok(Some(d))
    }

    /// float32 [layers, steps]: prefill mass per layer and decode step,
    /// mean over prompts (that reached the step) and heads.
    #[getter]
    fn prefill_by_step(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let t = &self.report.curves.prefill_by_step;
        f32_array(py, t.data().to_vec(), &t.shape())
    }

    /// float32 [layers, heads]: prefill mass per layer and head, mean over
    /// prompts and steps.
    #[getter]
    fn prefill_by_head(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let t = &self.report.curves.prefill_by_head;
        f32_array(py, t.data().to_vec(), &t.shape())
    }

    /// One row per layer, one column per entry of ``lcut.LAYER_METRICS``
    /// (after ``layer``): a pandas DataFrame when pandas is installed, else
    /// a dict of numpy columns. The values ``lcut report``'s CSV holds.
    fn layer_table(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        layer_table(py, &self.report.curves)
    }

    /// The whole report as plain Python objects (the JSON's structure).
    fn to_dict(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_python(py, self.report.as_ref())
    }

    fn __repr__(&self) -> String {
        let r = &self.report.recommendation;
        format!(
            "Report(model={:?}, prompts={}, recommended_l_cut={} of {}, sweep={})",
            self.report.model.path,
            self.report.traces.len(),
            r.l_cut,
            r.num_layers,
            self.report.sweep.is_some()
        )
    }
}
