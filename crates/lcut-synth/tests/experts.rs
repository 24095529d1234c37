//! The mixtures of experts (Qwen3-30B-A3B's, Mixtral-8x7B's and Gemma 4
//! 26B-A4B's shapes, at test size) in every format: the GGUF file holds each expert's drawn
//! weights quantized in llama.cpp's 3-D tensors, under the keys, names,
//! types and dimensions llama.cpp's own converter gives them (held to the
//! files it wrote for the reference cases); every format loads as a
//! decoder that computes what the drawn model does; and the routing is not
//! degenerate: different tokens take different experts at every layer,
//! where the same shape with its embedding drawn as small as the other
//! matrices sends almost every token to the same one.

#![allow(clippy::unwrap_used)] // test helpers unwrap like the tests do

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use lcut_model::config::QkNorm;
use lcut_model::gguf::{GgufFile, GgufWeights};
use lcut_model::{Arch, Decoder, ModelConfig, Probe, RoutingView, WeightSource};
use lcut_synth::draw::RandomWeights;
use lcut_synth::shapes::{self, ModelShape, TensorKind};
use lcut_synth::write::gguf::ggml_type;
use lcut_synth::{Format, RandomModel};

mod common;
use common::{every_format_computes, matches_converter, max_diff, write};

/// Qwen3-30B-A3B's layout at test size: 4 layers, width 256, 4 heads
/// 128 wide (twice 256 / 4, as the real model's are twice 2048 / 32), 2
/// K/V heads, 8 experts of width 256, 3 run per token.
fn tiny_qwen3moe() -> ModelShape {
    let mut s = shapes::qwen3_30b_a3b();
    s.name = "tiny-qwen3moe".into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 256;
    s.sizes.intermediate_size = 512;
    s.sizes.num_layers = 4;
    s.sizes.num_heads = 4;
    s.sizes.num_kv_heads = 2;
    s.tokens.bos = 500;
    s.tokens.eos = 501;
    s.experts = s.experts.map(|mut e| {
        e.num_experts = 8;
        e.top_k = 3;
        e.inner = 256;
        e
    });
    s
}

/// Gemma 4 26B-A4B's layout at test size, laid out as the reference case
/// `layouts/gemma4-moe`: 6 layers, the third and the sixth full (heads 32
/// wide against the sliding layers' 16, one K/V head against two, their
/// keys their values), a window of 12; width 64, 4 heads, a dense MLP 160
/// wide beside 4 experts of width 32 (the case's are 16, which Q8_0's
/// blocks of 32 do not fit), 2 run per token; no per-layer inputs.
fn tiny_gemma4moe() -> ModelShape {
    let mut s = shapes::gemma_4_26b_a4b();
    s.name = "tiny-gemma4moe".into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 64;
    s.sizes.intermediate_size = 160;
    s.sizes.num_layers = 6;
    s.sizes.num_heads = 4;
    s.sizes.num_kv_heads = 2;
    s.head_dim = Some(16);
    s.gemma4 = s.gemma4.map(|mut g| {
        g.full_interval = 3;
        g.window = 12;
        g.full_head_dim = 32;
        g.full_kv_heads = 1;
        g
    });
    s.experts = s.experts.map(|mut e| {
        e.num_experts = 4;
        e.top_k = 2;
        e.inner = 32;
        e
    });
    s
}

/// Mixtral-8x7B's layout at test size: 4 layers, width 256, 4 heads (2
/// K/V), its 8 experts (so llama.cpp's 8-expert Q4_K_M types apply) of
/// width 256, 2 run per token.
fn tiny_mixtral() -> ModelShape {
    let mut s = shapes::mixtral_8x7b();
    s.name = "tiny-mixtral".into();
    s.sizes.vocab_size = 512;
    s.sizes.hidden_size = 256;
    s.sizes.intermediate_size = 256;
    s.sizes.num_layers = 4;
    s.sizes.num_heads = 4;
    s.sizes.num_kv_heads = 2;
    s.experts = s.experts.map(|mut e| {
        e.inner = 256;
        e
    });
    s
}

