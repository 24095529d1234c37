//! The policy seam: a policy family defined here, outside lcut, in this one
//! file ("keep every other prefill token above the cut"), runs wherever a
//! policy runs (parsing, forward, generation with its K/V accounting, the
//! sweep's comparison axis), because nothing in lcut asks a policy's kind:
//! everything asks its [`Visibility`].

use anyhow::{Result, ensure};
use lcut_engine::diagnose::{AxisPolicy, LabelledPrompt, SweepOptions, sweep};
use lcut_engine::{Generation, GenerationConfig, PreparedPrompt, Session};
use lcut_model::{DType, Device, LogitRows, Tensor};
use lcut_policy::{KvAccounting, Phase, Policy, PolicyFamily, PolicySpec, TokenPhases, Visibility};
use lcut_testkit::oracle_case;
use lcut_trace::Thresholds;

/// The family: `everyother:C[+bos]`.
#[derive(Debug)]
struct EveryOther;

impl PolicyFamily for EveryOther {
    fn name(&self) -> &'static str {
        "everyother"
    }

    fn visibility(
        &self,
        l_cut: usize,
        num_layers: usize,
        phases: TokenPhases,
    ) -> Box<dyn Visibility> {
        Box::new(EveryOtherRule {
            l_cut,
            num_layers,
            phases,
        })
    }
}

/// Below the cut every token; at and above it the anchors, the decode phase
/// and the prefill tokens at an even distance from the first one.
#[derive(Debug, Clone, Copy)]
struct EveryOtherRule {
    l_cut: usize,
    num_layers: usize,
    phases: TokenPhases,
}

impl EveryOtherRule {
    fn kept(&self, pos: usize) -> bool {
        self.phases.phase(pos) != Phase::Prefill
            || (pos - self.phases.anchor_len()).is_multiple_of(2)
    }
}

impl Visibility for EveryOtherRule {
    fn num_layers(&self) -> usize {
        self.num_layers
    }

    fn phases(&self) -> &TokenPhases {
        &self.phases
    }

    fn token_exists(&self, layer: usize, pos: usize) -> bool {
        layer < self.l_cut || self.kept(pos)
    }

    fn retains_kv(&self, layer: usize, pos: usize) -> bool {
        self.token_exists(layer, pos)
    }

    fn key_visible(&self, layer: usize, _q: usize, k: usize) -> bool {
        self.token_exists(layer, k)
    }

    fn rule_class(&self, layer: usize) -> usize {
        usize::from(layer >= self.l_cut)
    }
}

/// Its K/V counted from its answers, position by position.
impl KvAccounting for EveryOtherRule {}

static FAMILY: EveryOther = EveryOther;

fn every_other(text: &str, layers: usize) -> Result<Policy> {
    lcut_policy::register_family(&FAMILY)?;
    Ok(text.parse::<PolicySpec>()?.resolve(layers)?)
}

fn session() -> Result<Session> {
    Ok(Session::load(
        &oracle_case("llama-gqa"),
        DType::F32,
        &Device::Cpu,
    )?)
}

fn reference_ids() -> Result<Vec<u32>> {
    Ok(lcut_testkit::oracle_ids("llama-gqa")?)
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?)
}

#[test]
fn the_family_parses_prints_and_splits_like_a_built_in_policy() -> Result<()> {
    let p = every_other("everyother:1/2+bos", 6)?;
    assert_eq!(p.to_string(), "everyother:3+bos");
    assert_eq!(p.l_cut(), 3);
    let list = PolicySpec::parse_list("full,everyother:3+bos;speed:2")?;
    assert_eq!(list.len(), 3);
    assert_eq!(list[1].to_string(), "everyother:3+bos");
    assert!(p.is_static() && !p.trainable() && !p.needs_staged_prefill());
    Ok(())
}

