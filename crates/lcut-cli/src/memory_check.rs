//! What a run will need in memory, said before the weights are loaded, and
//! the refusal of a run that cannot fit (unless `--force`); after the run,
//! what it held at its peak.

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use lcut_model::WeightMode;
use lcut_model::memory::{MemoryEstimate, available_bytes, format_bytes, resident_bytes};

/// Environment variable that sets the free memory lcut assumes, in bytes
/// or with a K/M/G/T suffix (powers of 1024): for a machine whose own
/// figure is wrong (a container showing the host's memory), or to try the
/// refusal.
pub const AVAILABLE_ENV: &str = "LCUT_AVAILABLE_MEMORY";

/// Parse a byte count such as `512M`, `24G`, `1.5G` or `1000000`.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (num, shift) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        Some('T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)
        .with_context(|| format!("{s:?} is not a byte count like 512M, 24G or 1000000"))?;
    Ok((n * (1u64 << shift) as f64) as u64)
}

/// The free memory of `device`: [`AVAILABLE_ENV`] when set, else what the
/// device reports (`None` when it cannot be read).
pub fn available(device: &Device) -> Result<Option<u64>> {
    match std::env::var(AVAILABLE_ENV) {
        Ok(v) => Ok(Some(
            parse_bytes(&v).with_context(|| format!("reading {AVAILABLE_ENV}"))?,
        )),
        Err(_) => Ok(available_bytes(device)),
    }
}

/// How a run that does not fit may be made smaller, for the message:
/// only what the command offers is suggested.
pub struct Remedies {
    /// The command has `--prefill-chunk`.
    pub chunk_option: bool,
    /// The weights and activations are dense f32 (`--dtype bf16` would
    /// halve them; not so for a GGUF kept quantized).
    pub f32_run: bool,
    /// `--force` exists for this command.
    pub forcible: bool,
}

/// Refuse `need` of `what` (`"4096 tokens"`, `"8 prompts of at most 1024
/// tokens"`) when it exceeds `free`, naming the figures and what to change.
pub fn refuse_if_short(
    what: &str,
    need: &MemoryEstimate,
    (free, device): (Option<u64>, &Device),
    remedies: &Remedies,
) -> Result<()> {
    let Some(free) = free else { return Ok(()) };
    if need.total() <= free {
        return Ok(());
    }
    let where_ = if device.is_cpu() {
        "this machine"
    } else {
        "the GPU"
    };
    let chunk = if remedies.chunk_option {
        ", a smaller --prefill-chunk"
    } else {
        ""
    };
    let smaller = if remedies.f32_run {
        ", or --dtype bf16"
    } else {
        ""
    };
    let force = if remedies.forcible {
        "; --force tries anyway"
    } else {
        ""
    };
    bail!(
        "{what} will need about {need}, more than {where_} has free ({}); use shorter \
         prompts{chunk}{smaller}{force}",
        format_bytes(free)
    );
}

/// The code a run pages in after it is sized (the model's, the kernels',
/// the report writer's): 2.5 to 3.5 MiB measured on `diagnose` and
/// `generate` of the bundled model, where it is most of what the weights
/// leave; counted with the process's resident memory.
const RUN_CODE_BYTES: u64 = 4 << 20;

/// Say what a run of `what` will need (`need`, plus what the process
/// already holds: runtime, tokenizer) and what `device` has free, then
/// refuse it when it does not fit, unless `force` (then warn and go on).
/// Returns the estimate with the process's part, for [`report_peak`].
pub fn check_before_loading(
    what: &str,
    need: &MemoryEstimate,
    (device, mode): (&Device, WeightMode),
    force: bool,
) -> Result<MemoryEstimate> {
    // a GPU's memory does not hold the host process
    let process = if device.is_cpu() {
        resident_bytes().map_or(0, |(now, _)| now + RUN_CODE_BYTES)
    } else {
        0
    };
    let need = &need.with_process(process);
    let free = available(device)?;
    let free_text = free.map_or("unknown".into(), format_bytes);
    eprintln!("memory: {what} will need about {need}; free {free_text}");
    let remedies = Remedies {
        chunk_option: false,
        f32_run: mode == WeightMode::Dense(DType::F32),
        forcible: true,
    };
    match refuse_if_short(what, need, (free, device), &remedies) {
        Err(e) if force => {
            eprintln!("warning: --force: {e}");
            Ok(*need)
        }
        other => other.map(|()| *need),
    }
}

