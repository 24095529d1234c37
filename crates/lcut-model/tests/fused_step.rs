//! The fused decode step (lcut's kernels on host buffers) against the
//! tensor path it replaces, on the eight reference cases, on SmolLM2-135M
//! (its Q4_1 GGUF, `--dtype q`) and on Gemma 3 270M past its sliding
//! window: the same
//! prompt prefilled by the tensor path, then every decode-phase token one at
//! a time through each path, under full, SPEED (with BoS and anchor-free),
//! SelfOnly and SlimInfer (static and dynamic). The logits agree within
//! 1e-5 of the largest logit (f32 sums taken in another order), every
//! phase-mass probe field within 1e-5, and the policy's K/V bytes and
//! decisions are the same. (The tensor path itself is held to transformers
//! by the reference cases.)

mod common;

use anyhow::{Result, ensure};
use lcut_model::probes::{PhaseMassProbe, QueryMasses};
use lcut_model::{DType, Decoder, Device, LogitRows, Sequence, Tensor, WeightMode, argmax_rows};
use lcut_policy::{Policy, PolicySpec, TokenPhases};
use lcut_testkit::{real_gemma3, real_gemma3_reference, real_model, real_reference};

use common::{OracleModel as Case, oracle_models as cases};

/// The policies checked, for a model of `layers` layers.
fn policies(layers: usize) -> Vec<String> {
    let cut = (layers / 2).max(1);
    vec![
        "full".into(),
        format!("speed:{cut}+bos"),
        format!("speed:{cut}"),
        format!("selfonly:{cut}+bos"),
        format!("selfonly:{cut}"),
        format!("slim:{cut}@50%+block:2+unit:1+swap:0"),
        format!("slim:1/3@50%,2/3@25%+block:2+unit:1+swap:1"),
    ]
}

/// A run's logits from the decode start on [T - s, vocab], its probe
/// records and its final state.
struct Run {
    logits: Tensor,
    masses: Vec<QueryMasses>,
    seq: Sequence,
}

