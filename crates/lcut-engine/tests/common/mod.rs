//! Prompts lcut-engine's tests share: an oracle case's token ids (from its
//! `lens.safetensors`) and prompts cut from a case's ids.

#![allow(dead_code)] // each test binary uses its own part

use anyhow::Result;
use lcut_engine::PreparedPrompt;
use lcut_engine::diagnose::LabelledPrompt;
use lcut_model::{DType, Device};
use lcut_testkit::oracle_case;

/// The token ids of oracle case `case`'s lens reference.
pub fn ids(case: &str) -> Result<Vec<u32>> {
    let r =
        candle_core::safetensors::load(oracle_case(case).join("lens.safetensors"), &Device::Cpu)?;
    Ok(r["input_ids"].to_dtype(DType::U32)?.to_vec1()?)
}

/// Prompts of the case's first 12 and 20 ids, the decode phase starting
/// 3 tokens before the end.
pub fn prompts(case: &str) -> Result<Vec<LabelledPrompt>> {
    prompts_from(&ids(case)?, &[12, 20])
}

/// Prompts of the first `lengths[i]` of `ids`, the decode phase starting 3
/// tokens before each one's end, ids `p0`, `p1`, ...
pub fn prompts_from(ids: &[u32], lengths: &[usize]) -> Result<Vec<LabelledPrompt>> {
    lengths
        .iter()
        .enumerate()
        .map(|(index, &p)| {
            Ok(LabelledPrompt {
                index,
                id: format!("p{index}"),
                prompt: PreparedPrompt::from_ids(ids[..p].to_vec(), Some(p - 3))?,
            })
        })
        .collect()
}
