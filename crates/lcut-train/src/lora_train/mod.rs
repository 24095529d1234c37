//! SPEED-aware LoRA by self-distillation: the trained layers learn, through
//! low-rank pairs on their projections, to give the full model's own tokens
//! when the prompt is hidden above the cut. The layers below the first
//! trained one are frozen and their output is computed once per sequence
//! (by the caller, with `lcut_model::Decoder`); training runs from there:
//! trained layers below the cut on the whole sequence, the layers from the
//! cut up on the rows that exist there.

pub mod model;
pub mod optim;
pub mod run;
pub mod seq;

pub use model::{LoraVars, MODULES, UpperModel};
pub use run::{CheckpointState, LoraTrainOptions, topk_kl, train_lora};
pub use seq::{BelowCut, TeacherTopK, TrainSeq};
