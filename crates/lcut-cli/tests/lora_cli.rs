//! `--lora DIR` on the command line: `lcut forward` with the adapter Python
//! `peft` wrote for llama-gqa gives peft's logits (merged and on the fly),
//! says which policy the adapter was trained for, warns when the run's
//! policy is another, and a bad adapter is a named error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Result, ensure};
use candle_core::{DType, Device, Tensor};
use lcut_testkit::{assert_mentions, oracle_case, workspace_root};

fn lora_dir() -> PathBuf {
    workspace_root().join("fixtures/oracle/lora")
}

fn forward(ids: &str, extra: &[&str], out: &Path) -> Result<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_lcut"))
        .arg("forward")
        .arg("--model")
        .arg(oracle_case("llama-gqa"))
        .args(["--ids", ids, "--no-attention"])
        .args(extra)
        .arg("--out")
        .arg(out)
        .output()?)
}

#[test]
fn forward_with_peft_adapter_gives_peft_logits() -> Result<()> {
    let reference =
        candle_core::safetensors::load(lora_dir().join("reference.safetensors"), &Device::Cpu)?;
    let ids: Vec<u32> = reference["input_ids"].to_dtype(DType::U32)?.to_vec1()?;
    let ids = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let want = &reference["logits"];
    let adapter = lora_dir().join("adapter");
    let adapter = adapter.to_string_lossy();
    let tmp = tempfile::tempdir()?;
    for mode in ["merge", "fly"] {
        let out = tmp.path().join(format!("{mode}.safetensors"));
        let run = forward(&ids, &["--lora", &adapter, "--lora-mode", mode], &out)?;
        let stderr = String::from_utf8_lossy(&run.stderr);
        ensure!(run.status.success(), "{stderr}");
        assert_mentions(
            &stderr,
            &[
                "trained for policy speed:4+bos",
                "warning",
                "uses policy full",
            ],
        );
        let got = candle_core::safetensors::load(&out, &Device::Cpu)?;
        let logits: &Tensor = &got["logits"];
        let rows = want.dim(0)?;
        let logits = logits.narrow(0, logits.dim(0)? - rows, rows)?;
        let d = (logits - want)?
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        ensure!(d <= 1e-4, "{mode}: logits differ from peft's by {d:e}");
    }
    // the adapter's own policy: no warning
    let out = tmp.path().join("speed.safetensors");
    let run = forward(
        &ids,
        &[
            "--lora",
            &adapter,
            "--policy",
            "speed:4/6+bos",
            "--decode-start",
            "28",
        ],
        &out,
    )?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    ensure!(
        run.status.success() && !stderr.contains("warning"),
        "{stderr}"
    );
    Ok(())
}

#[test]
fn bad_adapter_on_the_command_line_is_a_named_error() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("adapter");
    std::fs::create_dir(&dir)?;
    std::fs::copy(
        lora_dir().join("adapter/adapter_model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )?;
    std::fs::write(
        dir.join("adapter_config.json"),
        r#"{"r": 3, "lora_alpha": 6, "target_modules": ["q_proj"]}"#,
    )?;
    let run = forward(
        "1,5,9",
        &["--lora", &dir.to_string_lossy()],
        &tmp.path().join("o.safetensors"),
    )?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    ensure!(!run.status.success(), "accepted: {stderr}");
    assert_mentions(
        &stderr,
        &["adapter_model.safetensors", "r = 3", "LoRA adapter"],
    );
    Ok(())
}

/// `generate --lora A --compare P` sets the adapted model beside the base
/// model it was made from: the reference lane runs without the adapter, so
/// the two lanes' logits differ even under the same policy.
#[test]
fn generate_compares_the_adapted_model_with_its_base() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let adapter = lora_dir().join("adapter");
    let run = |extra: &[&str], name: &str| -> Result<serde_json::Value> {
        let json = tmp.path().join(name);
        let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
            .arg("generate")
            .arg("--model")
            .arg(oracle_case("llama-gqa"))
            .args(["--ids", "1,5,9,3", "--policy", "full", "--compare", "full"])
            .args(["--max-new-tokens", "3", "--json"])
            .arg(&json)
            .args(extra)
            .output()?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&std::fs::read(&json)?)?)
    };
    let first_kl = |v: &serde_json::Value| v["steps"][0]["kl"][1].as_f64().unwrap_or(f64::NAN);
    let plain = run(&[], "plain.json")?;
    ensure!(
        first_kl(&plain) < 1e-9,
        "one model against itself: {}",
        plain["steps"][0]
    );
    let adapted = run(&["--lora", &adapter.to_string_lossy()], "adapted.json")?;
    ensure!(
        first_kl(&adapted) > 1e-6,
        "the adapted model against its base: {}",
        adapted["steps"][0]
    );
    Ok(())
}
