//! A model's configuration from GGUF metadata (`general.architecture`,
//! `{arch}.block_count`, ...), put in Hugging Face terms so that one set of
//! architecture rules ([`ModelConfig`]) serves both formats.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::gguf::header::{GgufHeader, MetaValue};

/// The GGUF metadata key each Hugging Face field is read from (`{a}` is the
/// architecture), so that errors name the key the file actually has.
const KEYS: [(&str, &str); 24] = [
    ("num_hidden_layers", "{a}.block_count"),
    ("hidden_size", "{a}.embedding_length"),
    ("intermediate_size", "{a}.feed_forward_length"),
    ("num_attention_heads", "{a}.attention.head_count"),
    ("num_key_value_heads", "{a}.attention.head_count_kv"),
    ("head_dim", "{a}.attention.key_length"),
    ("rms_norm_eps", "{a}.attention.layer_norm_rms_epsilon"),
    ("rope_theta", "{a}.rope.freq_base"),
    ("partial_rotary_factor", "{a}.rope.dimension_count"),
    ("max_position_embeddings", "{a}.context_length"),
    ("sliding_window", "{a}.attention.sliding_window"),
    ("attn_logit_softcapping", "{a}.attn_logit_softcapping"),
    ("final_logit_softcapping", "{a}.final_logit_softcapping"),
    ("vocab_size", "token_embd.weight (rows)"),
    ("rope_local_base_freq", "{a}.rope.freq_base_swa"),
    (
        "sliding_window_pattern",
        "{a}.attention.sliding_window_pattern",
    ),
    ("num_experts", "{a}.expert_count"),
    ("num_experts_per_tok", "{a}.expert_used_count"),
    ("moe_intermediate_size", "{a}.expert_feed_forward_length"),
    ("linear_num_key_heads", "{a}.ssm.group_count"),
    ("linear_num_value_heads", "{a}.ssm.time_step_rank"),
    ("linear_key_head_dim", "{a}.ssm.state_size"),
    ("linear_value_head_dim", "{a}.ssm.inner_size"),
    ("linear_conv_kernel_dim", "{a}.ssm.conv_kernel"),
];

/// Reads typed metadata, naming the file and key in errors.
struct Meta<'a> {
    header: &'a GgufHeader,
    path: &'a Path,
    arch: &'a str,
    /// The whole file, for the few tensors whose values describe the model
    /// (Gemma 4's `rope_freqs`).
    bytes: &'a [u8],
}

impl Meta<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn err(&self, key: &str, expected: &str, found: Option<&MetaValue>) -> ModelError {
        ModelError::GgufMetadata {
            path: self.path.to_path_buf(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: found.map_or("nothing (key missing)".into(), MetaValue::describe),
        }
    }

    fn get(&self, key: &str) -> Option<&MetaValue> {
        self.header.metadata.get(key)
    }

    /// A count that may be stored per layer (an array); lcut needs one value.
    fn opt_count(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::Array(xs)) => {
                let first = xs.first().and_then(MetaValue::as_u64);
                match first {
                    Some(n) if xs.iter().all(|x| x.as_u64() == Some(n)) => Ok(Some(n)),
                    _ => {
                        Err(self.err(key, "one integer (the same for every layer)", self.get(key)))
                    }
                }
            }
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.err(key, "a non-negative integer", Some(v))),
        }
    }

    fn count(&self, key: &str) -> Result<u64> {
        self.opt_count(key)?
            .filter(|&n| n > 0)
            .ok_or_else(|| self.err(key, "a positive integer", self.get(key)))
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => Err(self.err(key, "a finite number", Some(v))),
            },
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, "a string", Some(v))),
        }
    }
}

/// The architecture a GGUF file declares, checked against what lcut runs.
pub fn architecture(header: &GgufHeader, path: &Path) -> Result<(String, Arch)> {
    let meta = Meta {
        header,
        path,
        arch: "",
        bytes: &[],
    };
    let name = meta
        .opt_str("general.architecture")?
        .ok_or_else(|| meta.err("general.architecture", "an architecture name", None))?;
    // llama.cpp writes Mixtral as `llama` with experts
    let experts_key = format!("{name}.expert_count");
    if name == "llama" && meta.opt_count(&experts_key)?.is_some_and(|n| n > 0) {
        return Ok((name.to_string(), Arch::Mixtral));
    }
    // GGUF names the architectures as Hugging Face's model_type does
    // (llama.cpp writes Mistral checkpoints as `llama`), text-only Gemma 3 as `gemma3`
    Arch::from_gguf_name(name)
        .map(|a| (name.to_string(), a))
        .ok_or_else(|| ModelError::UnknownArchitecture {
            path: path.to_path_buf(),
            model_type: name.to_string(),
            supported: Arch::supported(),
        })
}

/// The model configuration a GGUF file describes: its metadata, and for
/// Gemma 4 the values of `rope_freqs.weight` in `bytes` (the whole file,
/// of which `header` is the parsed header).
pub fn model_config(header: &GgufHeader, path: &Path, bytes: &[u8]) -> Result<ModelConfig> {
    let (arch_name, arch) = architecture(header, path)?;
    let meta = Meta {
        header,
        path,
        arch: &arch_name,
        bytes,
    };
    let json = hf_config(&meta, arch)?;
    let mut cfg =
        ModelConfig::from_json_value(&json, path).map_err(|e| name_gguf_key(e, &arch_name))?;
    // llama.cpp's converter stores Gemma's and Qwen3.5's (1 + w) norm
    // weights already offset
    cfg.norm_weight_offset = false;
    // and Qwen3.5's value heads tiled (`_LinearAttentionVReorderBase`)
    if let Some(la) = cfg.linear_attention.as_mut() {
        la.value_heads_tiled = true;
    }
    Ok(cfg)
}