/// The experts each token took, per layer.
#[derive(Default)]
struct Routes {
    chosen: BTreeMap<usize, Vec<Vec<usize>>>,
}

impl Probe for Routes {
    fn wants_routing(&self, _layer: usize) -> bool {
        true
    }

    fn on_routing(&mut self, view: RoutingView<'_>) -> lcut_model::Result<()> {
        let rows = self.chosen.entry(view.layer).or_default();
        rows.extend(view.routing.experts.iter().cloned());
        Ok(())
    }
}

impl Routes {
    /// Per layer: how many experts some token took, and the largest share
    /// of the tokens one expert took.
    fn spread(&self) -> Vec<(usize, f64)> {
        self.chosen
            .values()
            .map(|rows| {
                let mut count: HashMap<usize, usize> = HashMap::new();
                for e in rows.iter().flatten() {
                    *count.entry(*e).or_default() += 1;
                }
                let most = count.values().copied().max().unwrap_or(0);
                (count.len(), most as f64 / rows.len().max(1) as f64)
            })
            .collect()
    }
}

/// `count` tokens spread over the vocabulary below the special tokens.
fn tokens(count: usize) -> Vec<u32> {
    (0..count as u32).map(|i| 3 + (97 * i + 11) % 490).collect()
}

/// The routing of `model` over `tokens`, per layer.
fn route(model: &Decoder, tokens: &[u32]) -> Routes {
    let mut routes = Routes::default();
    model
        .teacher_forced_logits(tokens, Some(&mut routes))
        .unwrap();
    routes
}

/// Every layer of `routes` spreads its tokens: every expert taken by some
/// token, none by more than `most` of them.
fn assert_spread(what: &str, routes: &Routes, layers: usize, experts: usize, most: f64) {
    let spread = routes.spread();
    assert_eq!(spread.len(), layers, "{what}: a routing per layer");
    for (l, (used, share)) in spread.into_iter().enumerate() {
        assert!(
            used == experts && share <= most,
            "{what}: layer {l} used {used} of {experts} experts, one of them for {share:.2} of the tokens"
        );
    }
}

/// Each expert's weights lie in their slab of the layer's 3-D tensor,
/// quantized as candle quantizes the drawn matrix in the type llama.cpp's
/// mix gives it; routers and norms in f32, exactly as drawn (the
/// embedding drawn as a routed one). The config read back is the shape's:
/// architecture, head width, q/k norms, experts.
#[test]
fn gguf_holds_each_experts_drawn_weights() {
    let dir = tempfile::tempdir().unwrap();
    for shape in [tiny_qwen3moe(), tiny_mixtral()] {
        let drawn = RandomWeights::of_shape("drawn".into(), &shape, 4);
        let want = shape.config().unwrap();
        for format in Format::ALL.into_iter().filter(|f| f.is_gguf()) {
            let out = dir.path().join(format!("{}-{format}.gguf", shape.name));
            write(&shape, format, &out, 4);
            let file = GgufFile::open(&out).unwrap();
            let cfg = file.config().clone();
            assert_eq!(
                (cfg.arch, cfg.head_dim, cfg.qk_norm, cfg.experts),
                (want.arch, want.head_dim, want.qk_norm, want.experts),
                "{} in {format}",
                shape.name
            );
            assert_eq!(cfg.sparse_layers, vec![true; 4]);
            let weights = GgufWeights::new(file);
            for t in shape.tensors() {
                let read = weights
                    .load(&t.name, &t.dims, DType::F32, &Device::Cpu)
                    .unwrap();
                let dense = drawn
                    .load(&t.name, &t.dims, DType::F32, &Device::Cpu)
                    .unwrap();
                let mxfp4 = format == Format::GgufMxfp4
                    && shapes::expert_index(&t.name).is_some()
                    && t.kind == TensorKind::Matrix;
                let want = match ggml_type(&shape, format, &t) {
                    _ if mxfp4 => mxfp4_round_trip(&dense),
                    GgmlDType::F32 => dense,
                    ty => QTensor::quantize(&dense, ty)
                        .unwrap()
                        .dequantize(&Device::Cpu)
                        .unwrap(),
                };
                assert_eq!(max_diff(&read, &want), 0.0, "{} in {format}", t.name);
            }
        }
    }
}

