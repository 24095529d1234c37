//! How a mixture-of-experts model routes a prompt: for each layer of
//! experts, how many experts some token took, how many different sets of
//! experts the tokens took, and the largest share of the tokens one expert
//! took (beside the even share, top-k over the expert count). A random
//! model's routing is degenerate when one expert takes nearly every token;
//! `lcut synth`'s mixtures of experts are drawn so that it is not.
//!
//!     cargo run --release -p lcut-synth --example routing_spread -- MODEL.gguf [TOKENS] [SEED]
//!
//! The prompt is TOKENS (default 512) token ids drawn uniformly from the
//! vocabulary with SEED (default 1), run in one pass with the matrices
//! kept quantized.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::error::Error;
use std::path::PathBuf;

use lcut_model::{Decoder, Device, Probe, RoutingView, WeightMode};

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

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .ok_or("usage: routing_spread MODEL [TOKENS] [SEED]")?,
    );
    let count: usize = args.next().map_or(Ok(512), |a| a.parse())?;
    let seed: u64 = args.next().map_or(Ok(1), |a| a.parse())?;
    let model = Decoder::load_as(&path, WeightMode::Quantized, &Device::Cpu)?;
    let cfg = model.config();
    let experts = cfg.experts.ok_or("the model has no experts")?;
    // a 64-bit linear congruential generator (Knuth's MMIX constants)
    let mut state = seed;
    let vocab = cfg.vocab_size as u64;
    let tokens: Vec<u32> = (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % vocab) as u32
        })
        .collect();
    let mut routes = Routes::default();
    model.teacher_forced_logits(&tokens, Some(&mut routes))?;
    println!(
        "{count} tokens, top {} of {} experts (even share {:.3})",
        experts.top_k,
        experts.num_experts,
        experts.top_k as f64 / experts.num_experts as f64
    );
    println!("layer  experts used  distinct sets  largest share");
    for (layer, rows) in &routes.chosen {
        let mut taken: HashMap<usize, usize> = HashMap::new();
        let mut sets = HashSet::new();
        for chosen in rows {
            for &e in chosen {
                *taken.entry(e).or_default() += 1;
            }
            let mut set = chosen.clone();
            set.sort_unstable();
            sets.insert(set);
        }
        let most = taken.values().copied().max().unwrap_or(0);
        println!(
            "{layer:>5}  {:>12}  {:>13}  {:>13.3}",
            taken.len(),
            sets.len(),
            most as f64 / rows.len().max(1) as f64
        );
    }
    Ok(())
}
