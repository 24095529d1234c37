//! Rust buffers as numpy arrays (the vector is handed over, not copied
//! again) and the layout changes between lcut's files and the Python API.

use candle_core::Tensor;
use lcut_trace::Tensor3;
use numpy::{Element, PyArray1, PyArrayMethods};
use pyo3::prelude::*;

use crate::errors::candle_err;

/// `data` (row-major) as a float32 array of `shape`.
pub fn f32_array(py: Python<'_>, data: Vec<f32>, shape: &[usize]) -> PyResult<Py<PyAny>> {
    array(py, data, shape)
}

/// `data` (row-major) as an array of `shape` of its element type.
pub fn array<T: Element>(py: Python<'_>, data: Vec<T>, shape: &[usize]) -> PyResult<Py<PyAny>> {
    let flat = PyArray1::from_vec(py, data);
    Ok(flat.reshape(shape)?.into_any().unbind())
}

/// A candle tensor (f32, on the CPU) as a float32 array of its shape.
pub fn tensor_array(py: Python<'_>, t: &Tensor) -> PyResult<Py<PyAny>> {
    let shape = t.dims().to_vec();
    let data = t
        .to_dtype(candle_core::DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(candle_err)?;
    f32_array(py, data, &shape)
}

/// Candle tensors of one shape stacked along a new first axis.
pub fn stacked_array(py: Python<'_>, ts: &[Tensor]) -> PyResult<Py<PyAny>> {
    let stacked = Tensor::stack(ts, 0).map_err(candle_err)?;
    tensor_array(py, &stacked)
}

/// A trace tensor stored `[layers, steps, heads]` (lcut-trace's layout,
/// one decode step's heads together) as the API's `[layers, heads, steps]`
/// (one head's curve over the steps together, as plots index it).
pub fn layers_heads_steps(py: Python<'_>, t: &Tensor3) -> PyResult<Py<PyAny>> {
    let [layers, steps, heads] = t.shape();
    let data: Vec<f32> = t.view().permuted_axes([0, 2, 1]).iter().copied().collect();
    f32_array(py, data, &[layers, heads, steps])
}

/// A series of floats as a 1-D float32 array.
pub fn series_array(py: Python<'_>, values: &[f32]) -> PyResult<Py<PyAny>> {
    f32_array(py, values.to_vec(), &[values.len()])
}