/// `dense` quantized to MXFP4 by lcut's kernels (held to gguf-py's blocks
/// in `lcut-kernels`' tests) and read back.
fn mxfp4_round_trip(dense: &Tensor) -> Tensor {
    let values = dense.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut blocks = vec![0u8; values.len() / 32 * 17];
    lcut_kernels::quant::quantize_mxfp4(&values, &mut blocks).unwrap();
    let mut back = vec![0f32; values.len()];
    lcut_kernels::quant::dequantize(lcut_kernels::quant::QuantFormat::Mxfp4, &blocks, &mut back)
        .unwrap();
    Tensor::from_vec(back, dense.shape(), &Device::Cpu).unwrap()
}

/// Every format loads as a decoder (dense, and from GGUF also with its
/// matrices kept quantized) that computes close to what the drawn model
/// does, and routes 64 tokens over every expert at every layer, no expert
/// taking more than about twice its even share (3 of 8: 0.375; 2 of 8:
/// 0.25).
#[test]
fn every_format_loads_and_routes_tokens_apart() {
    let dir = tempfile::tempdir().unwrap();
    let ids = tokens(64);
    for (shape, most) in [
        (tiny_qwen3moe(), 0.75),
        (tiny_mixtral(), 0.5),
        (tiny_gemma4moe(), 0.75),
    ] {
        let layers = shape.sizes.num_layers;
        let drawn = RandomModel {
            shape: shape.clone(),
            seed: 5,
        }
        .build(DType::F32, &Device::Cpu)
        .unwrap();
        let want = drawn.teacher_forced_logits(&ids, None).unwrap();
        let experts = shape.experts.unwrap().num_experts;
        assert_spread(&shape.name, &route(&drawn, &ids), layers, experts, most);
        every_format_computes(
            &shape,
            5,
            dir.path(),
            (&ids, &want),
            0.5,
            |format, _, mode, model| {
                let what = format!("{} as {format} ({})", shape.name, mode.name());
                assert_eq!(model.config().arch, shape.arch(), "{what}");
                assert_spread(&what, &route(model, &ids), layers, experts, most);
            },
        );
    }
}

/// Why the embedding of a shape with experts is drawn large: the same
/// shape with every matrix at 0.02 sends most tokens to one expert at
/// some layer, where the shape's own draws spread them (the test above).
#[test]
fn small_embeddings_would_route_every_token_alike() {
    let ids = tokens(64);
    for shape in [tiny_qwen3moe(), tiny_mixtral()] {
        let cfg: ModelConfig = shape.config().unwrap();
        // `new` draws by name alone: the embedding as a plain matrix
        let plain = RandomWeights::new("plain".into(), 5);
        let model = Decoder::from_weights(cfg, &plain, DType::F32, &Device::Cpu).unwrap();
        let spread = route(&model, &ids).spread();
        let worst = spread.iter().map(|(_, share)| *share).fold(0.0, f64::max);
        assert!(
            worst >= 0.9,
            "{}: at 0.02 the most popular expert took only {worst:.2} of the tokens ({spread:?})",
            shape.name
        );
    }
}

