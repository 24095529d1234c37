//! What the routing diagnostics tell a user about a mixture-of-experts
//! model, on the tiny reference models in `fixtures/oracle/moe`: the
//! report's expert load sums to 1 at every sparse layer, the router's
//! entropy lies in [0, 1], a policy that changes nothing overlaps the full
//! model exactly, a SPEED cut's overlap is the one transformers' own
//! routing gives on the same tokens, the sweep's overlap per cut is the
//! diagnostics' overlap at that cut, and a dense model has no routing.
//! The models are random: the numbers test the mechanics, not a finding.

mod common;

use anyhow::{Context, Result, ensure};
use candle_core::{DType, Device, Tensor};
use lcut_engine::diagnose::{
    DiagnoseOptions, LabelledPrompt, SweepOptions, diagnose_prepared, routing_overlap_of, sweep,
};
use lcut_engine::{EngineError, PreparedPrompt, Session};
use lcut_policy::PolicySpec;
use lcut_testkit::{ROUTED_CASES, oracle_case, oracle_ids};
use lcut_trace::{Report, Thresholds};

/// The cases whose layers route tokens to experts (lcut loads the folder of each).
fn cases() -> impl Iterator<Item = &'static str> {
    ROUTED_CASES.iter().copied()
}

fn session(case: &str) -> Result<Session> {
    Ok(Session::load(&oracle_case(case), DType::F32, &Device::Cpu)?)
}

/// Two prompts cut from the case's token ids, the decode phase starting
/// three tokens before each prompt's end.
fn prompts(case: &str) -> Result<Vec<LabelledPrompt>> {
    common::prompts_from(&oracle_ids(case)?, &[14, 24])
}

fn diagnose(s: &Session, case: &str, routing_policy: Option<&str>) -> Result<Report> {
    let opts = DiagnoseOptions {
        max_new_tokens: 6,
        routing_policy: routing_policy.map(str::parse).transpose()?,
        ..DiagnoseOptions::default()
    };
    Ok(diagnose_prepared(s, &prompts(case)?, &opts, &mut |_| true)?)
}

#[test]
fn diagnose_reports_entropy_load_and_overlap_at_every_sparse_layer() -> Result<()> {
    for case in cases() {
        let s = session(case)?;
        let cfg = s.model.config().clone();
        let experts = cfg.experts.context("a MoE case")?;
        let r = diagnose(&s, case, Some("speed:2+bos"))?;
        let c = r.curves.routing.as_ref().context("no routing curves")?;
        let sparse: Vec<usize> = (0..cfg.num_layers)
            .filter(|&l| cfg.sparse_layers[l])
            .collect();
        ensure!(c.sparse_layers == sparse, "{case}: {:?}", c.sparse_layers);
        ensure!((c.num_experts, c.top_k) == (experts.num_experts, experts.top_k));
        ensure!(c.policy.as_deref() == Some("speed:2+bos"), "{case}");
        ensure!(r.settings.routing_policy.as_deref() == Some("speed:2+bos"));
        let tokens: usize = r.traces.iter().map(|t| t.num_steps()).sum();
        ensure!(
            c.tokens == tokens && tokens > 0,
            "{case}: {} tokens",
            c.tokens
        );
        for l in 0..cfg.num_layers {
            let load = c.load.view().row(l).to_vec();
            if cfg.sparse_layers[l] {
                let sum: f32 = load.iter().sum();
                ensure!(
                    (sum - 1.0).abs() < 1e-5,
                    "{case} layer {l}: load sums to {sum}"
                );
                ensure!((0.0..=1.0).contains(&c.entropy[l]), "{case} layer {l}");
                ensure!((0.0..=1.0).contains(&c.overlap[l]), "{case} layer {l}");
                // the load is the share of the top-k slots: an expert's count over k·tokens
                let counts: Vec<usize> = (0..experts.num_experts)
                    .map(|x| {
                        r.traces
                            .iter()
                            .filter_map(|t| t.routing.as_ref())
                            .map(|rt| {
                                let row = rt.layers.iter().position(|&y| y == l).unwrap_or(0);
                                (0..rt.num_steps())
                                    .filter(|&k| rt.chosen(row, k).contains(&(x as u32)))
                                    .count()
                            })
                            .sum()
                    })
                    .collect();
                for (x, &n) in counts.iter().enumerate() {
                    let want = n as f32 / (experts.top_k * tokens) as f32;
                    ensure!((load[x] - want).abs() < 1e-6, "{case} layer {l} expert {x}");
                }
            } else {
                ensure!(load.iter().all(|x| x.is_nan()) && c.entropy[l].is_nan());
            }
        }
        // below the cut the policy runs the full model: the same experts
        for &l in sparse.iter().filter(|&&l| l < 2) {
            ensure!(c.overlap[l] == 1.0, "{case} layer {l}: {}", c.overlap[l]);
        }
        // the report reads back equal, routing and all
        let json = serde_json::to_string(&r)?;
        let back: Report = serde_json::from_str(&json)?;
        ensure!(back.curves.routing == r.curves.routing);
        sink_shares(case, cfg.attention_sinks, &r)?;
        ensure!(back.curves.sink == r.curves.sink);
    }
    Ok(())
}