/// The Hugging Face `config.json` equivalent of the metadata.
fn hf_config(m: &Meta<'_>, arch: Arch) -> Result<Value> {
    let mut c = Map::new();
    c.insert("model_type".into(), json!(arch.model_type()));
    let layers = sizes(m, arch, &mut c)?;
    if arch == Arch::Gemma3 {
        gemma3_layers(m, layers, &mut c)?;
    }
    if arch == Arch::Gemma4 {
        gemma4_layers(m, layers, &mut c)?;
    }
    positions_and_attention(m, arch, layers, &mut c)?;
    if arch == Arch::Olmo2 && c.contains_key("sliding_window") {
        olmo3_layers(m, layers, &mut c)?;
    }
    if arch == Arch::GptOss {
        gpt_oss_layers(m, layers, &mut c)?;
    }
    if arch.is_qwen35() {
        qwen35_layers(m, layers, &mut c)?;
    }
    if matches!(
        arch,
        Arch::Qwen3Moe | Arch::Mixtral | Arch::GptOss | Arch::Qwen35Moe
    ) {
        experts(m, arch, layers, &mut c)?;
    }
    vocabulary(m, &mut c)?;
    Ok(Value::Object(c))
}

/// gpt-oss as llama.cpp's `gpt-oss` runs it into `c`: sliding layers by
/// `attention.sliding_window_pattern` (llama.cpp's period 2 when absent:
/// the even layers slide), the clamped SwiGLU's limit 7 and alpha 1.702
/// (constants in llama.cpp, no key in the file), YaRN's ramp truncated as
/// llama.cpp's `ggml_rope_yarn_corr_dims` floors and ceils it (transformers'
/// default; gpt-oss's own checkpoints say `truncate: false`).
fn gpt_oss_layers(m: &Meta<'_>, layers: u64, c: &mut Map<String, Value>) -> Result<()> {
    if c.contains_key("sliding_window") {
        c.insert("layer_types".into(), layer_types(m, layers, 2)?);
    }
    c.insert("swiglu_limit".into(), json!(7.0));
    c.insert("swiglu_alpha".into(), json!(1.702));
    Ok(())
}

/// Qwen3.5's linear-attention layers as llama.cpp's `qwen35` describes
/// them into `c`: which layers are linear (`attention.recurrent_layers`,
/// one flag per layer, else every `full_attention_interval`-th layer full,
/// llama.cpp's 4 when absent), the convolution's kernel
/// (`ssm.conv_kernel`), the key heads (`ssm.group_count`) and their width
/// (`ssm.state_size`), the value heads (`ssm.time_step_rank`) and their
/// width (`ssm.inner_size` over the value heads: llama.cpp's own graph
/// takes the key width, which the released models share).
fn qwen35_layers(m: &Meta<'_>, layers: u64, c: &mut Map<String, Value>) -> Result<()> {
    let count = |suffix: &str| m.count(&m.key(suffix));
    let value_heads = count("ssm.time_step_rank")?;
    let inner_key = m.key("ssm.inner_size");
    let inner = m.count(&inner_key)?;
    if !inner.is_multiple_of(value_heads) {
        return Err(m.err(
            &inner_key,
            &format!(
                "a multiple of the value heads ({value_heads}, {})",
                m.key("ssm.time_step_rank")
            ),
            m.get(&inner_key),
        ));
    }
    c.insert("linear_num_value_heads".into(), json!(value_heads));
    c.insert("linear_value_head_dim".into(), json!(inner / value_heads));
    c.insert(
        "linear_num_key_heads".into(),
        json!(count("ssm.group_count")?),
    );
    c.insert(
        "linear_key_head_dim".into(),
        json!(count("ssm.state_size")?),
    );
    c.insert(
        "linear_conv_kernel_dim".into(),
        json!(count("ssm.conv_kernel")?),
    );
    let key = m.key("attention.recurrent_layers");
    let linear: Vec<bool> = match m.get(&key) {
        None => {
            let interval = m.opt_count(&m.key("full_attention_interval"))?.unwrap_or(4);
            if interval == 0 {
                let key = m.key("full_attention_interval");
                return Err(m.err(&key, "a positive interval", m.get(&key)));
            }
            (0..layers).map(|l| (l + 1) % interval != 0).collect()
        }
        Some(MetaValue::Array(flags)) if flags.len() as u64 == layers => flags
            .iter()
            .map(|f| match f {
                MetaValue::Bool(b) => Ok(*b),
                _ => Err(m.err(&key, "true or false per layer", m.get(&key))),
            })
            .collect::<Result<_>>()?,
        Some(v) => {
            return Err(m.err(
                &key,
                &format!("one flag per layer ({layers}, {})", m.key("block_count")),
                Some(v),
            ));
        }
    };
    let types: Vec<&str> = linear
        .iter()
        .map(|&l| match l {
            true => "linear_attention",
            false => "full_attention",
        })
        .collect();
    c.insert("layer_types".into(), json!(types));
    Ok(())
}