/// On a GPU, say which attention the model's layers run: lcut's fused
/// kernel, or the materialised scores and why not the kernel (a dtype or
/// head width it does not take, `LCUT_FUSED_ATTENTION=0`). Nothing on the
/// CPU, whose attention kernels take every layer.
pub fn say_attention_path(model: &lcut_model::Decoder) {
    if !model.device().is_cuda() {
        return;
    }
    let why_not = model.config().layer_attention.iter().find_map(|a| {
        lcut_model::fused_attention_refusal(model.device(), model.dtype(), a.head_dim)
    });
    match why_not {
        None => eprintln!("attention: lcut's fused kernel in every layer"),
        Some(why) => eprintln!("attention: materialised scores, not the fused kernel: {why}"),
    }
}

/// Say what the process held at its peak beside the estimate (on hosts
/// that report it). On a GPU the estimate is of the device's memory and
/// the peak is the host process's, which holds the driver's context but
/// neither weights nor K/V: the line says so rather than setting them side
/// by side.
pub fn report_peak(need: &MemoryEstimate, device: &Device) {
    if let Some((_, peak)) = resident_bytes() {
        eprintln!("{}", peak_line(peak, need, device.is_cpu()));
    }
}

/// The line [`report_peak`] prints.
fn peak_line(peak: u64, need: &MemoryEstimate, on_cpu: bool) -> String {
    if on_cpu {
        format!(
            "memory: peak resident {} (estimate {})",
            format_bytes(peak),
            format_bytes(need.total())
        )
    } else {
        format!(
            "memory: the host process's peak resident {}; the GPU's estimate was {} (the GPU's own peak is not read)",
            format_bytes(peak),
            format_bytes(need.total())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a GPU the host's peak is not set beside the device's estimate as
    /// if they measured the same memory.
    #[test]
    fn the_peak_line_says_whose_memory_it_is() {
        let need = MemoryEstimate {
            weights: 10 << 20,
            kv: 0,
            states: 0,
            attention: 0,
            activations: 0,
            records: 0,
            process: 0,
        };
        let cpu = peak_line(180 << 20, &need, true);
        assert_eq!(cpu, "memory: peak resident 180.0 MiB (estimate 10.0 MiB)");
        let gpu = peak_line(440 << 20, &need, false);
        assert!(
            gpu.contains("host process's peak resident 440.0 MiB"),
            "{gpu}"
        );
        assert!(gpu.contains("GPU's estimate was 10.0 MiB"), "{gpu}");
        assert!(!gpu.contains("(estimate"), "{gpu}");
    }

    #[test]
    fn byte_counts_parse() {
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("24g").unwrap(), 24 << 30);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("2KB").unwrap(), 2048);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("-1G").is_err());
    }

    /// A run larger than the memory given is refused with the figures and
    /// the ways out; one that fits, or on a machine that does not say, runs.
    #[test]
    fn a_run_over_the_limit_is_refused_with_its_parts() {
        let need = MemoryEstimate {
            weights: 3 << 30,
            kv: 1 << 30,
            states: 0,
            attention: 0,
            activations: 0,
            records: 1 << 20,
            process: 0,
        };
        let remedies = Remedies {
            chunk_option: true,
            f32_run: true,
            forcible: true,
        };
        let cpu = Device::Cpu;
        let err = refuse_if_short("2 prompts", &need, (Some(2 << 30), &cpu), &remedies)
            .unwrap_err()
            .to_string();
        for part in [
            "2 prompts",
            "weights 3.0",
            "K/V 1.0",
            "this machine has free (2.0 GiB)",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
        assert!(
            err.contains("--dtype bf16") && err.contains("--force"),
            "{err}"
        );
        assert!(refuse_if_short("x", &need, (Some(5 << 30), &cpu), &remedies).is_ok());
        assert!(refuse_if_short("x", &need, (None, &cpu), &remedies).is_ok());
    }
}
