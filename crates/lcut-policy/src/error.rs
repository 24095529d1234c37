//! Errors in writing or resolving a policy.

/// Errors in writing or resolving a policy.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// The policy string does not follow the grammar.
    #[error(
        "malformed policy {text:?}: {reason}; expected `full`, `speed:C`, `speed:C+bos`, \
         `speed:C+prefix:N`, `speed:C+system`, `selfonly:C`, `selfonly:C+bos`, \
         `speed:C+bos+heads:FILE`, `speed:C+bos+heads:N+ranking:FILE`, `speed:C+bos+window:W`, \
         `knockout:l`, `band:a..b`, \
         `swiftkv:C`, `swiftkv:C+bos`, `pop:C`, `pop:C+bos`, \
         `slim:C1@K1[,C2@K2...][+block:B][+unit:u][+window:w][+swap:g][+sink:n][+score:unit|avg|max]` \
         or `slim:paper`, a press `streamingllm:R[+sink:N]`, `snapkv:R[+window:W][+kernel:K]`, \
         `pyramidkv:R[+window:W][+kernel:K][+beta:B]`, `knorm:R`, `tova:R`, \
         `expected:R[+sink:N][+future:F][+cov:off][+vnorm:off][+epsilon:E]`, where C is a layer \
         count (24), a fraction of depth (3/4) or a decimal (0.75), K a token count (8192, 8k) or \
         a share of the prompt (25%), R the share of the prompt's K/V a press removes, in (0, 1), \
         and l, a, b 0-based layers"
    )]
    Malformed {
        /// The text given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A layer reads the K/V of a layer that is not an earlier one storing
    /// its own.
    #[error(
        "layer {layer} reads the K/V of layer {from}, which is not an earlier layer storing its own"
    )]
    SharedKv {
        /// The reading layer.
        layer: usize,
        /// The layer it names.
        from: usize,
    },
    /// A policy whose meaning on a model with layers that share K/V is not
    /// defined.
    #[error(
        "policy {policy} does not run on a model whose layers share K/V (Gemma 4's num_kv_shared_layers): {reason}; \
         full, SPEED, SelfOnly and knockout bands do"
    )]
    SharedKvPolicy {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
    /// A policy whose meaning on a model with recurrent (linear-attention)
    /// layers is not defined.
    #[error(
        "policy {policy} does not run on a model with recurrent layers (Qwen3.5's linear attention): {reason}; \
         full, SPEED and SelfOnly do"
    )]
    RecurrentPolicy {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
    /// The cutoff is not in 1..=L.
    #[error(
        "L_cut {l_cut} is out of range for a model of {num_layers} layers (expected 1..={num_layers})"
    )]
    CutOutOfRange {
        /// The cutoff asked for.
        l_cut: usize,
        /// Depth of the model.
        num_layers: usize,
    },
    /// A SlimInfer cut layer is outside 1..L-1 or not after the previous one.
    #[error(
        "SlimInfer cut layer {cut} is out of range for a model of {num_layers} layers (expected \
         {previous} < cut < {num_layers}: each cut after the previous one and below the depth)"
    )]
    SlimCutOutOfRange {
        /// The cut layer as resolved.
        cut: usize,
        /// The previous cut (0 for the first).
        previous: usize,
        /// Depth of the model.
        num_layers: usize,
    },
    /// A family registered under a name that is taken or not a word.
    #[error(
        "policy family name {name:?} is taken or not a lower-case word (letters, digits, `_`; not a built-in family: full, speed, selfonly, slim, swiftkv, pop, knockout, band or a press)"
    )]
    FamilyName {
        /// The name asked for.
        name: String,
    },
    /// A knockout band outside the model's layers, or backwards.
    #[error(
        "{policy}: layers {first}..{last} are not a band of a model of {num_layers} layers \
         (expected 0 <= a <= b <= {max}, 0-based)", max = num_layers.saturating_sub(1)
    )]
    BandOutOfRange {
        /// The policy as written.
        policy: String,
        /// The band's first layer.
        first: usize,
        /// The band's last layer.
        last: usize,
        /// Depth of the model.
        num_layers: usize,
    },
    /// A head file or ranking that cannot be used.
    #[error("head file {path}: {reason}")]
    HeadFile {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A kept head outside what the policy and the model allow.
    #[error("head file {path}: pair [{layer}, {kv_head}]: {reason}")]
    HeadOutOfRange {
        /// The file.
        path: String,
        /// The pair's layer.
        layer: usize,
        /// The pair's K/V head.
        kv_head: usize,
        /// Why it cannot be kept.
        reason: String,
    },
    /// `+heads:N` without a ranking to take the N heads from.
    #[error(
        "`+heads:{count}` takes the {count} heads with the most decode-to-prefill mass from a \
         ranking: name one with `+ranking:FILE` (`lcut diagnose` writes heads-ranking.json beside its report)"
    )]
    RankingMissing {
        /// The heads asked for.
        count: usize,
    },
    /// A press given a prompt it cannot compress as kvpress does.
    #[error("{policy} cannot compress a prompt of {prompt} token(s): {reason}")]
    PressPrompt {
        /// The press as written.
        policy: String,
        /// Prompt tokens before the decode start.
        prompt: usize,
        /// Why.
        reason: String,
    },
    /// A policy that decides at the prompt's end was handed a layer it
    /// cannot decide from.
    #[error("{policy}: layer {layer}: {reason}")]
    PromptLayer {
        /// The policy as written.
        policy: String,
        /// The layer.
        layer: usize,
        /// What is wrong with what it was handed.
        reason: String,
    },
    /// A press's prompt run cannot serve another press (its queries were
    /// not observed as the other reads them, or it has decided already).
    #[error("the prompt run of {observer} cannot serve {policy}: {reason}")]
    PressShare {
        /// The press whose run was to be shared.
        observer: String,
        /// The press it was to serve.
        policy: String,
        /// Why not.
        reason: String,
    },
    /// `+system` anchors were asked for but the prompt has no system part.
    #[error(
        "the policy keeps the system prompt as anchors, but the prompt's system span is unknown (no chat template or no system message)"
    )]
    SystemAnchorUnknown,
}
