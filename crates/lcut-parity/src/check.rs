//! The check `lcut parity` runs: every logits tensor of a reference case
//! computed on a device and dtype, measured against transformers' f32
//! logits (and, optionally, against lcut on the CPU in f32 and against
//! transformers' own logits in the same dtype), and held to a [`Tolerance`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use crate::deviation::{Deviation, deviation};
use crate::error::{ParityError, Result};
use crate::reference::{LogitPair, ReferenceCase};
use crate::tolerance::{SAME_DTYPE_FACTOR, Tolerance};

/// One row of the parity table.
#[derive(Debug, Serialize)]
pub struct ParityRow {
    /// The case's name.
    pub case: String,
    /// `logits` or a policy's key.
    pub logits: String,
    /// Rows of logits compared.
    pub rows: usize,
    /// lcut's deviation from transformers' f32 logits.
    pub vs_transformers: Deviation,
    /// lcut's deviation from itself on the CPU in f32, when compared.
    pub vs_cpu_f32: Option<Deviation>,
    /// transformers' own deviation from its f32 logits, in lcut's dtype.
    pub transformers_same_dtype: Option<Deviation>,
    /// Whether the row is within the tolerance (and within
    /// [`SAME_DTYPE_FACTOR`] times transformers' own deviation, when known).
    pub pass: bool,
}

/// The whole check, as `lcut parity --json` writes it.
#[derive(Debug, Serialize)]
pub struct ParityReport {
    /// The device, as written on the command line.
    pub device: String,
    /// The dtype, as written on the command line.
    pub dtype: String,
    /// The bounds held.
    pub tolerance: Tolerance,
    /// Every logits tensor of every case.
    pub rows: Vec<ParityRow>,
    /// Whether every row passed.
    pub pass: bool,
}

/// How one case is checked.
#[derive(Debug, Clone, Copy)]
pub struct CheckOptions<'a> {
    /// Weights and cache dtype.
    pub dtype: DType,
    /// The device the decoder runs on.
    pub device: &'a Device,
    /// Also compare with lcut on the CPU in f32.
    pub compare_with_cpu: bool,
    /// A folder of transformers' logits in the same dtype, one
    /// `<case>.safetensors` each.
    pub transformers_logits: Option<&'a Path>,
    /// The bounds held.
    pub tolerance: &'a Tolerance,
}

/// transformers' own logits for `case` in lcut's dtype, read from `folder`.
type SameDtype = (PathBuf, HashMap<String, Tensor>);

/// Check the reference case in `dir`: one row per logits tensor.
pub fn check_case(dir: &Path, opts: &CheckOptions) -> Result<Vec<ParityRow>> {
    let failed = |step, case: String| {
        move |source| ParityError::Case {
            step,
            case,
            source: Box::new(source),
        }
    };
    let shown = dir.display().to_string();
    let case = ReferenceCase::load(dir).map_err(failed("reading", shown.clone()))?;
    let model = case
        .model(opts.dtype, opts.device)
        .map_err(failed("loading", shown))?;
    let pairs = case
        .logit_pairs(&model)
        .map_err(failed("running", case.name.clone()))?;
    let cpu_pairs = if opts.compare_with_cpu {
        let cpu_model = case.model(DType::F32, &Device::Cpu)?;
        Some(case.logit_pairs(&cpu_model)?)
    } else {
        None
    };
    let same_dtype = opts
        .transformers_logits
        .map(|d| same_dtype_logits(&d.join(format!("{}.safetensors", case.name))))
        .transpose()?;
    pairs
        .iter()
        .enumerate()
        .map(|(i, pair)| {
            let cpu = cpu_pairs.as_ref().map(|cpu| &cpu[i]);
            row(&case, pair, cpu, same_dtype.as_ref(), opts.tolerance)
        })
        .collect()
}

/// The file of transformers' logits at `path`.
fn same_dtype_logits(path: &Path) -> Result<SameDtype> {
    candle_core::safetensors::load(path, &Device::Cpu)
        .map_err(|source| ParityError::TransformersLogits {
            path: path.to_path_buf(),
            source,
        })
        .map(|t| (path.to_path_buf(), t))
}

/// The row of one logits tensor.
fn row(
    case: &ReferenceCase,
    pair: &LogitPair,
    cpu: Option<&LogitPair>,
    same_dtype: Option<&SameDtype>,
    tolerance: &Tolerance,
) -> Result<ParityRow> {
    let vs_ref = deviation(&pair.ours, &pair.reference)?;
    let vs_cpu = cpu
        .map(|cpu| deviation(&pair.ours, &cpu.ours))
        .transpose()?;
    let theirs = same_dtype
        .map(|(path, tensors)| {
            let (key, first) = &pair.reference_rows;
            let t = tensors
                .get(key)
                .ok_or_else(|| ParityError::MissingLogits {
                    path: path.clone(),
                    key: key.clone(),
                })?
                .narrow(0, *first, pair.reference.dim(0)?)?;
            Ok::<_, ParityError>(deviation(&t.to_dtype(DType::F32)?, &pair.reference)?)
        })
        .transpose()?;
    let within_theirs = theirs
        .as_ref()
        .is_none_or(|t| vs_ref.mean_abs <= SAME_DTYPE_FACTOR * t.mean_abs);
    Ok(ParityRow {
        case: case.name.clone(),
        logits: pair.key.clone(),
        rows: pair.ours.dim(0)?,
        pass: tolerance.holds(&vs_ref) && within_theirs,
        vs_transformers: vs_ref,
        vs_cpu_f32: vs_cpu,
        transformers_same_dtype: theirs,
    })
}
