//! A training sequence as the trained layers see it: the residual stream
//! entering the first trained layer, which rows exist where, who reads whom,
//! and the targets.

use candle_core::Tensor;
use lcut_model::TrainKv;

/// One training sequence (a clone shares the tensors).
#[derive(Clone)]
pub struct TrainSeq {
    /// Residual stream entering the model's first layer [n, d]: at the rows
    /// of `below` when the model starts below the cut, else at `positions`.
    pub x: Tensor,
    /// The whole sequence's rows in the layers below the cut, when the
    /// model starts there (`None` when it starts at the cut).
    pub below: Option<BelowCut>,
    /// Original positions of the rows that exist at the cut and above.
    pub positions: Vec<usize>,
    /// At and above the cut, row q reads row k where `visible[q * n + k]`.
    pub visible: Vec<bool>,
    /// Rows (indices into `positions`) whose next token is a target.
    pub loss_rows: Vec<u32>,
    /// The targets (the teacher's tokens), one per loss row.
    pub targets: Vec<u32>,
    /// The teacher's distribution at each loss row, cut to its top k.
    pub teacher: Option<TeacherTopK>,
    /// Every token's per-layer inputs [tokens, layers * width], row p for
    /// position p, for a model that has them (Gemma 4).
    pub layer_inputs: Option<Tensor>,
    /// Keys and values [kv_heads, tokens, head_dim] of every token, by
    /// layer, of the frozen layers beneath the trained ones whose K/V a
    /// trained layer reads (Gemma 4's shared layers); empty for the others.
    pub source_kv: TrainKv,
}

/// The rows of a sequence in the trained layers below the cut (every token
/// of it there) and which of them go on past the cut.
#[derive(Clone)]
pub struct BelowCut {
    /// Original positions of the rows.
    pub positions: Vec<usize>,
    /// Row q reads row k where `visible[q * n + k]`.
    pub visible: Vec<bool>,
    /// Indices of the rows that exist at the cut (the anchors and the
    /// decode-phase tokens), in the order of the upper rows' `positions`.
    pub kept: Vec<u32>,
}

/// The full model's next-token distribution at each loss row, kept as its
/// k most likely tokens: ids [rows, k] (u32) and probabilities [rows, k]
/// (f32, renormalised over the k). The KL term compares the adapted model's
/// log-probabilities of those tokens with these.
#[derive(Clone)]
pub struct TeacherTopK {
    /// Token ids [rows, k].
    pub ids: Tensor,
    /// Probabilities [rows, k], each row summing to 1.
    pub probs: Tensor,
}
