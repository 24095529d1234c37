//! Causal prompt knockout of one prompt: for every band of `band`
//! consecutive layers, the prompt (BoS kept) hidden from the decode queries
//! at those layers only (`band:a..b`), teacher-forced on the full model's
//! own greedy continuation and scored against it. One full-depth prefill
//! per prompt serves every band (a band reuses the full prefill: the prompt
//! runs every layer), each band's decode-phase tokens then run in one pass
//! on the prefix restricted to what the band keeps, exactly as the sweep
//! runs its cutoffs ([`super::sweep`]).

use lcut_policy::{Policy, PolicySpec};
use lcut_trace::KnockoutTrace;

use super::sweep::{Forced, SweepOptions, full_depth_starts};
use super::{DiagnoseEvent, tell};
use crate::error::{EngineError, Result};
use crate::prompt::PreparedPrompt;
use crate::session::Session;

/// The knockout policies of bands of `band` layers in a model of
/// `num_layers` layers, by first layer (`knockout:a` for one layer,
/// `band:a..b` otherwise); an error naming the limit when the band is
/// empty or wider than the model.
pub fn knockout_policies(num_layers: usize, band: usize) -> Result<Vec<Policy>> {
    let starts = KnockoutTrace::starts(num_layers, band);
    if starts == 0 {
        return Err(EngineError::OutOfRange {
            what: format!("a knockout band of {band} layers"),
            limit: format!("the model has {num_layers} layers (a band has 1 to {num_layers})"),
        });
    }
    (0..starts)
        .map(|a| {
            let text = match band {
                1 => format!("knockout:{a}"),
                _ => format!("band:{a}..{}", a + band - 1),
            };
            Ok(text.parse::<PolicySpec>()?.resolve(num_layers)?)
        })
        .collect()
}

/// Measure every band of `band` layers on `prompt` (index `index` of the
/// run), teacher-forced on `max_new_tokens` greedy tokens of the full
/// model: per band, the summed KL(full ‖ knocked out) and the tokens whose
/// top-1 stays the full model's. `on_event` sees the prefill and one step
/// per band; false cancels.
pub fn knockout_trace(
    session: &Session,
    prompt: &PreparedPrompt,
    (band, max_new_tokens): (usize, usize),
    index: usize,
    on_event: &mut dyn FnMut(&DiagnoseEvent) -> bool,
) -> Result<KnockoutTrace> {
    let model = &session.model;
    let policies = knockout_policies(model.config().num_layers, band)?;
    let opts = SweepOptions {
        max_new_tokens,
        ..SweepOptions::default()
    };
    let starts = full_depth_starts(&policies);
    let forced = Forced::new(
        session,
        prompt,
        &opts,
        (index, &[], &starts),
        None,
        on_event,
    )?;
    let mut out = KnockoutTrace {
        band,
        tokens: forced.continuation.len(),
        kl_sum: Vec::with_capacity(policies.len()),
        agree: Vec::with_capacity(policies.len()),
    };
    for (k, policy) in policies.iter().enumerate() {
        let t = forced.restricted(model, prompt, *policy)?;
        out.kl_sum.push(t.kl);
        out.agree.push(t.agree.round() as usize);
        tell(
            on_event,
            &DiagnoseEvent::Step {
                index,
                step: k + 1,
                max_steps: policies.len(),
            },
        )?;
    }
    Ok(out)
}
