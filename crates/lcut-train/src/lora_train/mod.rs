//! SPEED-aware LoRA by self-distillation: the layers at and above the cut
//! learn, through low-rank pairs on their projections, to give the full
//! model's own tokens when the prompt is hidden from them. The layers below
//! the cut are the same under both masks, so their output is computed once
//! per sequence (by the caller, with `lcut_model::Decoder`) and only the
//! upper layers run in training, on the rows that exist there.

pub mod model;
pub mod optim;
pub mod run;

pub use model::{LoraVars, MODULES, UpperModel};
pub use run::{CheckpointState, LoraTrainOptions, TeacherTopK, TrainSeq, topk_kl, train_lora};