/// The prompt before the decode start in one chunk (tensor path), then
/// every later token alone, through the fused step or not.
fn run(c: &Case, model: &Decoder, policy: Policy) -> Result<Run> {
    let s = c.decode_start;
    let phases = TokenPhases::new(c.ids.len(), s, policy.anchor_len(None, s)?)?;
    let mut seq = model.new_sequence(policy, phases)?;
    seq.reserve(c.ids.len());
    // a linear layer's masses are its state split (none on other models)
    let mut probe = PhaseMassProbe::new(phases).with_state_split(model.config().num_heads);
    model.forward(&mut seq, &c.ids[..s], LogitRows::None, Some(&mut probe))?;
    let mut rows = Vec::new();
    for i in s..c.ids.len() {
        let out = model.forward(&mut seq, &c.ids[i..=i], LogitRows::Last, Some(&mut probe))?;
        rows.push(out.logits.expect("a decode-phase row"));
    }
    Ok(Run {
        logits: Tensor::cat(&rows, 0)?,
        masses: probe.records,
        seq,
    })
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

/// How far the prompt entropy of the two paths may part, relative to its
/// size above 1 nat. It is a sum of p·ln p over every prompt key a head
/// reads, after a softmax over scores that the two paths sum in different
/// orders (the fused step's kernels against candle's matrix products, whose
/// blocking follows the CPU they run on): measured 1.7e-5 at 1.51 nats
/// over 537 keys on Gemma 3's layer 12 on an Intel Xeon (1.2e-5 at 3.26 on
/// an AVX2 EPYC), where one key read or left out by mistake moves it by
/// far more (ln 537 - ln 536 = 1.9e-3 at uniform attention).
const ENTROPY_TOL: f32 = 5e-5;

/// Every mass of two probe records within `tol` (they lie in [0, 1]) and
/// the prompt entropy within [`ENTROPY_TOL`] relative to its size above 1,
/// or within `tol` where that is looser (a file kept quantized, whose
/// 8-bit product inputs move a whole step when rounding crosses a
/// boundary: 1.5e-4 measured on Gemma 4's Q8_0 file, shared layer 5, at an
/// entropy of 0.055), NaN where both are NaN.
fn same_masses(what: &str, a: &[QueryMasses], b: &[QueryMasses], tol: f32) -> Result<()> {
    ensure!(
        a.len() == b.len(),
        "{what}: {} records against {}",
        a.len(),
        b.len()
    );
    for (x, y) in a.iter().zip(b) {
        ensure!(
            (x.layer, x.position) == (y.layer, y.position),
            "{what}: records of different queries"
        );
        let fields = [
            ("bos", &x.bos, &y.bos, tol),
            ("anchor", &x.anchor, &y.anchor, tol),
            ("prefill", &x.prefill, &y.prefill, tol),
            ("decode", &x.decode, &y.decode, tol),
            ("self", &x.self_mass, &y.self_mass, tol),
            ("sink", &x.sink, &y.sink, tol),
            (
                "entropy",
                &x.prefill_entropy,
                &y.prefill_entropy,
                ENTROPY_TOL.max(tol),
            ),
        ];
        for (name, u, v, bound) in fields {
            for (h, (p, q)) in u.iter().zip(v.iter()).enumerate() {
                let same = (p.is_nan() && q.is_nan()) || (p - q).abs() <= bound * q.abs().max(1.0);
                ensure!(
                    same,
                    "{what}: layer {} position {} head {h} {name}: {p} against {q}",
                    x.layer,
                    x.position
                );
            }
        }
    }
    Ok(())
}

/// The fused step and the tensor path of `c` under every policy.
fn check_case(c: &Case) -> Result<()> {
    check_policies(c, &policies(c.model.config().num_layers), EXACT_REL)
}

/// How far the two paths' f32 logits and masses may part (relative to the
/// largest logit, or to a mass of at least 1): f32 sums in another order, a
/// few units in the sixth digit.
const EXACT_REL: f32 = 1e-5;

/// [`EXACT_REL`] for Gemma 4, which attends with scale 1 over RMS-normed
/// queries and keys: its attention logits are several times larger than
/// 1/sqrt(head_dim)-scaled ones, so the same f32 reordering moves its
/// probabilities further (1.1e-5 measured: `speed:5+bos`, shared layer 5,
/// a BoS share of 0.708; its logits differ by 1.7e-5 of 5.06, as
/// Mistral's do by 1.7e-5 of 4.4).
const GEMMA4_REL: f32 = 2e-5;

/// The fused step and the tensor path of `c` under `policies`, their
/// logits and masses within `rel` ([`EXACT_REL`], or [`QUANTIZED_REL`] for
/// a file kept quantized).
fn check_policies(c: &Case, policies: &[String], rel: f32) -> Result<()> {
    ensure!(
        c.model.unfused_reason()?.is_none(),
        "{}: no fused step ({:?})",
        c.name,
        c.model.unfused_reason()?
    );
    let mut tensor_path = c.model.clone();
    tensor_path.set_fused_decode(false);
    let layers = c.model.config().num_layers;
    for text in policies {
        let policy = text.parse::<PolicySpec>()?.resolve(layers)?;
        let what = format!("{} {text}", c.name);
        let fused = run(c, &c.model, policy)?;
        let reference = run(c, &tensor_path, policy)?;
        let d = max_diff(&fused.logits, &reference.logits)?;
        let scale = reference
            .logits
            .abs()?
            .flatten_all()?
            .max(0)?
            .to_scalar::<f32>()?;
        ensure!(
            d <= rel * scale.max(1.0),
            "{what}: logits differ by {d:e} (largest logit {scale})"
        );
        same_masses(&what, &fused.masses, &reference.masses, rel)?;
        ensure!(
            fused.seq.kv_bytes_held() == reference.seq.kv_bytes_held(),
            "{what}: {} K/V bytes held against {}",
            fused.seq.kv_bytes_held(),
            reference.seq.kv_bytes_held()
        );
        let (a, b) = (fused.seq.visibility(), reference.seq.visibility());
        ensure!(
            format!("{:?}", a.dynamic().map(|d| d.step_records()))
                == format!("{:?}", b.dynamic().map(|d| d.step_records())),
            "{what}: the policy decided differently"
        );
    }
    Ok(())
}

#[test]
fn the_fused_step_equals_the_tensor_path_on_every_reference_architecture() -> Result<()> {
    for c in cases()? {
        check_case(&c)?;
    }
    Ok(())
}

/// Records each decode token's routing at every layer of experts.
#[derive(Default)]
struct RoutingRecorder {
    /// (layer, position) -> (the router's probabilities, the chosen experts).
    rows: std::collections::BTreeMap<(usize, usize), (Vec<f32>, Vec<usize>)>,
}

impl lcut_model::Probe for RoutingRecorder {
    fn wants_routing(&self, _layer: usize) -> bool {
        true
    }

    fn on_routing(&mut self, view: lcut_model::RoutingView<'_>) -> lcut_model::Result<()> {
        let r = view.routing;
        for (i, &p) in view.positions.iter().enumerate() {
            let row = (r.probs[i].clone(), r.experts[i].clone());
            self.rows.insert((view.layer, p), row);
        }
        Ok(())
    }
}

/// The prompt in one chunk, then each later token alone, through the fused
/// step or not: the decode rows' logits and routing.
fn routed_run(c: &Case, model: &Decoder, policy: Policy) -> Result<(Vec<Tensor>, RoutingRecorder)> {
    let s = c.decode_start;
    let phases = TokenPhases::new(c.ids.len(), s, policy.anchor_len(None, s)?)?;
    let mut seq = model.new_sequence(policy, phases)?;
    model.forward(&mut seq, &c.ids[..s], LogitRows::None, None)?;
    let (mut rows, mut routing) = (Vec::new(), RoutingRecorder::default());
    for i in s..c.ids.len() {
        let out = model.forward(&mut seq, &c.ids[i..=i], LogitRows::Last, Some(&mut routing))?;
        rows.push(out.logits.expect("a decode-phase row"));
    }
    Ok((rows, routing))
}

/// The fused step against the tensor path on a model with experts, under
/// every policy: each decode token's routing is the same and its logits
/// agree within `tol` of the largest, up to the first token whose routing
/// differs; there, the router's k-th and (k+1)-th probabilities must be a
/// near-tie (within 1e-5) that rounding in another summation order can
/// cross, and the tokens after it, which read a different history, are
/// not compared.
fn check_experts_case(c: &Case, tol: f32) -> Result<()> {
    let mut tensor_path = c.model.clone();
    tensor_path.set_fused_decode(false);
    let layers = c.model.config().num_layers;
    let top_k = c.model.config().experts.map_or(0, |e| e.top_k);
    // SlimInfer is refused on a recurrence (Qwen3.5-MoE's linear layers)
    let recurrent = c.model.config().linear_attention.is_some();
    let runs = policies(layers)
        .into_iter()
        .filter(|p| !(recurrent && p.starts_with("slim")));
    for text in runs {
        let policy = text.parse::<PolicySpec>()?.resolve(layers)?;
        let (fused, fused_routes) = routed_run(c, &c.model, policy)?;
        let (reference, routes) = routed_run(c, &tensor_path, policy)?;
        let what = format!("{} {text}", c.name);
        ensure!(!routes.rows.is_empty(), "{what}: no routing recorded");
        for (i, (a, b)) in fused.iter().zip(&reference).enumerate() {
            let pos = c.decode_start + i;
            let flip =
                routes
                    .rows
                    .iter()
                    .filter(|((_, p), _)| *p == pos)
                    .find(|(key, (_, experts))| {
                        fused_routes
                            .rows
                            .get(key)
                            .is_some_and(|(_, e)| e != experts)
                    });
            if let Some(((layer, _), (probs, _))) = flip {
                let mut sorted = probs.clone();
                sorted.sort_by(|x, y| y.total_cmp(x));
                let margin = sorted[top_k - 1] - sorted[top_k];
                ensure!(
                    margin <= 1e-5,
                    "{what}: position {pos} layer {layer}: the paths route differently with a margin of {margin:e}"
                );
                break;
            }
            let d = max_diff(a, b)?;
            let scale = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
            ensure!(
                d <= tol * scale.max(1.0),
                "{what}: position {pos}: logits differ by {d:e} (largest logit {scale})"
            );
        }
    }
    Ok(())
}

/// How far a quantized file's logits may part between the two paths: both
/// quantize each product's input to 8 bits, and an input that moves by
/// rounding (1e-7) across a rounding boundary moves a quantized value by a
/// whole step, which the products carry on (measured 0.009 of the largest
/// logit on the Qwen3-MoE Q8_0 file under SelfOnly; the dense models'
/// quantized paths are held to their tokens for the same reason). The
/// quantized products' own bound against the dequantized weights
/// (`gguf_oracle.rs`).
const QUANTIZED_REL: f32 = 0.05;

/// Models with experts: the fused step routes each token by the model's
/// rule and reads only its experts; it equals the tensor path on every MoE
/// case (gpt-oss with its sinks, biases and clamped SwiGLU too; Qwen3.5-MoE
/// with its shared expert), from their folders in f32 and from llama.cpp's
/// Q8_0 files kept quantized.
#[test]
fn the_fused_step_equals_the_tensor_path_on_models_with_experts() -> Result<()> {
    for c in common::models_of(&lcut_testkit::ROUTED_CASES)? {
        let reason = c.model.unfused_reason()?;
        ensure!(reason.is_none(), "{}: no fused step ({reason:?})", c.name);
        check_experts_case(&c, 1e-5)?;
    }
    // gpt-oss's file with MXFP4 experts (its own files' kind) too
    let files = lcut_testkit::MOE_GGUF_CASES
        .into_iter()
        .chain([lcut_testkit::QWEN35MOE_CASE, lcut_testkit::GEMMA4MOE_CASE])
        .map(|name| (name, "model.q8_0.gguf"))
        .chain([("moe/gptoss-gguf", "model.mxfp4.gguf")]);
    for (name, file) in files {
        let path = lcut_testkit::oracle_case(name).join(file);
        let mut c = common::models_of(&[name])?.remove(0);
        c.model = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
        c.name = match (name, file) {
            (_, "model.mxfp4.gguf") => "gpt-oss MXFP4 GGUF",
            (n, _) if n.contains("mixtral") => "Mixtral Q8_0 GGUF",
            (n, _) if n.contains("gptoss") => "gpt-oss Q8_0 GGUF",
            (n, _) if n.contains("qwen35moe") => "Qwen3.5-MoE Q8_0 GGUF",
            (n, _) if n.contains("gemma4") => "Gemma 4 MoE Q8_0 GGUF",
            _ => "Qwen3-MoE Q8_0 GGUF",
        };
        let reason = c.model.unfused_reason()?;
        ensure!(reason.is_none(), "{}: no fused step ({reason:?})", c.name);
        check_experts_case(&c, QUANTIZED_REL)?;
    }
    Ok(())
}

/// Gemma 4's decode steps on the fused step: layers of two head widths and
/// K/V head counts, keys that are the values on the full layer, the shared
/// layers reading earlier layers' caches under their own rule, the
/// per-layer input branch and the layer scalars; the logits, the masses
/// and the K/V held equal the tensor path's under every policy that runs on
/// shared K/V (cuts below, between and through the shared layers), from
/// its folder and from llama.cpp's files (Q8_0 read in place).
#[test]
fn gemma4s_fused_step_equals_the_tensor_path() -> Result<()> {
    let policies: Vec<String> = [
        "full",
        "speed:2+bos",
        "speed:2",
        "speed:5+bos",
        "selfonly:3+bos",
        "selfonly:1",
    ]
    .map(String::from)
    .to_vec();
    let mut c = common::models_of(&[lcut_testkit::GEMMA4_CASE])?.remove(0);
    check_policies(&c, &policies, GEMMA4_REL)?;
    let dir = lcut_testkit::oracle_case(lcut_testkit::GEMMA4_CASE);
    for (file, mode, rel) in [
        ("model.f32.gguf", WeightMode::Dense(DType::F32), GEMMA4_REL),
        ("model.q8_0.gguf", WeightMode::Quantized, QUANTIZED_REL),
    ] {
        c.model = Decoder::load_as(&dir.join(file), mode, &Device::Cpu)?;
        c.name = match mode {
            WeightMode::Quantized => "Gemma 4 Q8_0 GGUF",
            _ => "Gemma 4 F32 GGUF",
        };
        check_policies(&c, &policies, rel)?;
    }
    Ok(())
}

/// Qwen3.5's decode steps on the fused step: its linear layers' projections
/// through lcut's kernels and each lane's recurrence on its own state, its
/// full layers' output gate; the logits, the masses (the linear layers'
/// state split included), the K/V held and the states equal the tensor
/// path's, under every policy that runs on the layout, from its folder and
/// from llama.cpp's files (the value heads in their tiled order; Q8_0 read
/// in place).
#[test]
fn qwen35s_fused_step_equals_the_tensor_path() -> Result<()> {
    let policies: Vec<String> = [
        "full",
        "speed:4+bos",
        "speed:4",
        "selfonly:4+bos",
        "selfonly:2",
    ]
    .map(String::from)
    .to_vec();
    let mut c = common::models_of(&[lcut_testkit::QWEN35_CASE])?.remove(0);
    check_policies(&c, &policies, EXACT_REL)?;
    let dir = lcut_testkit::oracle_case(lcut_testkit::QWEN35_CASE);
    // kept quantized, one 8-bit rounding of a product's input crosses a
    // boundary (selfonly:2, position 29, layer 5: inputs 8e-7 apart, logits
    // then 2e-2 of 3.4 apart; every other policy within 1e-6)
    for (file, mode, rel) in [
        ("model.f32.gguf", WeightMode::Dense(DType::F32), EXACT_REL),
        ("model.q8_0.gguf", WeightMode::Quantized, QUANTIZED_REL),
    ] {
        c.model = Decoder::load_as(&dir.join(file), mode, &Device::Cpu)?;
        c.name = match mode {
            WeightMode::Quantized => "Qwen3.5 Q8_0 GGUF",
            _ => "Qwen3.5 F32 GGUF",
        };
        check_policies(&c, &policies, rel)?;
    }
    Ok(())
}

/// SmolLM2 on a real chat prompt (the reference case `factual`: 44 prompt
/// tokens and its 16-token greedy answer, from `fixtures/real`).
fn smollm2_case(model: Decoder) -> Result<Case> {
    let dir = real_reference();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json"))?)?;
    let case = &meta["cases"][0];
    let name = case["name"].as_str().unwrap_or_default();
    let tensors = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let ids = tensors
        .get(&format!("{name}.input_ids"))
        .ok_or_else(|| anyhow::anyhow!("no input ids for {name}"))?
        .to_dtype(DType::U32)?
        .to_vec1::<u32>()?;
    let decode_start = case["decode_start"].as_u64().unwrap_or(0) as usize;
    Ok(Case {
        name: "SmolLM2-135M",
        model,
        ids,
        decode_start,
    })
}

#[test]
fn the_fused_step_equals_the_tensor_path_on_smollm2() -> Result<()> {
    let Some(path) = real_model() else {
        return Ok(());
    };
    let model = Decoder::load_as(&path, WeightMode::Dense(DType::F32), &Device::Cpu)?;
    check_case(&smollm2_case(model)?)
}

/// Gemma 3 270M on its `retrieval` case of `fixtures/real/gemma3`: a
/// 537-token prompt, longer than the 512-token window of its sliding layers
/// (so a decode step's sliding layers read only their window of the cache
/// and the global ones all of it, each with its own RoPE base), then its
/// 16 greedy tokens.
#[test]
fn the_fused_step_equals_the_tensor_path_on_gemma3() -> Result<()> {
    let Some(path) = real_gemma3() else {
        return Ok(());
    };
    let dir = real_gemma3_reference();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json"))?)?;
    let case = meta["cases"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "retrieval"))
        .ok_or_else(|| anyhow::anyhow!("no retrieval case"))?;
    let tensors = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
    let ids = tensors["retrieval.input_ids"]
        .to_dtype(DType::U32)?
        .to_vec1::<u32>()?;
    let c = Case {
        name: "Gemma-3-270M",
        model: Decoder::load_as(&path, WeightMode::Dense(DType::F32), &Device::Cpu)?,
        ids,
        decode_start: case["decode_start"].as_u64().unwrap_or(0) as usize,
    };
    ensure!(c.decode_start > 512, "a prompt past the window");
    check_policies(&c, &["full".into(), "speed:12+bos".into()], EXACT_REL)
}

