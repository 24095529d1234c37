//! Prompts lcut-engine's lens and knockout tests share: an oracle case's
//! token ids (from its `lens.safetensors`) and two prompts cut from them.

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
    let ids = ids(case)?;
    [12usize, 20]
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
