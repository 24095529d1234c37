//! The LoRA trainer's upper layers, run on the rows that exist above the
//! cut from the lower layers' residual stream, give transformers' SPEED+BoS
//! logits on the llama-gqa reference case (zero adapter), and a trained
//! step lowers the loss.

use anyhow::{Result, ensure};
use candle_core::{D, Device, Tensor};
use lcut_model::{ModelConfig, WeightFiles};
use lcut_testkit::reference::ReferenceCase;
use lcut_train::lora_train::{LoraTrainOptions, TrainSeq, UpperModel, train_lora};

const CUT: usize = 4;
const S: usize = 28;

fn case() -> Result<(UpperModel, TrainSeq, Tensor)> {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/llama-gqa");
    let case = ReferenceCase::load(&dir)?;
    let cfg = ModelConfig::from_folder(&dir)?;
    let upper = UpperModel::load(&cfg, &WeightFiles::open(&dir)?, CUT)?;
    let t = case.ids.len();
    let positions: Vec<usize> = std::iter::once(0).chain(S..t).collect();
    let idx: Vec<u32> = positions.iter().map(|&p| p as u32).collect();
    let x = case.tensors[&format!("layer_out.{}", CUT - 1)]
        .index_select(&Tensor::new(idx.as_slice(), &Device::Cpu)?, 0)?;
    let n = positions.len();
    let visible = (0..n * n).map(|i| i % n <= i / n).collect();
    let loss_rows: Vec<u32> = (1..n as u32).collect();
    let targets = loss_rows
        .iter()
        .map(|&r| case.ids[(positions[r as usize] + 1).min(t - 1)])
        .collect();
    let want = case.tensors["logits.speed.l4.bos"].clone();
    Ok((
        upper,
        TrainSeq {
            x,
            positions,
            visible,
            loss_rows,
            targets,
        },
        want,
    ))
}

#[test]
fn zero_adapter_upper_layers_give_transformers_speed_logits() -> Result<()> {
    let (upper, s, want) = case()?;
    let lora = upper.init_lora(&[4, 5], &["q_proj", "v_proj"], 4, 8.0, 3)?;
    let got = upper.logits(&s.x, &s.positions, &s.visible, &s.loss_rows, &lora)?;
    let d = (got - want)?
        .abs()?
        .flatten_all()?
        .max(D::Minus1)?
        .to_scalar::<f32>()?;
    ensure!(
        d <= 1e-4,
        "upper layers differ from transformers' SPEED+BoS logits by {d:e}"
    );
    Ok(())
}

#[test]
fn training_lowers_the_loss_and_resumes() -> Result<()> {
    let (upper, s, _) = case()?;
    let lora = upper.init_lora(
        &[4, 5],
        &["q_proj", "k_proj", "v_proj", "o_proj"],
        4,
        8.0,
        3,
    )?;
    let mut opts = LoraTrainOptions {
        steps: 20,
        batch: 1,
        lr: 1e-2,
        lr_end: 1e-2,
        weight_decay: 0.0,
        clip: 1.0,
        seed: 1,
        checkpoint_every: 10,
    };
    let dir = tempfile::tempdir()?;
    let config =
        lcut_model::lora::LoraConfig::new(4, 8.0, &["q_proj", "k_proj", "v_proj", "o_proj"]);
    let data = [s];
    let state = train_lora(
        &upper,
        &lora,
        &data,
        &opts,
        (dir.path(), &config),
        |_, _| {},
    )?;
    let (first, last) = (state.losses[0], state.losses[19]);
    ensure!(last < first * 0.9, "loss {first} -> {last}");
    // resume: a fresh adapter picks up the checkpoint at step 20 and goes on
    opts.steps = 25;
    let again = upper.init_lora(
        &[4, 5],
        &["q_proj", "k_proj", "v_proj", "o_proj"],
        4,
        8.0,
        3,
    )?;
    let state = train_lora(
        &upper,
        &again,
        &data,
        &opts,
        (dir.path(), &config),
        |_, _| {},
    )?;
    ensure!(
        state.losses.len() == 25 && state.losses[20] <= first,
        "resumed: {:?}",
        state.losses
    );
    Ok(())
}
