//! Typed values of the command line (weight dtypes, devices, policies and
//! policy lists), parsed by clap so that a bad value is reported with the
//! valid choices before a command runs.

use std::fmt;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use clap::ValueEnum;
use clap::builder::PossibleValue;
use lcut_model::WeightMode;
use lcut_policy::PolicySpec;

/// `--dtype` where every weight is converted to one float type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// 32-bit floats.
    #[value(alias = "float32")]
    F32,
    /// bfloat16.
    #[value(alias = "bfloat16")]
    Bf16,
    /// IEEE half precision.
    #[value(alias = "float16")]
    F16,
}

impl DtypeArg {
    /// The candle dtype.
    pub fn dtype(self) -> DType {
        match self {
            DtypeArg::F32 => DType::F32,
            DtypeArg::Bf16 => DType::BF16,
            DtypeArg::F16 => DType::F16,
        }
    }
}

impl fmt::Display for DtypeArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_possible_value() {
            Some(v) => f.write_str(v.get_name()),
            None => write!(f, "{self:?}"),
        }
    }
}

/// `--dtype` of the commands that load a model: weights converted to a
/// float type, or a GGUF's matrices kept quantized (`q`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightArg {
    /// Weights converted to this float type.
    Dense(DtypeArg),
    /// A GGUF file's matrices in their quantized type, activations in f32.
    Q,
}

impl ValueEnum for WeightArg {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            WeightArg::Dense(DtypeArg::F32),
            WeightArg::Dense(DtypeArg::Bf16),
            WeightArg::Dense(DtypeArg::F16),
            WeightArg::Q,
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            WeightArg::Dense(d) => d.to_possible_value(),
            WeightArg::Q => Some(PossibleValue::new("q").alias("quantized")),
        }
    }
}

impl WeightArg {
    /// The name it is given by on the command line (`f32`, `bf16`, `f16`, `q`).
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string())
    }

    /// How the weights are loaded.
    pub fn mode(self) -> WeightMode {
        match self {
            WeightArg::Dense(d) => WeightMode::Dense(d.dtype()),
            WeightArg::Q => WeightMode::Quantized,
        }
    }
}

/// `--kv-dtype`: how the K/V cache is stored. `auto` is f16 for `--dtype q`
/// (llama.cpp's default: half the bytes a decode step reads of the cache)
/// and the activations' dtype otherwise (f32: the exact path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvDtypeArg {
    /// f16 with `--dtype q`, the weights' dtype otherwise.
    Auto,
    /// 32-bit floats (the exact path).
    #[value(alias = "float32")]
    F32,
    /// IEEE half precision.
    #[value(alias = "float16")]
    F16,
    /// bfloat16.
    #[value(alias = "bfloat16")]
    Bf16,
}

impl KvDtypeArg {
    /// The cache's dtype for weights loaded as `mode`.
    pub fn dtype(self, mode: WeightMode) -> DType {
        match (self, mode) {
            (KvDtypeArg::Auto, mode) => mode.default_kv_dtype(),
            (KvDtypeArg::F32, _) => DType::F32,
            (KvDtypeArg::F16, _) => DType::F16,
            (KvDtypeArg::Bf16, _) => DType::BF16,
        }
    }
}

/// `--device`: `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    /// The CPU.
    Cpu,
    /// The CUDA device of this ordinal.
    Cuda(usize),
}

impl FromStr for DeviceArg {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let expected = "expected cpu, cuda or cuda:N";
        match s.trim().to_ascii_lowercase().split_once(':') {
            None if s.eq_ignore_ascii_case("cpu") => Ok(DeviceArg::Cpu),
            None if s.eq_ignore_ascii_case("cuda") => Ok(DeviceArg::Cuda(0)),
            Some(("cuda", n)) => n
                .parse()
                .map(DeviceArg::Cuda)
                .map_err(|_| format!("CUDA ordinal {n:?} is not a number; {expected}")),
            _ => Err(format!("unknown device {s:?}; {expected}")),
        }
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceArg::Cpu => f.write_str("cpu"),
            DeviceArg::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceArg {
    /// Open the device (CUDA only in a build with the `cuda` feature).
    pub fn open(self) -> Result<Device> {
        match self {
            DeviceArg::Cpu => Ok(Device::Cpu),
            DeviceArg::Cuda(_) if !cfg!(feature = "cuda") => {
                bail!(
                    "--device {self}: this lcut was built without CUDA (build with --features cuda)"
                )
            }
            DeviceArg::Cuda(n) => {
                Device::new_cuda(n).with_context(|| format!("opening CUDA device {n}"))
            }
        }
    }
}

/// Policies separated by `,` or `;` (a SlimInfer cut list such as
/// `slim:9@50%,19@25%` stays whole), each parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyList(pub Vec<PolicySpec>);

impl FromStr for PolicyList {
    type Err = lcut_policy::PolicyError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        PolicySpec::parse_list(s).map(PolicyList)
    }
}

impl PolicyList {
    /// Each policy written out (what the LoRA warnings read).
    pub fn texts(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// A command with every typed value, as the subcommands declare them.
    #[derive(Debug, Parser)]
    struct Probe {
        #[arg(long, default_value = "f32", ignore_case = true)]
        dtype: WeightArg,
        #[arg(long, default_value = "f32", ignore_case = true)]
        dense: DtypeArg,
        #[arg(long, default_value = "cpu")]
        device: DeviceArg,
        #[arg(long, default_value = "full")]
        policy: PolicySpec,
        #[arg(long, default_value = "full")]
        policies: PolicyList,
        #[arg(long, value_enum, default_value = "auto", ignore_case = true)]
        kv_dtype: KvDtypeArg,
    }

    fn parse(args: &[&str]) -> std::result::Result<Probe, String> {
        Probe::try_parse_from(std::iter::once("probe").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn good_values_parse() {
        let p = parse(&[
            "--dtype",
            "Q",
            "--dense",
            "bfloat16",
            "--device",
            "cuda:1",
            "--policy",
            "speed:3/4+bos",
            "--policies",
            "full,slim:9@50%,19@25%;speed:2",
        ])
        .unwrap();
        assert_eq!(p.dtype.mode(), WeightMode::Quantized);
        assert_eq!(p.kv_dtype.dtype(p.dtype.mode()), DType::F16);
        assert_eq!(
            KvDtypeArg::Auto.dtype(WeightMode::Dense(DType::F32)),
            DType::F32
        );
        assert_eq!(p.dense.dtype(), DType::BF16);
        assert_eq!(p.device, DeviceArg::Cuda(1));
        assert_eq!(p.policy.to_string(), "speed:0.75+bos");
        assert_eq!(p.policies.0.len(), 3);
        assert_eq!(p.policies.texts()[0], "full");
        assert!(parse(&[]).unwrap().device.open().unwrap().is_cpu());
    }

    #[test]
    fn bad_values_are_reported_with_the_choices() {
        let e = parse(&["--dtype", "f64"]).unwrap_err();
        assert!(
            e.contains("f32") && e.contains("bf16") && e.contains("q"),
            "{e}"
        );
        let e = parse(&["--dense", "q"]).unwrap_err();
        assert!(e.contains("possible values: f32, bf16, f16"), "{e}");
        let e = parse(&["--device", "tpu"]).unwrap_err();
        assert!(e.contains("cpu, cuda or cuda:N"), "{e}");
        assert!(parse(&["--device", "cuda:x"]).is_err());
        let e = parse(&["--policy", "speedy:3"]).unwrap_err();
        assert!(e.contains("--policy") && e.contains("speedy"), "{e}");
        assert!(parse(&["--policies", "full,bogus"]).is_err());
    }
}