/// The experts of llama.cpp's `qwen3moe`, `gpt-oss`, `qwen35moe` and
/// Mixtral (`llama` with `expert_count`) files into `c`: the expert count
/// and the experts a token runs, Qwen3-MoE's, gpt-oss's and Qwen3.5-MoE's
/// expert width (Mixtral's is `feed_forward_length`), Qwen3.5-MoE's shared
/// expert's (`expert_shared_feed_forward_length`), renormalised top-k
/// weights (`expert_weights_norm`, else llama.cpp's `true`), and the layers
/// with neither a router (`blk.N.ffn_gate_inp.weight`) nor experts as
/// dense ones (Qwen3-MoE's `mlp_only_layers`; every layer of the others
/// has experts). Routing lcut does not run (other shared experts, another
/// gating function, scaled weights) is refused.
fn experts(m: &Meta<'_>, arch: Arch, layers: u64, c: &mut Map<String, Value>) -> Result<()> {
    c.insert(
        "num_experts".into(),
        json!(m.count(&m.key("expert_count"))?),
    );
    c.insert(
        "num_experts_per_tok".into(),
        json!(m.count(&m.key("expert_used_count"))?),
    );
    let width = |key: &str| -> Result<Value> { Ok(json!(m.count(&m.key(key))?)) };
    match arch {
        Arch::Qwen3Moe => {
            c.insert(
                "moe_intermediate_size".into(),
                width("expert_feed_forward_length")?,
            );
        }
        Arch::GptOss => {
            c.insert(
                "intermediate_size".into(),
                width("expert_feed_forward_length")?,
            );
        }
        Arch::Qwen35Moe => {
            c.insert(
                "moe_intermediate_size".into(),
                width("expert_feed_forward_length")?,
            );
            c.insert(
                "shared_expert_intermediate_size".into(),
                width("expert_shared_feed_forward_length")?,
            );
        }
        _ => {}
    }
    let refused = |what: String| ModelError::GgufExperts {
        path: m.path.to_path_buf(),
        what,
    };
    // Qwen3.5-MoE's one shared expert is read from its tensors
    let shared = m.key("expert_shared_count");
    let runs_shared = |n: u64| arch == Arch::Qwen35Moe && n == 1;
    if let Some(n) = m.opt_count(&shared)?.filter(|&n| n > 0 && !runs_shared(n)) {
        return Err(refused(format!("{shared} = {n} (shared experts)")));
    }
    // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX (gpt-oss's graph
    // fixes its own softmax over the top k, whatever the key says)
    let gating = m.key("expert_gating_func");
    if let Some(g) = m
        .opt_count(&gating)?
        .filter(|&g| g != 1 && arch != Arch::GptOss)
    {
        return Err(refused(format!("{gating} = {g} (not softmax)")));
    }
    let scale = m.key("expert_weights_scale");
    if let Some(s) = m.opt_f64(&scale)?.filter(|&s| s != 0.0 && s != 1.0) {
        return Err(refused(format!("{scale} = {s} (scaled expert weights)")));
    }
    let norm_key = m.key("expert_weights_norm");
    let normalize = match m.get(&norm_key) {
        None => true,
        Some(MetaValue::Bool(b)) => *b,
        Some(v) => return Err(m.err(&norm_key, "true or false", Some(v))),
    };
    if arch == Arch::Qwen3Moe {
        c.insert("norm_topk_prob".into(), json!(normalize));
    } else if !normalize && matches!(arch, Arch::Mixtral | Arch::Qwen35Moe) {
        return Err(refused(format!(
            "{norm_key} = false ({} renormalises its top-k weights)",
            arch.model_type()
        )));
    }
    // a layer without a router and without experts is a dense one
    let has = |l: u64, t: &str| {
        m.header
            .tensors
            .contains_key(&format!("blk.{l}.{t}.weight"))
    };
    let mut dense = Vec::new();
    for l in 0..layers {
        match (has(l, "ffn_gate_inp"), has(l, "ffn_gate_exps")) {
            (true, _) => {}
            (false, false) if arch == Arch::Qwen3Moe => dense.push(l),
            _ => {
                return Err(ModelError::MissingTensor {
                    folder: m.path.to_path_buf(),
                    name: format!(
                        "blk.{l}.ffn_gate_inp.weight (the router of layer {l}'s experts)"
                    ),
                });
            }
        }
    }
    if !dense.is_empty() {
        c.insert("mlp_only_layers".into(), json!(dense));
    }
    Ok(())
}

