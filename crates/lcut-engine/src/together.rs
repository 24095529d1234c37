//! Many generations run side by side: at most [`TOGETHER`] in flight,
//! their decode steps sharing each pass over the weights
//! ([`Generation::step_together`]), a generation that ends replaced by the
//! next one waiting, so that a file of prompts or a teacher's prompt list
//! reads the weights once per step for up to eight of them.

use crate::error::{EngineError, Result};
use crate::generate::{Generation, GenerationOutput, Step};

/// Generations decoded side by side at most (the kernels' activation rows
/// per pass over the weights).
pub const TOGETHER: usize = 8;

/// Run every generation `jobs` yields to its end, at most [`TOGETHER`] at a
/// time, taking the next job only when one in flight has ended (so a long
/// list holds the caches of eight at most). Generation `i` is the i-th
/// `jobs` yields: `on_step(i, step)` sees each of its steps and returns
/// false to cancel the whole run ([`EngineError::Cancelled`]);
/// `on_end(i, output)` is told as it ends. Greedy tokens are those of
/// running each alone.
pub fn run_together<'m>(
    jobs: impl IntoIterator<Item = Result<Generation<'m>>>,
    mut on_step: impl FnMut(usize, &Step) -> bool,
    mut on_end: impl FnMut(usize, GenerationOutput),
) -> Result<()> {
    let mut jobs = jobs.into_iter().enumerate();
    let mut active: Vec<(usize, Generation<'m>)> = Vec::with_capacity(TOGETHER);
    loop {
        while active.len() < TOGETHER {
            let Some((i, job)) = jobs.next() else { break };
            active.push((i, job?));
        }
        if active.is_empty() {
            return Ok(());
        }
        let mut gens: Vec<&mut Generation<'m>> = active.iter_mut().map(|(_, g)| g).collect();
        let steps = Generation::step_together(&mut gens, |_, own| own)?;
        for ((i, _), step) in active.iter().zip(&steps) {
            if let Some(step) = step
                && !on_step(*i, step)
            {
                return Err(EngineError::Cancelled);
            }
        }
        let mut k = 0;
        while k < active.len() {
            if active[k].1.ended() {
                let (i, g) = active.remove(k);
                on_end(i, g.output());
            } else {
                k += 1;
            }
        }
    }
}
