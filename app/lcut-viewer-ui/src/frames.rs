//! Frame times: how long building the UI takes, and the time between frames,
//! over the last frames. Shown in the status bar; used to measure panning.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Frames kept for the statistics.
const WINDOW: usize = 240;

/// Recent frame times.
#[derive(Debug, Clone, Default)]
pub struct FrameStats {
    build: VecDeque<Duration>,
    last_start: Option<Instant>,
    interval: VecDeque<Duration>,
}

/// Summary of recent frames, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameSummary {
    /// Frames measured.
    pub frames: usize,
    /// Mean UI build time.
    pub mean_ms: f64,
    /// 95th percentile of the build time.
    pub p95_ms: f64,
    /// Longest build time.
    pub max_ms: f64,
}

fn summarise(v: &VecDeque<Duration>) -> Option<FrameSummary> {
    if v.is_empty() {
        return None;
    }
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let p95 = ms[((ms.len() as f64 * 0.95).ceil() as usize).clamp(1, ms.len()) - 1];
    Some(FrameSummary {
        frames: ms.len(),
        mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
        p95_ms: p95,
        max_ms: ms[ms.len() - 1],
    })
}

impl FrameStats {
    /// Marks the start of a frame; returns the instant to pass to [`FrameStats::end`].
    pub fn begin(&mut self) -> Instant {
        let now = Instant::now();
        if let Some(prev) = self.last_start.replace(now) {
            push(&mut self.interval, now - prev);
        }
        now
    }

    /// Records the build time of the frame that began at `start`.
    pub fn end(&mut self, start: Instant) {
        push(&mut self.build, start.elapsed());
    }

    /// Build-time summary.
    pub fn build(&self) -> Option<FrameSummary> {
        summarise(&self.build)
    }

    /// Frame-interval summary (includes idle time between frames).
    pub fn interval(&self) -> Option<FrameSummary> {
        summarise(&self.interval)
    }

    /// Forgets every frame so far.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

fn push(v: &mut VecDeque<Duration>, d: Duration) {
    if v.len() == WINDOW {
        v.pop_front();
    }
    v.push_back(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_known_durations() {
        let mut s = FrameStats::default();
        for ms in 1..=20u64 {
            push(&mut s.build, Duration::from_millis(ms));
        }
        let b = s.build().unwrap();
        assert_eq!(b.frames, 20);
        assert!((b.mean_ms - 10.5).abs() < 1e-9);
        assert!((b.p95_ms - 19.0).abs() < 1e-9);
        assert!((b.max_ms - 20.0).abs() < 1e-9);
        assert!(FrameStats::default().build().is_none());
    }
}