/// The model's sizes (layers, widths, heads, head width, rotary share) into
/// `c`; returns the layer count, refused above lcut's limit. Gemma 4's K/V
/// heads, head widths and rotation differ by layer type and are read by
/// [`gemma4_layers`].
fn sizes(m: &Meta<'_>, arch: Arch, c: &mut Map<String, Value>) -> Result<u64> {
    let layers = m.count(&m.key("block_count"))?;
    if layers > crate::config::MAX_LAYERS as u64 {
        // refused here: per-layer settings below are sized by it
        let key = m.key("block_count");
        return Err(m.err(
            &key,
            &format!("at most {} layers", crate::config::MAX_LAYERS),
            m.get(&key),
        ));
    }
    let hidden = m.count(&m.key("embedding_length"))?;
    let heads = m.count(&m.key("attention.head_count"))?;
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("hidden_size".into(), json!(hidden));
    // Gemma 4's may differ by layer (`gemma4_layers`)
    if arch != Arch::Gemma4 {
        c.insert(
            "intermediate_size".into(),
            json!(m.count(&m.key("feed_forward_length"))?),
        );
    }
    c.insert("num_attention_heads".into(), json!(heads));
    if arch == Arch::Gemma4 {
        return Ok(layers);
    }
    // written even where the file has no key, as llama.cpp reads it (as
    // many K/V heads as heads): a config that left it out would take Gemma
    // 3's class default (`GEMMA3_TEXT_CLASS_DEFAULTS`)
    let kv = m.opt_count(&m.key("attention.head_count_kv"))?;
    c.insert("num_key_value_heads".into(), json!(kv.unwrap_or(heads)));
    let head_dim = match m.opt_count(&m.key("attention.key_length"))? {
        Some(h) => h,
        None => hidden / heads,
    };
    c.insert("head_dim".into(), json!(head_dim));
    if let Some(rotary) = m.opt_count(&m.key("rope.dimension_count"))? {
        c.insert(
            "partial_rotary_factor".into(),
            json!(rotary as f64 / head_dim as f64),
        );
    }
    Ok(layers)
}

/// Norm epsilon, RoPE, context length, sliding window and logit
/// soft-capping into `c`.
fn positions_and_attention(
    m: &Meta<'_>,
    arch: Arch,
    layers: u64,
    c: &mut Map<String, Value>,
) -> Result<()> {
    if let Some(eps) = m.opt_f64(&m.key("attention.layer_norm_rms_epsilon"))? {
        c.insert("rms_norm_eps".into(), json!(eps));
    }
    if let Some(theta) = m.opt_f64(&m.key("rope.freq_base"))? {
        c.insert("rope_theta".into(), json!(theta));
    }
    if let Some(scaling) = rope_scaling(m)? {
        c.insert("rope_scaling".into(), scaling);
    }
    if let Some(ctx) = m.opt_count(&m.key("context_length"))? {
        c.insert("max_position_embeddings".into(), json!(ctx));
    }
    // llama.cpp writes 0 for "no window" (Phi-3 without one)
    let window = m
        .opt_count(&m.key("attention.sliding_window"))?
        .filter(|&w| w > 0);
    if let Some(window) = window {
        c.insert("sliding_window".into(), json!(window));
        if arch == Arch::Llama {
            // a Mistral checkpoint written as `llama`: the window is on every layer
            c.insert(
                "layer_types".into(),
                json!(vec!["sliding_attention"; layers as usize]),
            );
        }
    }
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if let Some(cap) = m.opt_f64(&m.key(key))? {
            c.insert(key.into(), json!(cap));
        }
    }
    Ok(())
}

/// Vocabulary size, tied embeddings, attention bias and the special tokens
/// into `c`.
fn vocabulary(m: &Meta<'_>, c: &mut Map<String, Value>) -> Result<()> {
    let tensors = &m.header.tensors;
    let vocab = match tensors.get("token_embd.weight") {
        Some(t) if t.shape.len() == 2 => t.shape[0] as u64,
        _ => match m.opt_count(&m.key("vocab_size"))? {
            Some(v) => v,
            None => {
                return Err(ModelError::MissingTensor {
                    folder: m.path.to_path_buf(),
                    name: "token_embd.weight".into(),
                });
            }
        },
    };
    c.insert("vocab_size".into(), json!(vocab));
    c.insert(
        "tie_word_embeddings".into(),
        json!(!tensors.contains_key("output.weight")),
    );
    c.insert(
        "attention_bias".into(),
        json!(tensors.contains_key("blk.0.attn_q.bias")),
    );
    // null where the file names none: no BoS, not a class default's
    let bos = m.opt_count("tokenizer.ggml.bos_token_id")?;
    c.insert("bos_token_id".into(), json!(bos));
    let eos: Vec<u64> = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"]
        .iter()
        .filter_map(|k| m.opt_count(k).transpose())
        .collect::<Result<Vec<_>>>()?;
    let mut eos_unique = Vec::new();
    for id in eos {
        if !eos_unique.contains(&id) {
            eos_unique.push(id);
        }
    }
    c.insert("eos_token_id".into(), json!(eos_unique));
    Ok(())
}

/// Refuse a file of `family` (whose sliding layers need one) without a
/// positive `attention.sliding_window`.
fn positive_window(m: &Meta<'_>, family: &str) -> Result<()> {
    let key = m.key("attention.sliding_window");
    match m.opt_count(&key)? {
        Some(w) if w > 0 => Ok(()),
        _ => Err(m.err(
            &key,
            &format!("a positive sliding window ({family}'s sliding layers read that many tokens)"),
            m.get(&key),
        )),
    }
}

/// Gemma 3's layers as llama.cpp reads them into `c`: a positive sliding
/// window; which layers slide (`attention.sliding_window_pattern`, a period
/// or one flag per layer; llama.cpp's period 6 when absent); the sliding
/// layers' RoPE base (`rope.freq_base_swa`, else llama.cpp's 10000), the
/// global layers' (`rope.freq_base`, else llama.cpp's 10000); and the query
/// scale (1/sqrt(head_dim), 1/sqrt(hidden/heads) for the 62-layer 27B).
fn gemma3_layers(m: &Meta<'_>, layers: u64, c: &mut Map<String, Value>) -> Result<()> {
    positive_window(m, "Gemma 3")?;
    c.insert("layer_types".into(), layer_types(m, layers, 6)?);
    let local = m.opt_f64(&m.key("rope.freq_base_swa"))?.unwrap_or(10_000.0);
    c.insert("rope_local_base_freq".into(), json!(local));
    if m.get(&m.key("rope.freq_base")).is_none() {
        c.insert("rope_theta".into(), json!(10_000.0));
    }
    let hidden = c["hidden_size"].as_u64().unwrap_or(1);
    let heads = c["num_attention_heads"].as_u64().unwrap_or(1).max(1);
    let head_dim = c["head_dim"].as_u64().unwrap_or(1);
    let scalar = if layers == 62 {
        hidden / heads
    } else {
        head_dim
    };
    c.insert("query_pre_attn_scalar".into(), json!(scalar));
    Ok(())
}

