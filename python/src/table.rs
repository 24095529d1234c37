//! The per-layer table of a report or trace: one row per layer, one column
//! per entry of `lcut_trace::LAYER_METRICS` (the report's CSV columns), as
//! a pandas DataFrame when pandas is installed, else a dict of numpy columns.

use lcut_trace::{LAYER_METRICS, LayerCurves};
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::f32_array;

/// The column names after `layer`, in order.
pub fn metric_names() -> Vec<&'static str> {
    LAYER_METRICS.iter().map(|m| m.name).collect()
}

/// `curves` as a table of `num_layers` rows: column `layer`, then each
/// metric's value for that layer (a per-cut series reads the cut at the
/// layer, a per-hidden-state series the layer's output).
pub fn layer_table(py: Python<'_>, curves: &LayerCurves) -> PyResult<Py<PyAny>> {
    let layers = curves.num_layers;
    let columns = PyDict::new(py);
    let index: Vec<i64> = (0..layers as i64).collect();
    columns.set_item("layer", PyArray1::from_vec(py, index))?;
    for metric in LAYER_METRICS {
        let values: Vec<f32> = (0..layers).map(|l| metric.row_value(curves, l)).collect();
        columns.set_item(metric.name, f32_array(py, values, &[layers])?)?;
    }
    match py.import("pandas") {
        Ok(pandas) => Ok(pandas.call_method1("DataFrame", (columns,))?.unbind()),
        Err(_) => Ok(columns.into_any().unbind()),
    }
}