/// How far `--dtype q` logits may move when a sum is taken in another
/// order (the bound the real-model tests allow between the quantized and
/// dequantized paths).
const QUANTIZED_TOL: f32 = 2.5;

/// A row whose top two logits are further apart than this keeps its top-1
/// token when sums are taken in another order. Measured: such an order
/// moves `--dtype q` logits by 0.16 on average and 1.1 to 1.5 at most, so
/// rows closer than that may swap their two best tokens (the `factual`
/// answer has rows with margins of 0.04, 0.6 and 0.67); 14 or 15 of the
/// 20 rows are above it, and a check needs at least half.
const DECIDED: f32 = 1.0;

/// Top-1 agreement of `a` and `b`: (rows of `a` whose top-2 margin is
/// above [`DECIDED`] and where `b` has the same top-1, such rows, rows
/// where the two agree, all rows).
fn top1_where_decided(a: &Tensor, b: &Tensor) -> Result<(usize, usize, usize, usize)> {
    let (x, y) = (argmax_rows(a)?, argmax_rows(b)?);
    let (mut kept, mut decided) = (0, 0);
    for ((row, p), q) in a.to_vec2::<f32>()?.iter().zip(&x).zip(&y) {
        let mut top = row.clone();
        top.sort_by(|u, v| v.total_cmp(u));
        if top[0] - top[1] > DECIDED {
            decided += 1;
            kept += usize::from(p == q);
        }
    }
    let agree = x.iter().zip(&y).filter(|(p, q)| p == q).count();
    Ok((kept, decided, agree, x.len()))
}