/// Gemma 4 as llama.cpp's `gemma4` describes it, into `c` as a
/// `gemma4_text` config:
/// - which layers slide (`attention.sliding_window_pattern`, one flag per
///   layer, which llama.cpp requires; the last layer must be full, as
///   transformers makes it) and the window;
/// - the sliding layers' head width (`attention.key_length_swa`) and the
///   full layers' (`attention.key_length`), the K/V heads of each layer
///   (`attention.head_count_kv`, one count or one per layer), as
///   `per_layer_config` where a layer's count is not the sliding layers';
/// - the layers that read another's K/V (`attention.shared_kv_layers`);
/// - keys that are the values: full layers with K/V and no `attn_v`
///   (llama.cpp takes the keys' projection where `attn_v` is absent);
/// - the per-layer inputs (`embedding_length_per_layer_input`, 0: none;
///   their table's rows from `per_layer_token_embd.weight`);
/// - each layer type's RoPE: the sliding layers' base
///   (`rope.freq_base_swa`, else the full layers') and rotated share
///   (`rope.dimension_count_swa`); the full layers' base and their
///   proportional rotation, which the converter writes as `rope_freqs`
///   ([`proportional_pairs`]);
/// - the expert block beside each dense MLP, where the layers have routers
///   ([`gemma4_experts`]), and the shared layers' double-width MLPs
///   ([`mlp_widths`]).
fn gemma4_layers(m: &Meta<'_>, layers: u64, c: &mut Map<String, Value>) -> Result<()> {
    c.insert("model_type".into(), json!("gemma4_text"));
    let tensors = &m.header.tensors;
    gemma4_experts(m, layers, c)?;
    positive_window(m, "Gemma 4")?;
    let pattern_key = m.key("attention.sliding_window_pattern");
    if m.get(&pattern_key).is_none() {
        return Err(m.err(&pattern_key, "one flag per layer (true: sliding)", None));
    }
    let sliding = sliding_layers(m, layers, 1)?;
    if sliding.last() == Some(&true) {
        return Err(m.err(
            &pattern_key,
            "a full last layer (Gemma 4's last layer attends to every token)",
            m.get(&pattern_key),
        ));
    }
    let types: Vec<&str> = sliding
        .iter()
        .map(|&s| match s {
            true => "sliding_attention",
            false => "full_attention",
        })
        .collect();
    c.insert("layer_types".into(), json!(types));

    let full_dim = m.count(&m.key("attention.key_length"))?;
    let sliding_dim = m.count(&m.key("attention.key_length_swa"))?;
    for (k, v, dim) in [
        ("attention.key_length", "attention.value_length", full_dim),
        (
            "attention.key_length_swa",
            "attention.value_length_swa",
            sliding_dim,
        ),
    ] {
        let v_key = m.key(v);
        if m.opt_count(&v_key)?.is_some_and(|x| x != dim) {
            return Err(m.err(
                &v_key,
                &format!(
                    "{} ({dim}): Gemma 4's values are as wide as its keys",
                    m.key(k)
                ),
                m.get(&v_key),
            ));
        }
    }
    c.insert("head_dim".into(), json!(sliding_dim));
    c.insert("global_head_dim".into(), json!(full_dim));

    let kv = per_layer_counts(m, &m.key("attention.head_count_kv"), layers)?;
    let first_sliding = sliding.iter().position(|&s| s).unwrap_or(0);
    let sliding_kv = kv[first_sliding];
    c.insert("num_key_value_heads".into(), json!(sliding_kv));
    let mut per_layer = Map::new();
    for l in 0..layers as usize {
        let mut entry = Map::new();
        if !sliding[l] {
            entry.insert("head_dim".into(), json!(full_dim));
        }
        if kv[l] != sliding_kv {
            entry.insert("num_key_value_heads".into(), json!(kv[l]));
        }
        if !entry.is_empty() {
            per_layer.insert(l.to_string(), Value::Object(entry));
        }
    }
    c.insert("per_layer_config".into(), Value::Object(per_layer));

    let shared = m
        .opt_count(&m.key("attention.shared_kv_layers"))?
        .unwrap_or(0);
    c.insert("num_kv_shared_layers".into(), json!(shared));
    mlp_widths(m, (layers, shared), c)?;
    // keys as values: the full layers that hold K/V and have no value
    // projection; all or none of them (transformers' one flag)
    let owns_kv = |l: u64| l < layers.saturating_sub(shared);
    let full_with_kv: Vec<u64> = (0..layers)
        .filter(|&l| !sliding[l as usize] && owns_kv(l))
        .collect();
    let has_v = |l: &u64| tensors.contains_key(&format!("blk.{l}.attn_v.weight"));
    let without_v = full_with_kv.iter().filter(|l| !has_v(l)).count();
    if without_v != 0 && without_v != full_with_kv.len() {
        let l = full_with_kv
            .iter()
            .find(|l| !has_v(l))
            .copied()
            .unwrap_or(0);
        return Err(ModelError::MissingTensor {
            folder: m.path.to_path_buf(),
            name: format!(
                "blk.{l}.attn_v.weight (other full layers have their own values: Gemma 4's keys are the values on every full layer or on none)"
            ),
        });
    }
    c.insert(
        "attention_k_eq_v".into(),
        json!(without_v != 0 && without_v == full_with_kv.len()),
    );

    let per_layer_key = m.key("embedding_length_per_layer_input");
    let width = m
        .opt_count(&per_layer_key)?
        .ok_or_else(|| m.err(&per_layer_key, "a width (0: no per-layer inputs)", None))?;
    if width == 0 {
        c.insert("hidden_size_per_layer_input".into(), Value::Null);
    } else {
        c.insert("hidden_size_per_layer_input".into(), json!(width));
        let name = "per_layer_token_embd.weight";
        let rows = match tensors.get(name) {
            Some(t) if t.shape.len() == 2 => t.shape[0],
            _ => {
                return Err(ModelError::MissingTensor {
                    folder: m.path.to_path_buf(),
                    name: format!(
                        "{name} (the per-layer inputs' table, {per_layer_key} = {width})"
                    ),
                });
            }
        };
        c.insert("vocab_size_per_layer_input".into(), json!(rows));
    }

    let full_theta = m.opt_f64(&m.key("rope.freq_base"))?.unwrap_or(10_000.0);
    let sliding_theta = m
        .opt_f64(&m.key("rope.freq_base_swa"))?
        .unwrap_or(full_theta);
    let rot_key = m.key("rope.dimension_count");
    if let Some(r) = m.opt_count(&rot_key)?
        && r != full_dim
    {
        return Err(m.err(
            &rot_key,
            &format!(
                "{} ({full_dim}): the full layers rotate pairs across the whole head, rope_freqs saying which",
                m.key("attention.key_length")
            ),
            m.get(&rot_key),
        ));
    }
    let sliding_rot_key = m.key("rope.dimension_count_swa");
    let sliding_rot = m.opt_count(&sliding_rot_key)?.unwrap_or(sliding_dim);
    if sliding_rot > sliding_dim || !sliding_rot.is_multiple_of(2) {
        return Err(m.err(
            &sliding_rot_key,
            &format!(
                "an even count up to {} ({sliding_dim})",
                m.key("attention.key_length_swa")
            ),
            m.get(&sliding_rot_key),
        ));
    }
    let (pairs, factor) = proportional_pairs(m, full_dim)?;
    c.insert(
        "rope_parameters".into(),
        json!({
            "full_attention": {
                "rope_type": "proportional",
                "rope_theta": full_theta,
                "factor": factor,
                "partial_rotary_factor": (2 * pairs) as f64 / full_dim as f64,
            },
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": sliding_theta,
                "partial_rotary_factor": sliding_rot as f64 / sliding_dim as f64,
            },
        }),
    );
    Ok(())
}