/// The GGUF files have the keys, tensor names, types and dimensions
/// llama.cpp's converter wrote for the reference cases in Q8_0
/// (`fixtures/oracle/moe`): every `{arch}.*` key it wrote (ours add only
/// the vocabulary size and, for Qwen3-MoE, the rotated width), the same
/// tensors per layer and at the top, each of the same type and rank, the
/// experts as [experts, rows, columns] and the router [experts, width]
/// in f32.
#[test]
fn gguf_files_match_llama_cpps_converter() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/moe");
    for (shape, case) in [
        (tiny_qwen3moe(), "qwen3moe-sparse"),
        (tiny_mixtral(), "mixtral-top2"),
    ] {
        let out = dir.path().join(format!("{}.gguf", shape.name));
        write(&shape, Format::GgufQ8_0, &out, 1);
        let reference = root.join(case).join("model.q8_0.gguf");
        // Qwen3-MoE's files add the rotated width
        matches_converter(&out, &reference, &["blk.0."], &[".rope.dimension_count"]);
        let ours = GgufFile::open(&out).unwrap();
        let theirs = GgufFile::open(&reference).unwrap();
        let (ours, theirs) = (ours.header(), theirs.header());
        let arch = theirs.metadata["general.architecture"].as_str().unwrap();
        for h in [ours, theirs] {
            let m = &h.metadata;
            let count = |k: &str| m[&format!("{arch}.{k}")].as_u64().unwrap() as usize;
            let (experts, hidden) = (count("expert_count"), count("embedding_length"));
            let t = |name: &str| h.tensors[&format!("blk.0.{name}.weight")].shape.clone();
            assert_eq!(t("ffn_gate_inp"), vec![experts, hidden], "{case}");
            for stack in ["ffn_gate_exps", "ffn_up_exps"] {
                let dims = t(stack);
                assert_eq!((dims[0], dims[2]), (experts, hidden), "{case} {stack}");
            }
            let down = t("ffn_down_exps");
            assert_eq!((down[0], down[1]), (experts, hidden), "{case}");
            assert_eq!(h.tensors["blk.0.ffn_gate_inp.weight"].type_id, 0);
        }
    }
}

/// Gemma 4's experts beside its MLP, written as llama.cpp's converter
/// wrote the reference case `layouts/gemma4-moe` in Q8_0
/// ([`common::matches_converter`]: its keys, and the tensors of a sliding
/// layer and of a full layer whose keys are its values, which has no
/// `attn_v`): the stacked `ffn_gate_up_exps` and `ffn_down_exps`, the
/// router in f32 with its two scales, the branch's norms, one K/V head
/// count per layer. Read back, the folder and the file are the shape: two
/// K/V heads on the sliding layers and one on the full ones, whose values
/// are their keys, the experts beside every MLP.
#[test]
fn gemma4s_experts_match_llama_cpps_converter() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/layouts");
    let shape = tiny_gemma4moe();
    let out = dir.path().join("tiny-gemma4moe.gguf");
    write(&shape, Format::GgufQ8_0, &out, 1);
    let theirs = root.join("gemma4-moe/model.q8_0.gguf");
    matches_converter(&out, &theirs, &["blk.0.", "blk.2."], &[]);
    let folder = dir.path().join("tiny-gemma4moe");
    write(&shape, Format::SafetensorsF32, &folder, 1);
    for path in [&out, &folder] {
        let cfg = Decoder::load(path, DType::F32, &Device::Cpu)
            .unwrap()
            .config()
            .clone();
        let kv: Vec<(usize, usize, bool)> = cfg
            .layer_attention
            .iter()
            .map(|a| (a.kv_heads, a.head_dim, a.values_from_keys))
            .collect();
        let (sliding, full) = ((2, 16, false), (1, 32, true));
        assert_eq!(kv, [sliding, sliding, full, sliding, sliding, full]);
        let e = cfg.experts.unwrap();
        assert_eq!((e.num_experts, e.top_k, e.inner), (4, 2, 32));
        assert!(e.beside_mlp);
        assert!(cfg.per_layer_input.is_none());
    }
}

/// The full shapes fit every GGUF format's blocks (planned, not written),
/// and a cut to 4 layers keeps their experts and attention.
#[test]
fn the_full_mixtures_of_experts_plan_in_every_gguf_format() {
    for shape in [shapes::qwen3_30b_a3b(), shapes::mixtral_8x7b()] {
        for format in Format::ALL.into_iter().filter(|f| f.is_gguf()) {
            let plan = lcut_synth::write::gguf::plan(&shape, format).unwrap();
            assert!(plan.data_bytes() > 0, "{} in {format}", shape.name);
        }
        let cut = shape.clone().with_layers(4);
        let cfg = cut.config().unwrap();
        assert_eq!(cfg.num_layers, 4);
        assert_eq!(cfg.experts, shape.config().unwrap().experts);
        assert_eq!(cfg.head_dim, 128);
        let per_head = shape.arch() == Arch::Qwen3Moe;
        assert_eq!(cfg.qk_norm == QkNorm::PerHead, per_head);
    }
}