/// With `--dtype q` the activations are quantized to 8 bits before each
/// product, so the last bit of any sum taken in another order can move an
/// activation by a whole step: the two paths stay close (measured: 1.1 to
/// 1.5 at most on logits up to 26), not within 1e-5, and keep the top-1
/// token of every row whose top two logits are not a near tie.
#[test]
fn quantized_smollm2_decodes_the_same_tokens_either_way() -> Result<()> {
    let Some(path) = real_model() else {
        return Ok(());
    };
    let model = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
    ensure!(
        model.unfused_reason()?.is_none(),
        "Q4_1 SmolLM2 decodes fused"
    );
    let c = smollm2_case(model.clone())?;
    let mut tensor_path = model;
    tensor_path.set_fused_decode(false);
    let layers = c.model.config().num_layers;
    for text in ["full", "speed:22+bos"] {
        let policy = text.parse::<PolicySpec>()?.resolve(layers)?;
        let (a, b) = (run(&c, &c.model, policy)?, run(&c, &tensor_path, policy)?);
        let d = max_diff(&a.logits, &b.logits)?;
        let (kept, decided, agree, rows) = top1_where_decided(&a.logits, &b.logits)?;
        eprintln!(
            "{text}: fused and tensor path of Q4_1 SmolLM2 differ by up to {d}, top-1 {agree}/{rows}, \
             {kept}/{decided} where the top-2 margin is above {DECIDED}"
        );
        ensure!(d <= QUANTIZED_TOL, "{text}: logits differ by {d}");
        ensure!(
            kept == decided && 2 * decided >= rows,
            "{text}: top-1 agreement {kept}/{decided} on decided rows ({rows} rows)"
        );
    }
    Ok(())
}

