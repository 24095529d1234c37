//! SPEED-aware LoRA by self-distillation: the trained layers learn, through
//! low-rank pairs on their projections, to give the full model's own tokens
//! when the prompt is hidden above the cut. The layers below the first
//! trained one are frozen and their output is computed once per sequence
//! (with `lcut_model::Decoder`); training runs from there: trained layers
//! below the cut on the whole sequence, the layers from the cut up on the
//! rows that exist there.
//!
//! [`train_adapter`] runs a whole job ([`AdapterJob`]): the teacher
//! ([`teacher`]), the sequences ([`data`]), the loop ([`run`]) and the files.

pub mod data;
pub mod job;
pub mod model;
pub mod optim;
pub mod options;
pub mod progress;
pub mod run;
pub mod seq;
pub mod teacher;

pub use data::{FrozenRows, TrainingData, frozen_rows, training_data};
pub use job::train_adapter;
pub use model::{LoraVars, MODULES, UpperModel};
pub use options::{AdapterJob, DataOptions, LayerSpan, adapted_layers, projection_names};
pub use progress::{Progress, Quiet};
pub use run::{CheckpointState, LoraTrainOptions, topk_kl, train_lora};
pub use seq::{BelowCut, TeacherTopK, TrainSeq};
pub use teacher::{TeacherRecord, TeacherSettings};