/// Gemma 4's expert block beside each layer's dense MLP into `c`, where the
/// layers have routers (`blk.N.ffn_gate_inp.weight`; every layer or none):
/// the expert count, the experts a token runs and their width
/// (`expert_count`, `expert_used_count`, `expert_feed_forward_length`).
fn gemma4_experts(m: &Meta<'_>, layers: u64, c: &mut Map<String, Value>) -> Result<()> {
    let routed = |l: u64| {
        m.header
            .tensors
            .contains_key(&format!("blk.{l}.ffn_gate_inp.weight"))
    };
    let count = (0..layers).filter(|&l| routed(l)).count() as u64;
    if count == 0 {
        return Ok(());
    }
    if let Some(l) = (0..layers).find(|&l| !routed(l)) {
        return Err(ModelError::MissingTensor {
            folder: m.path.to_path_buf(),
            name: format!(
                "blk.{l}.ffn_gate_inp.weight (Gemma 4's expert block is on every layer or none; {count} of {layers} have a router)"
            ),
        });
    }
    c.insert("enable_moe_block".into(), json!(true));
    for (hf, key) in [
        ("num_experts", "expert_count"),
        ("top_k_experts", "expert_used_count"),
        ("moe_intermediate_size", "expert_feed_forward_length"),
    ] {
        c.insert(hf.into(), json!(m.count(&m.key(key))?));
    }
    Ok(())
}

/// Gemma 4's MLP widths into `c`: `feed_forward_length` once, or one per
/// layer where the `shared` last layers' are twice the others' (the
/// converter's `use_double_wide_mlp`); any other profile is refused.
fn mlp_widths(
    m: &Meta<'_>,
    (layers, shared): (u64, u64),
    c: &mut Map<String, Value>,
) -> Result<()> {
    let key = m.key("feed_forward_length");
    let widths = per_layer_counts(m, &key, layers)?;
    if shared >= layers {
        // no layer left to hold K/V: the config reader names the count
        c.insert("intermediate_size".into(), json!(widths[0]));
        return Ok(());
    }
    let first_shared = layers.saturating_sub(shared) as usize;
    let base = widths[0];
    let double = widths
        .iter()
        .enumerate()
        .any(|(l, &w)| l >= first_shared && w != base);
    let fits = widths.iter().enumerate().all(|(l, &w)| {
        w == match (double, l >= first_shared) {
            (true, true) => 2 * base,
            _ => base,
        }
    });
    if !fits {
        return Err(m.err(
            &key,
            &format!(
                "one width, or one per layer with the last {shared} (the layers that share K/V) twice the others'"
            ),
            m.get(&key),
        ));
    }
    c.insert("intermediate_size".into(), json!(base));
    c.insert("use_double_wide_mlp".into(), json!(double));
    Ok(())
}

