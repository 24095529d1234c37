//! What a training job tells as it goes: phases of counted work (making
//! the teacher's records, building the sequences, the optimizer steps) and
//! lines about the run. The command line shows them as progress bars.

/// Where a job reports its progress.
pub trait Progress {
    /// A phase of `len` units of work begins (`teacher`, `sequences`, `steps`).
    fn start(&mut self, phase: &'static str, len: usize);
    /// `done` units of the current phase are done; `message` says how it goes.
    fn set(&mut self, done: usize, message: &str);
    /// The current phase is over.
    fn finish(&mut self);
    /// A line about the run.
    fn note(&mut self, line: &str);
}

/// Progress that goes nowhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Progress for Quiet {
    fn start(&mut self, _: &'static str, _: usize) {}
    fn set(&mut self, _: usize, _: &str) {}
    fn finish(&mut self) {}
    fn note(&mut self, _: &str) {}
}