/// Dropping every other prefill token above the cut gives what hiding those
/// tokens' keys from a full-depth run gives, prefill and decode alike; the
/// upper caches hold only the kept tokens.
#[test]
fn forward_under_the_family_equals_the_full_model_masked_to_it() -> Result<()> {
    let session = session()?;
    let model = &session.model;
    let layers = model.config().num_layers;
    let ids = reference_ids()?;
    let (s, decode_at) = (28, 33);
    let policy = every_other("everyother:3+bos", layers)?;
    let phases = TokenPhases::new(ids.len(), s, 1)?;
    let rule = policy.visibility(phases);
    let mut seq = model.new_sequence(policy, phases)?;
    model.forward(&mut seq, &ids[..7], LogitRows::None, None)?;
    let mut rows = vec![
        model
            .forward(&mut seq, &ids[7..decode_at], LogitRows::All, None)?
            .logits
            .ok_or_else(|| anyhow::anyhow!("no logits"))?,
    ];
    for &token in &ids[decode_at..] {
        let out = model.forward(&mut seq, &[token], LogitRows::Last, None)?;
        rows.push(out.logits.ok_or_else(|| anyhow::anyhow!("no logits"))?);
    }
    let ours = Tensor::cat(&rows, 0)?;
    // rows of the tokens that reach the top: the decode phase from s on
    let ours = ours.narrow(0, ours.dim(0)? - (ids.len() - s), ids.len() - s)?;
    let masked = model.teacher_forced_masked(&ids, move |l, q, k| rule.key_visible(l, q, k))?;
    let masked = masked.narrow(0, s, ids.len() - s)?;
    let d = max_diff(&ours, &masked)?;
    ensure!(d <= 1e-4, "everyother vs masked full run: {d:e}");
    let full = model.teacher_forced_logits(&ids, None)?;
    let changed = max_diff(&ours, &full.narrow(0, s, ids.len() - s)?)?;
    ensure!(
        changed > 1e-3,
        "dropping tokens changed nothing ({changed:e})"
    );
    for (l, cache) in seq.caches().iter().enumerate().skip(3) {
        let odd = cache
            .positions()
            .iter()
            .find(|&&p| p < s && p > 0 && p.is_multiple_of(2));
        ensure!(odd.is_none(), "layer {l} keeps dropped token {odd:?}");
    }
    Ok(())
}

/// A generation under the family holds exactly the K/V its visibility
/// counts, less than the full model and more than SPEED at the same cut.
#[test]
fn a_generation_under_the_family_holds_what_its_visibility_counts() -> Result<()> {
    let session = session()?;
    let layers = session.model.config().num_layers;
    let ids: Vec<u32> = reference_ids()?[..30].to_vec();
    let prompt = PreparedPrompt::from_ids(ids, None)?;
    let config = GenerationConfig {
        max_new_tokens: 5,
        prefill_chunk: 8,
        ..GenerationConfig::default()
    };
    let run = |policy: Policy| -> Result<_> {
        Ok(
            Generation::new(&session.model, prompt.clone(), policy, config.clone())?
                .run(|_| true)?,
        )
    };
    let out = run(every_other("everyother:3+bos", layers)?)?;
    let speed = run("speed:3+bos".parse::<PolicySpec>()?.resolve(layers)?)?;
    ensure!(out.tokens.len() == 5, "{out:?}");
    ensure!(out.kv_bytes_held == out.kv_bytes_formula, "{out:?}");
    ensure!(out.kv_bytes_held < out.kv_bytes_full, "{out:?}");
    ensure!(
        out.kv_bytes_held > speed.kv_bytes_held,
        "{out:?} vs {speed:?}"
    );
    ensure!(out.slim.is_none(), "a static rule records no decisions");
    Ok(())
}

/// On the sweep's comparison axis the family is measured like any policy:
/// attention recall is whole below the cut and partial above it, and it
/// holds K/V between SPEED's and the full model's.
#[test]
fn the_sweep_axis_measures_the_family() -> Result<()> {
    let session = session()?;
    let layers = session.model.config().num_layers;
    every_other("everyother:3+bos", layers)?;
    let ids = reference_ids()?;
    let prompts = [40usize, 33]
        .iter()
        .enumerate()
        .map(|(index, &len)| {
            Ok(LabelledPrompt {
                index,
                id: format!("p{len}"),
                prompt: PreparedPrompt::from_ids(ids[..len].to_vec(), None)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let axis = ["everyother:3+bos", "speed:3+bos"]
        .iter()
        .map(|t| {
            Ok(AxisPolicy {
                spec: t.parse()?,
                paired_with: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let opts = SweepOptions {
        cuts: Some(vec![3]),
        context_len: 1024,
        max_new_tokens: 4,
        axis,
        ..SweepOptions::default()
    };
    let result = sweep(
        &session,
        &prompts,
        &opts,
        &Thresholds::default(),
        &mut |_| true,
    )?;
    let [ours, speed] = &result.policies[..] else {
        anyhow::bail!("{} axis points", result.policies.len());
    };
    ensure!(ours.policy == "everyother:3+bos", "{ours:?}");
    ensure!(
        ours.attention_recall[..3].iter().all(|&r| r == 1.0),
        "{ours:?}"
    );
    ensure!(
        ours.attention_recall[3..]
            .iter()
            .all(|&r| r > 0.0 && r < 1.0),
        "{ours:?}"
    );
    ensure!(
        speed.kv_ratio < ours.kv_ratio && ours.kv_ratio < 1.0,
        "{ours:?} vs {speed:?}"
    );
    ensure!(ours.prefill_ratio < 1.0 && ours.prefill_ratio > speed.prefill_ratio);
    Ok(())
}
