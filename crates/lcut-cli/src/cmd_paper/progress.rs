//! Progress of a `lcut paper` run: a bar per part on a terminal, and one
//! line per unit where stderr is a log file (a long run's log says where
//! it is and what each unit took).

use std::cell::Cell;
use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use lcut_trace::PaperPart;

/// The progress of one part.
pub struct PartProgress {
    bar: ProgressBar,
    log: bool,
    part: PaperPart,
    total: Cell<usize>,
    done: Cell<usize>,
    unit_start: Cell<Instant>,
}

impl PartProgress {
    /// A bar for `part` (drawn on a terminal only).
    pub fn new(part: PaperPart) -> Self {
        let bar = ProgressBar::new(0).with_style(
            ProgressStyle::with_template("{prefix} {bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(format!("{}/6 {}", part.number(), part.name()));
        Self {
            bar,
            log: !std::io::stderr().is_terminal(),
            part,
            total: Cell::new(0),
            done: Cell::new(0),
            unit_start: Cell::new(Instant::now()),
        }
    }

    /// The part has `todo` units left of `total`.
    pub fn start(&self, todo: usize, total: usize) {
        self.total.set(total);
        self.done.set(total - todo);
        self.bar.set_length(total as u64);
        self.bar.set_position((total - todo) as u64);
        if self.log {
            eprintln!(
                "paper {}/6 {}: {todo} of {total} units to run",
                self.part.number(),
                self.part.name()
            );
        }
        self.unit_start.set(Instant::now());
    }

    /// What the current unit is doing.
    pub fn message(&self, text: &str) {
        self.bar.set_message(text.to_string());
    }

    /// A unit is done; `what` names it.
    pub fn unit_done(&self, what: &str) {
        self.done.set(self.done.get() + 1);
        self.bar.inc(1);
        if self.log {
            eprintln!(
                "paper {}/6 {}: {}/{} {what} ({:.1} s)",
                self.part.number(),
                self.part.name(),
                self.done.get(),
                self.total.get(),
                self.unit_start.get().elapsed().as_secs_f64()
            );
        }
        self.unit_start.set(Instant::now());
    }

    /// The part is over.
    pub fn finish(self) {
        self.bar.finish_and_clear();
    }
}
