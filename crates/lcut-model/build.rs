//! With the `cuda` feature: compiles lcut's fused attention kernel
//! (`cuda/flash_attention.cu`) to PTX with `nvcc` (or `$NVCC`), for compute
//! capability `$CUDA_COMPUTE_CAP` (default 80: the kernel's tensor-core
//! products need 8.0; the driver compiles the PTX for newer GPUs when it is
//! first loaded). Without the feature nothing is built.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let source = "cuda/flash_attention.cu";
    println!("cargo::rerun-if-changed={source}");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=NVCC");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("flash_attention.ptx");
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "80".into());
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let status = Command::new(&nvcc)
        .args(["--ptx", "-O3", "-std=c++17", "-lineinfo"])
        .arg(format!("-arch=compute_{cap}"))
        .arg("-o")
        .arg(&out)
        .arg(source)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{nvcc} failed on {source} ({s})"),
        Err(e) => panic!("the cuda feature needs nvcc to build {source}: running {nvcc}: {e}"),
    }
}