/// A count that may be stored once or per layer, as one value per layer.
fn per_layer_counts(m: &Meta<'_>, key: &str, layers: u64) -> Result<Vec<u64>> {
    let positive = |v: &MetaValue| v.as_u64().filter(|&n| n > 0);
    match m.get(key) {
        Some(MetaValue::Array(xs)) if xs.len() as u64 == layers => xs
            .iter()
            .map(|x| {
                positive(x).ok_or_else(|| m.err(key, "a positive integer per layer", m.get(key)))
            })
            .collect(),
        Some(MetaValue::Array(_)) => Err(m.err(
            key,
            &format!(
                "one count, or one per layer ({layers}, {})",
                m.key("block_count")
            ),
            m.get(key),
        )),
        Some(v) => match positive(v) {
            Some(n) => Ok(vec![n; layers as usize]),
            None => Err(m.err(key, "a positive integer", Some(v))),
        },
        None => Err(m.err(key, "a positive integer", None)),
    }
}

/// Factors at or above this leave a pair unrotated: the converter writes
/// 1e30 for the pairs Gemma 4's proportional RoPE does not turn.
const UNROTATED_FACTOR: f32 = 1e20;

/// Gemma 4's full layers' proportional RoPE from `rope_freqs.weight`, one
/// frequency divisor per pair `(i, i + D/2)` of a head of `head_dim`
/// values: the first `pairs` share one positive divisor (the rotation's
/// `factor`), the rest are at least [`UNROTATED_FACTOR`] (not rotated).
/// Returns `(pairs, factor)`; any other profile is refused, since lcut's
/// rotation would not be llama.cpp's.
fn proportional_pairs(m: &Meta<'_>, head_dim: u64) -> Result<(u64, f64)> {
    let name = "rope_freqs.weight";
    let Some(t) = m.header.tensors.get(name) else {
        return Err(ModelError::MissingTensor {
            folder: m.path.to_path_buf(),
            name: format!("{name} (which pairs Gemma 4's full layers rotate)"),
        });
    };
    let malformed = |reason: String| ModelError::GgufMalformed {
        path: m.path.to_path_buf(),
        offset: t.start,
        reason: format!("tensor `{name}`: {reason}"),
    };
    let half = (head_dim / 2) as usize;
    // ggml's type 0 is F32
    if t.type_id != 0 || t.shape != [half] {
        return Err(malformed(format!(
            "expected {half} f32 values (half of {}, {head_dim}), found type {} of shape {:?}",
            m.key("attention.key_length"),
            crate::gguf::header::ggml_type_name(t.type_id),
            t.shape
        )));
    }
    let Some(bytes) = m.bytes.get(t.start..t.start + 4 * half) else {
        return Err(malformed("its values lie past the end of the file".into()));
    };
    let factors: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let pairs = factors
        .iter()
        .position(|&f| f.partial_cmp(&UNROTATED_FACTOR) != Some(std::cmp::Ordering::Less))
        .unwrap_or(half);
    let factor = factors.first().copied().unwrap_or(1.0);
    let rotated_ok = factors[..pairs]
        .iter()
        .all(|&f| f.is_finite() && f > 0.0 && f == factor);
    let rest_ok = factors[pairs..].iter().all(|&f| f >= UNROTATED_FACTOR);
    if !(rotated_ok && rest_ok) {
        return Err(malformed(format!(
            "expected one positive divisor for the rotated pairs, then {UNROTATED_FACTOR:e} or more for the others (Gemma 4's proportional rotation), found {factors:?}"
        )));
    }
    let factor = if pairs == 0 { 1.0 } else { f64::from(factor) };
    Ok((pairs as u64, factor))
}

/// OLMo 3's layers as llama.cpp reads an `olmo2` file with a sliding
/// window into `c` (as an `olmo3` config): which layers slide
/// (`attention.sliding_window_pattern`, llama.cpp's period 4 when absent);
/// the full layers' RoPE (`rope.freq_base` and the file's scaling), the
/// sliding layers' (`rope.freq_base_swa`, else the same base; unscaled).
fn olmo3_layers(m: &Meta<'_>, layers: u64, c: &mut Map<String, Value>) -> Result<()> {
    c.insert("model_type".into(), json!(Arch::Olmo3.model_type()));
    c.insert("layer_types".into(), layer_types(m, layers, 4)?);
    // llama.cpp's default base where the file names none
    let full_theta = m.opt_f64(&m.key("rope.freq_base"))?.unwrap_or(10_000.0);
    let sliding_theta = m
        .opt_f64(&m.key("rope.freq_base_swa"))?
        .unwrap_or(full_theta);
    let mut full = json!({"rope_type": "default", "rope_theta": full_theta});
    if let (Some(Value::Object(params)), Some(obj)) = (c.get("rope_scaling"), full.as_object_mut())
    {
        obj.extend(params.clone());
    }
    c.insert(
        "rope_parameters".into(),
        json!({
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": sliding_theta},
        }),
    );
    Ok(())
}