/// An f16 cache (half the bytes a decode step reads of it) against the
/// f32 one on SmolLM2, dequantized (what the cache's rounding alone does:
/// measured 0.018 at most on logits up to 26) and with `--dtype q` (1.3 to
/// 1.53 depending on the order the prefill's products sum in, where any
/// rounding is amplified by the 8-bit activations, as above); the same
/// top-1 token on every row that is not a near tie.
#[test]
fn an_f16_cache_moves_smollm2s_logits_a_little() -> Result<()> {
    let Some(path) = real_model() else {
        return Ok(());
    };
    let modes = [
        (WeightMode::Dense(DType::F32), 0.05),
        (WeightMode::Quantized, 2.0),
    ];
    for (mode, tol) in modes {
        let model = Decoder::load_as(&path, mode, &Device::Cpu)?;
        let c = smollm2_case(model.clone())?;
        let mut half = model;
        half.set_kv_dtype(DType::F16)?;
        let layers = c.model.config().num_layers;
        for text in ["full", "speed:22+bos"] {
            let policy = text.parse::<PolicySpec>()?.resolve(layers)?;
            let exact = run(&c, &c.model, policy)?;
            let f16 = run(&c, &half, policy)?;
            let d = max_diff(&exact.logits, &f16.logits)?;
            let (kept, decided, agree, rows) = top1_where_decided(&exact.logits, &f16.logits)?;
            let what = format!("{} {text}", mode.name());
            eprintln!(
                "{what}: an f16 cache moves logits by up to {d}, top-1 {agree}/{rows}, \
                 {kept}/{decided} where the top-2 margin is above {DECIDED}"
            );
            ensure!(d <= tol, "{what}: an f16 cache moved logits by {d}");
            ensure!(
                kept == decided && 2 * decided >= rows,
                "{what}: top-1 agreement {kept}/{decided} on decided rows ({rows} rows)"
            );
            ensure!(
                2 * f16.seq.kv_bytes_held() == exact.seq.kv_bytes_held(),
                "{what}: an f16 cache holds half the bytes"
            );
        }
    }
    Ok(())
}
