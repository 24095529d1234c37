//! `lcut parity`: check the engine on a device and dtype against the
//! transformers reference cases, and against itself on the CPU in f32.

use std::path::PathBuf;

use anyhow::{Result, bail};
use candle_core::DType;
use clap::Args;
use lcut_parity::{
    CheckOptions, ParityReport, ParityRow, ReferenceCase, SAME_DTYPE_FACTOR, Tolerance, check_case,
};

use crate::args::{DeviceArg, DtypeArg};
use crate::common::write_atomic;

/// Where the reference cases live, relative to the repository root.
const REFERENCE_CASES: &str = "fixtures/oracle";

/// Arguments of `lcut parity`.
#[derive(Debug, Args)]
pub struct ParityArgs {
    /// Folder of reference cases (each with case.json, config.json,
    /// model.safetensors, reference.safetensors); the bundled ones by default.
    #[arg(long)]
    cases: Option<PathBuf>,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: DeviceArg,
    /// Weights and cache dtype: f32, bf16, f16.
    #[arg(long, default_value = "f32", ignore_case = true)]
    dtype: DtypeArg,
    /// transformers' logits for the same cases in the same dtype, one
    /// `<case>.safetensors` each (fixtures/oracle/hf_dtype_logits.py makes
    /// them; fixtures/oracle/bf16 holds bf16 ones from the CPU). lcut's mean
    /// deviation from the f32 reference must then stay within
    /// 1.5 x transformers' own.
    #[arg(long)]
    transformers_logits: Option<PathBuf>,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Run `lcut parity`; fails (non-zero exit) when a case is out of tolerance.
pub fn run(args: &ParityArgs) -> Result<()> {
    let device = args.device.open()?;
    let dtype = args.dtype.dtype();
    let root = args
        .cases
        .clone()
        .unwrap_or_else(|| lcut_engine::bundled(REFERENCE_CASES));
    let tolerance = Tolerance::for_dtype(dtype);
    let compare_with_cpu = !(device.is_cpu() && dtype == DType::F32);
    let opts = CheckOptions {
        dtype,
        device: &device,
        compare_with_cpu,
        transformers_logits: args.transformers_logits.as_deref(),
        tolerance: &tolerance,
    };
    let mut rows = Vec::new();
    for dir in ReferenceCase::list(&root)? {
        rows.extend(check_case(&dir, &opts)?);
    }
    print_table(
        &rows,
        &args.device.to_string(),
        &args.dtype.to_string(),
        &tolerance,
    );
    let fused = lcut_model::check_fused_attention(&device, dtype)?;
    print_fused(&fused);
    let pass = rows.iter().all(|r| r.pass) && fused.iter().all(|c| c.pass);
    let report = ParityReport {
        device: args.device.to_string(),
        dtype: args.dtype.to_string(),
        tolerance,
        rows,
        pass,
    };
    if let Some(path) = &args.json {
        let mut json = serde_json::to_value(&report)?;
        if !fused.is_empty() {
            json["fused_attention"] = serde_json::to_value(&fused)?;
        }
        write_atomic(path, serde_json::to_string_pretty(&json)?.as_bytes())?;
        eprintln!("wrote {}", path.display());
    }
    if !pass {
        bail!(
            "some logits are outside the {} tolerance on {} (see the table above)",
            args.dtype,
            args.device
        );
    }
    Ok(())
}

/// The fused attention kernel's own check, where the device runs it.
fn print_fused(checks: &[lcut_model::FusedAttentionCheck]) {
    if checks.is_empty() {
        return;
    }
    println!(
        "fused attention against the CPU's exact attention on the same inputs (max|d| over max|v| <= {:.2e}, log-sum-exp <= 1e-3)",
        checks[0].bound
    );
    println!(
        "{:<52} {:>11} {:>11} {:>5}",
        "case", "max|d|", "lse max|d|", "ok"
    );
    for c in checks {
        println!(
            "{:<52} {:>11.3e} {:>11.3e} {:>5}",
            c.case,
            c.max_abs,
            c.lse_max_abs,
            if c.pass { "yes" } else { "NO" }
        );
    }
}

fn print_table(rows: &[ParityRow], device: &str, dtype: &str, tolerance: &Tolerance) {
    println!(
        "parity on {device} in {dtype} against transformers (f32): {}",
        tolerance.describe()
    );
    if rows.iter().any(|r| r.transformers_same_dtype.is_some()) {
        println!(
            "and mean |d| <= {SAME_DTYPE_FACTOR} x that of transformers itself in {dtype} (column hf-{dtype})"
        );
    }
    println!(
        "{:<20} {:<30} {:>4} {:>11} {:>11} {:>8} {:>6} {:>11} {:>11} {:>5}",
        "case",
        "logits",
        "rows",
        "max|d| hf",
        "mean|d| hf",
        "scale",
        "top1",
        "max|d| cpu",
        format!("hf-{dtype}"),
        "ok"
    );
    for r in rows {
        let cpu = r
            .vs_cpu_f32
            .as_ref()
            .map_or("-".to_string(), |d| format!("{:.3e}", d.max_abs));
        let theirs = r
            .transformers_same_dtype
            .as_ref()
            .map_or("-".to_string(), |d| format!("{:.3e}", d.mean_abs));
        println!(
            "{:<20} {:<30} {:>4} {:>11.3e} {:>11.3e} {:>8.3} {:>6.3} {:>11} {:>11} {:>5}",
            r.case,
            r.logits,
            r.rows,
            r.vs_transformers.max_abs,
            r.vs_transformers.mean_abs,
            r.vs_transformers.scale,
            r.vs_transformers.top1_agreement,
            cpu,
            theirs,
            if r.pass { "yes" } else { "NO" }
        );
    }
}