/// The `layer_types` list of [`sliding_layers`].
fn layer_types(m: &Meta<'_>, layers: u64, default_period: u64) -> Result<Value> {
    let types: Vec<&str> = sliding_layers(m, layers, default_period)?
        .iter()
        .map(|&s| match s {
            true => "sliding_attention",
            false => "full_attention",
        })
        .collect();
    Ok(json!(types))
}

/// Which of `layers` layers slide: `attention.sliding_window_pattern` as
/// a period (every period-th layer full) or one flag per layer (true:
/// sliding), llama.cpp's `default_period` for the architecture when the
/// file has none.
fn sliding_layers(m: &Meta<'_>, layers: u64, default_period: u64) -> Result<Vec<bool>> {
    let key = m.key("attention.sliding_window_pattern");
    let period = |p: u64| (0..layers).map(|l| (l + 1) % p != 0).collect();
    match m.get(&key) {
        None => Ok(period(default_period)),
        Some(MetaValue::Array(flags)) => {
            if flags.len() as u64 != layers {
                return Err(m.err(
                    &key,
                    &format!("one flag per layer ({layers}, {})", m.key("block_count")),
                    m.get(&key),
                ));
            }
            flags
                .iter()
                .map(|f| match f {
                    MetaValue::Bool(b) => Ok(*b),
                    other => match other.as_u64() {
                        Some(n @ (0 | 1)) => Ok(n == 1),
                        _ => Err(m.err(&key, "true or false per layer", m.get(&key))),
                    },
                })
                .collect()
        }
        Some(v) => match v.as_u64() {
            Some(p) if p > 0 && p <= layers => Ok(period(p)),
            _ => Err(m.err(
                &key,
                &format!(
                    "a period from 1 to the layer count ({layers}, {}), or one flag per layer",
                    m.key("block_count")
                ),
                Some(v),
            )),
        },
    }
}

/// `{arch}.rope.scaling.*` as a Hugging Face `rope_scaling` object.
fn rope_scaling(m: &Meta<'_>) -> Result<Option<Value>> {
    let key = m.key("rope.scaling.type");
    match m.opt_str(&key)? {
        None | Some("none") => Ok(None),
        Some("linear") => {
            let factor_key = m.key("rope.scaling.factor");
            let factor = m
                .opt_f64(&factor_key)?
                .filter(|f| *f > 0.0)
                .ok_or_else(|| m.err(&factor_key, "a positive number", m.get(&factor_key)))?;
            Ok(Some(json!({"rope_type": "linear", "factor": factor})))
        }
        Some("yarn") => {
            // the converter's keys of transformers' YaRN parameters; the
            // config reader checks each and supplies transformers' defaults
            let mut params = Map::new();
            params.insert("rope_type".into(), json!("yarn"));
            for (hf, suffix) in [
                ("factor", "rope.scaling.factor"),
                (
                    "original_max_position_embeddings",
                    "rope.scaling.original_context_length",
                ),
                ("attention_factor", "rope.scaling.yarn_attn_factor"),
                ("beta_fast", "rope.scaling.yarn_beta_fast"),
                ("beta_slow", "rope.scaling.yarn_beta_slow"),
            ] {
                if let Some(x) = m.opt_f64(&m.key(suffix))? {
                    params.insert(hf.into(), json!(x));
                }
            }
            Ok(Some(Value::Object(params)))
        }
        Some(_) => Err(m.err(&key, "none, linear or yarn", m.get(&key))),
    }
}

/// Gemma 4's Hugging Face fields whose GGUF keys differ from [`KEYS`]' (a
/// field, or a field's sub-field such as `per_layer_config.2.head_dim`).
const GEMMA4_KEYS: [(&str, &str); 10] = [
    ("head_dim", "{a}.attention.key_length_swa"),
    ("global_head_dim", "{a}.attention.key_length"),
    ("num_key_value_heads", "{a}.attention.head_count_kv"),
    ("num_global_key_value_heads", "{a}.attention.head_count_kv"),
    ("per_layer_config", "{a}.attention.head_count_kv"),
    ("num_kv_shared_layers", "{a}.attention.shared_kv_layers"),
    (
        "hidden_size_per_layer_input",
        "{a}.embedding_length_per_layer_input",
    ),
    (
        "vocab_size_per_layer_input",
        "per_layer_token_embd.weight (rows)",
    ),
    ("layer_types", "{a}.attention.sliding_window_pattern"),
    ("top_k_experts", "{a}.expert_used_count"),
];

/// Rename a Hugging Face field in a config error to the GGUF key it came from.
fn name_gguf_key(err: ModelError, arch: &str) -> ModelError {
    match err {
        ModelError::ConfigField {
            path,
            field,
            expected,
            found,
        } => {
            let own: &[(&str, &str)] = match arch {
                "gemma4" => &GEMMA4_KEYS,
                _ => &[],
            };
            let is = |hf: &str| {
                field == hf
                    || field
                        .strip_prefix(hf)
                        .is_some_and(|rest| rest.starts_with('.'))
            };
            let key = own
                .iter()
                .chain(KEYS.iter())
                .find(|(hf, _)| is(hf))
                .map_or(field.clone(), |(_, k)| k.replace("{a}", arch));
            ModelError::GgufMetadata {
                path,
                key,
                expected,
                found,
            }
        }
        other => other,
    }
}
