//! `Trace.routing`: how a mixture-of-experts model routed each decode step
//! at its sparse layers, as numpy arrays.

use lcut_trace::RoutingTrace;
use pyo3::prelude::*;

use crate::arrays::{array, f32_array};

/// How a mixture-of-experts model routed one prompt's decode steps.
///
/// Row ``i`` of every array is sparse layer ``layers[i]``; step ``k`` is the
/// trace's step ``k``. Under a policy that is not the full model, ``overlap``
/// compares the policy's routing of the same tokens with the full model's.
#[pyclass(module = "lcut", name = "Routing", frozen)]
pub struct Routing {
    routing: RoutingTrace,
}

impl Routing {
    /// The routing a trace recorded.
    pub fn new(routing: RoutingTrace) -> Self {
        Self { routing }
    }
}

#[pymethods]
impl Routing {
    /// Experts in each sparse layer.
    #[getter]
    fn num_experts(&self) -> usize {
        self.routing.num_experts
    }

    /// Experts each token runs.
    #[getter]
    fn top_k(&self) -> usize {
        self.routing.top_k
    }

    /// The sparse layers, ascending (the arrays' rows).
    #[getter]
    fn layers(&self) -> Vec<usize> {
        self.routing.layers.clone()
    }

    /// Decode steps routed.
    #[getter]
    fn num_steps(&self) -> usize {
        self.routing.num_steps()
    }

    /// float32 [sparse layers, steps]: the router's entropy over the experts,
    /// divided by ln(num_experts): 0 = one expert takes all the probability,
    /// 1 = uniform.
    #[getter]
    fn entropy(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let t = &self.routing.entropy;
        f32_array(py, t.data().to_vec(), &t.shape())
    }

    /// uint32 [sparse layers, steps, top_k]: the experts each step runs, most
    /// probable first.
    #[getter]
    fn experts(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let shape = [
            self.routing.layers.len(),
            self.routing.num_steps(),
            self.routing.top_k,
        ];
        array(py, self.routing.experts.clone(), &shape)
    }

    /// float32 [sparse layers, num_experts]: the share of the steps' top-k
    /// slots each expert takes at each sparse layer (each row sums to 1).
    #[getter]
    fn load(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (e, k) = (self.routing.num_experts, self.routing.top_k);
        let rows = self.routing.layers.len();
        let mut load = vec![0f32; rows * e];
        let per_row = self.routing.num_steps() * k;
        for (row, chosen) in self.routing.experts.chunks(per_row.max(1)).enumerate() {
            for &x in chosen {
                if let Some(slot) = load.get_mut(row * e + x as usize) {
                    *slot += 1.0 / per_row as f32;
                }
            }
        }
        f32_array(py, load, &[rows, e])
    }

    /// float32 [sparse layers, steps]: the share of the top-k experts the
    /// policy's routing keeps from the full model's on the same tokens, or
    /// None (a full-depth trace).
    #[getter]
    fn overlap(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.routing
            .overlap
            .as_ref()
            .map(|o| f32_array(py, o.overlap.data().to_vec(), &o.overlap.shape()))
            .transpose()
    }

    /// The policy ``overlap`` compares with the full model, or None.
    #[getter]
    fn policy(&self) -> Option<String> {
        self.routing.overlap.as_ref().map(|o| o.policy.clone())
    }

    fn __repr__(&self) -> String {
        format!(
            "Routing({} sparse layers, {} experts, top {}, {} steps{})",
            self.routing.layers.len(),
            self.routing.num_experts,
            self.routing.top_k,
            self.routing.num_steps(),
            match &self.routing.overlap {
                Some(o) => format!(", overlap with the full model under {}", o.policy),
                None => String::new(),
            }
        )
    }
}