/// gpt-oss's traces hold each head's sink share at every layer and step,
/// which with the five phase masses makes the whole softmax (1), and the
/// curves its mean per layer; a model without sinks holds none.
fn sink_shares(case: &str, sinks: bool, r: &Report) -> Result<()> {
    if !sinks {
        ensure!(
            r.traces.iter().all(|t| t.sink.is_none()) && r.curves.sink.is_empty(),
            "{case}: a sink's share without sinks"
        );
        return Ok(());
    }
    for t in &r.traces {
        let sink = t.sink.as_ref().context("no sink share")?;
        ensure!(
            sink.data().iter().all(|&x| (0.0..=1.0).contains(&x))
                && sink.data().iter().any(|&x| x > 1e-3),
            "{case}: sink shares out of range or all zero"
        );
        let total = t.mass_totals();
        ensure!(
            total.iter().all(|&x| (x - 1.0).abs() < 1e-4),
            "{case}: masses and sink do not sum to 1"
        );
    }
    let l = r.curves.num_layers;
    ensure!(r.curves.sink.len() == l, "{case}: {:?}", r.curves.sink);
    ensure!(r.curves.sink.iter().all(|&x| x > 0.0 && x < 1.0), "{case}");
    Ok(())
}

#[test]
fn a_policy_that_changes_nothing_overlaps_the_full_model_exactly() -> Result<()> {
    for case in cases() {
        let s = session(case)?;
        let layers = s.model.config().num_layers;
        let r = diagnose(&s, case, Some(&format!("speed:{layers}+bos")))?;
        let c = r.curves.routing.as_ref().context("no routing curves")?;
        for &l in &c.sparse_layers {
            ensure!(c.overlap[l] == 1.0, "{case} layer {l}: {}", c.overlap[l]);
        }
        for t in &r.traces {
            let o = t.routing.as_ref().and_then(|x| x.overlap.as_ref());
            let o = o.context("no overlap in the trace")?;
            ensure!(o.overlap.data().iter().all(|&x| x == 1.0), "{case}");
        }
    }
    Ok(())
}

/// The policy a reference case's entry names (`logits.speed.l2.bos` and
/// its fields) as lcut writes it.
fn policy_text(entry: &serde_json::Value) -> Result<String> {
    let cut = entry["l_cut"].as_u64().context("l_cut")?;
    let bos = entry["anchors"].as_array().is_some_and(|a| !a.is_empty());
    let kind = match entry["self_only"].as_bool() {
        Some(true) => "selfonly",
        _ => "speed",
    };
    Ok(format!("{kind}:{cut}{}", if bos { "+bos" } else { "" }))
}

/// `|a ∩ b| / k` over one row of experts each, computed here apart from
/// lcut's own.
fn shared_share(a: &[i64], b: &[i64]) -> f32 {
    let shared = a.iter().filter(|x| b.contains(x)).count();
    shared as f32 / a.len().max(b.len()) as f32
}

/// Under every SPEED and SelfOnly policy of the reference cases, the
/// overlap lcut reports for the decode rows (positions 28 on, the tokens
/// teacher-forced) equals the overlap of transformers' own routing: the
/// policy's chosen experts (`router.speed.l2.bos.{layer}.experts`) against
/// the full model's (`router.{layer}.experts`).
#[test]
fn the_overlap_under_a_cut_is_transformers_routing_overlap() -> Result<()> {
    for case in cases() {
        let s = session(case)?;
        let dir = oracle_case(case);
        let reference =
            candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)?;
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json"))?)?;
        let ids = oracle_ids(case)?;
        let start = meta["decode_start"].as_u64().context("decode_start")? as usize;
        // the prompt ends at the decode start; every later id is fed, and one
        // more token (never fed) closes the continuation
        let prompt = PreparedPrompt::from_ids(ids[..=start].to_vec(), Some(start))?;
        let mut generated = ids[start + 1..].to_vec();
        generated.push(0);
        let cfg = s.model.config().clone();
        let experts = |key: &str| -> Result<Vec<Vec<i64>>> {
            let t: &Tensor = reference
                .get(key)
                .with_context(|| format!("{case}: {key}"))?;
            Ok(t.to_dtype(DType::I64)?.to_vec2::<i64>()?)
        };
        let (mut checked, mut moved) = (0, 0);
        for entry in meta["policies"].as_array().context("policies")? {
            let key = entry["key"]
                .as_str()
                .context("key")?
                .trim_start_matches("logits.");
            let text = policy_text(entry)?;
            let policy = s.resolve_policy(&text.parse::<PolicySpec>()?)?;
            let overlap = routing_overlap_of(&s, &prompt, &generated, policy, 16)?
                .context("no overlap on a MoE model")?;
            ensure!(overlap.policy == policy.to_string());
            let sparse = (0..cfg.num_layers).filter(|&l| cfg.sparse_layers[l]);
            for (row, l) in sparse.enumerate() {
                let full = experts(&format!("router.{l}.experts"))?;
                let under = experts(&format!("router.{key}.{l}.experts"))?;
                ensure!(under.len() == ids.len() - start, "{case} {key}: rows");
                for (i, chosen) in under.iter().enumerate() {
                    let want = shared_share(chosen, &full[start + i]);
                    let got = overlap.overlap.view()[[row, i]];
                    ensure!(
                        got == want,
                        "{case} {text} layer {l} position {}: lcut {got}, transformers {want}",
                        start + i
                    );
                    checked += 1;
                    moved += usize::from(want < 1.0);
                }
            }
        }
        // the cuts move some tokens to other experts: the comparison can fail
        ensure!(
            checked > 0 && moved > 0,
            "{case}: {moved} of {checked} rows moved"
        );
    }
    Ok(())
}

