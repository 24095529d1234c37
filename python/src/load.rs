//! `lcut.load`: a model folder or GGUF file opened as a session, with the
//! dtype, device and LoRA adapter given as the command line's options are.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use lcut_model::WeightMode;
use lcut_model::lora::LoraMode;
use pyo3::prelude::*;

use crate::errors::{ErrorKind, engine_err, invalid, lcut_error};

/// How a session was opened: enough to open the same model again (the
/// base model an adapted session is compared with).
#[derive(Debug, Clone)]
pub struct LoadSource {
    /// The model folder or `.gguf` file.
    pub path: PathBuf,
    /// How the weights are held.
    pub mode: WeightMode,
    /// The device, as given.
    pub device_name: String,
    /// The device.
    pub device: Device,
    /// The LoRA adapter folder, when one was put in.
    pub lora: Option<PathBuf>,
}

/// `dtype` as the command line's `--dtype` reads it.
pub fn weight_mode(dtype: &str) -> PyResult<WeightMode> {
    Ok(match dtype.trim().to_ascii_lowercase().as_str() {
        "f32" | "float32" => WeightMode::Dense(DType::F32),
        "bf16" | "bfloat16" => WeightMode::Dense(DType::BF16),
        "f16" | "float16" => WeightMode::Dense(DType::F16),
        "q" | "quantized" => WeightMode::Quantized,
        _ => {
            return Err(invalid(format!(
                "dtype {dtype:?} is not one lcut reads: expected f32, bf16, f16 or q \
                 (a GGUF's matrices kept quantized)"
            )));
        }
    })
}

/// `device` as the command line's `--device` reads it: cpu, cuda, cuda:N.
pub fn open_device(device: &str) -> PyResult<Device> {
    let expected = "expected \"cpu\", \"cuda\" or \"cuda:N\"";
    let ordinal = match device.trim().to_ascii_lowercase().as_str() {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => n,
            _ => return Err(invalid(format!("unknown device {device:?}; {expected}"))),
        },
    };
    if !cfg!(feature = "cuda") {
        return Err(invalid(format!(
            "device {device:?}: this build of lcut has no CUDA support \
             (build the package with the `cuda` feature on a machine with the CUDA toolkit)"
        )));
    }
    Device::new_cuda(ordinal)
        .map_err(|e| lcut_error(ErrorKind::Other, format!("opening {device:?}: {e}")))
}

/// The model path given, or the bundled model of the source tree the
/// package was built from.
pub fn model_path(path: Option<PathBuf>) -> PathBuf {
    path.unwrap_or_else(|| lcut_engine::bundled(lcut_engine::BUNDLED_MODEL))
}

/// A `NotFoundError` unless `path` exists.
pub fn require_exists(path: &Path, what: &str) -> PyResult<()> {
    if path.exists() {
        Ok(())
    } else {
        Err(lcut_error(
            ErrorKind::NotFound,
            format!("{what} {} does not exist", path.display()),
        ))
    }
}

/// Open the session `source` describes (without the GIL: loading and
/// converting weights takes seconds).
pub fn open(py: Python<'_>, source: &LoadSource) -> PyResult<lcut_engine::Session> {
    // a path, a Hugging Face cache name (ORG/NAME[@REV]) or an Ollama name
    // (NAME:TAG), resolved on disk as the command line does
    let roots = lcut_model::store::StoreRoots::from_env();
    let resolved =
        lcut_model::store::resolve(&source.path, &roots).map_err(crate::errors::store_err)?;
    if let Some(dir) = &source.lora {
        require_exists(dir, "LoRA adapter folder")?;
    }
    crate::errors::detached(py, || {
        let mut session =
            lcut_engine::Session::load_resolved(&resolved, source.mode, &source.device)
                .map_err(engine_err)?;
        // the cache in the command line's `--kv-dtype auto`
        session
            .model
            .set_kv_dtype(source.mode.default_kv_dtype())
            .map_err(|e| engine_err(e.into()))?;
        if let Some(dir) = &source.lora {
            let used = session
                .put_adapter(dir, LoraMode::Merge, &[])
                .map_err(engine_err)?;
            for line in &used.warnings {
                eprintln!("warning: {line}");
            }
        }
        Ok(session)
    })
}