#[test]
fn the_sweep_reports_the_overlap_the_diagnostics_measure_at_each_cut() -> Result<()> {
    let case = "moe/qwen3moe-sparse";
    let s = session(case)?;
    let layers = s.model.config().num_layers;
    let opts = SweepOptions {
        cuts: Some(vec![2, layers]),
        max_new_tokens: 6,
        ..SweepOptions::default()
    };
    let swept = sweep(
        &s,
        &prompts(case)?,
        &opts,
        &Thresholds::default(),
        &mut |_| true,
    )?;
    let at = |c: usize| {
        swept
            .points
            .iter()
            .find(|p| p.l_cut() == Some(c))
            .and_then(|p| p.routing_overlap)
    };
    ensure!(at(layers) == Some(1.0), "no cut: {:?}", at(layers));
    let r = diagnose(&s, case, Some("speed:2+bos"))?;
    let c = r.curves.routing.as_ref().context("routing")?;
    // every sparse layer routes as many tokens: the mean over layers is the pooled mean
    let mean =
        c.sparse_layers.iter().map(|&l| c.overlap[l]).sum::<f32>() / c.sparse_layers.len() as f32;
    let swept2 = at(2).context("no overlap at cut 2")?;
    ensure!(
        (swept2 - mean).abs() < 1e-5,
        "sweep {swept2}, diagnose {mean}"
    );
    ensure!(
        swept2 < 1.0,
        "a cut at 2 of {layers} moves some routing on this model"
    );
    Ok(())
}

#[test]
fn a_dense_model_has_no_routing_and_refuses_a_routing_policy() -> Result<()> {
    let s = Session::load(&oracle_case("llama-gqa"), DType::F32, &Device::Cpu)?;
    let ids = oracle_ids("llama-gqa")?;
    let prompts = vec![LabelledPrompt {
        index: 0,
        id: "p0".into(),
        prompt: PreparedPrompt::from_ids(ids[..12].to_vec(), Some(9))?,
    }];
    let opts = DiagnoseOptions {
        max_new_tokens: 3,
        ..DiagnoseOptions::default()
    };
    let r = diagnose_prepared(&s, &prompts, &opts, &mut |_| true)?;
    ensure!(r.curves.routing.is_none() && r.traces.iter().all(|t| t.routing.is_none()));
    let json = serde_json::to_string(&r)?;
    ensure!(!json.contains("routing"), "a dense report names no routing");
    ensure!(!json.contains("\"sink\""), "a dense report names no sink");
    let swept = sweep(
        &s,
        &prompts,
        &SweepOptions {
            cuts: Some(vec![1, 2]),
            max_new_tokens: 3,
            ..SweepOptions::default()
        },
        &Thresholds::default(),
        &mut |_| true,
    )?;
    ensure!(swept.points.iter().all(|p| p.routing_overlap.is_none()));
    let asked = DiagnoseOptions {
        routing_policy: Some("speed:1+bos".parse()?),
        ..opts
    };
    let err = diagnose_prepared(&s, &prompts, &asked, &mut |_| true).unwrap_err();
    ensure!(
        matches!(err, EngineError::RoutingComparison { .. })
            && err.to_string().contains("no experts"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_run_under_a_policy_compares_its_own_routing_and_not_a_second_one() -> Result<()> {
    let case = "moe/mixtral-top2";
    let s = session(case)?;
    let under = DiagnoseOptions {
        max_new_tokens: 4,
        policy: Some("speed:2+bos".parse()?),
        ..DiagnoseOptions::default()
    };
    let r = diagnose_prepared(&s, &prompts(case)?, &under, &mut |_| true)?;
    let c = r.curves.routing.as_ref().context("routing")?;
    ensure!(c.policy.as_deref() == Some("speed:2+bos"), "{:?}", c.policy);
    let both = DiagnoseOptions {
        routing_policy: Some("speed:4+bos".parse()?),
        ..under
    };
    let err = diagnose_prepared(&s, &prompts(case)?, &both, &mut |_| true).unwrap_err();
    ensure!(err.to_string().contains("name one policy"), "{err}");
    Ok(())
}
