//! The latest query rows a policy has seen at one layer (SlimInfer's mean
//! query, a press's observation window).

use std::collections::VecDeque;

/// The last `w` query rows seen at one layer, `heads * head_dim` values
/// each, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueryWindow {
    rows: VecDeque<Vec<f32>>,
}

impl QueryWindow {
    /// Keep the last `w` of the rows seen so far.
    pub(crate) fn push(&mut self, rows: Vec<Vec<f32>>, w: usize) {
        for r in rows {
            if self.rows.len() == w {
                self.rows.pop_front();
            }
            self.rows.push_back(r);
        }
    }

    /// The rows held, oldest first.
    pub(crate) fn rows(&self) -> impl ExactSizeIterator<Item = &Vec<f32>> {
        self.rows.iter()
    }

    /// The same window holding only its latest `w` rows.
    pub(crate) fn latest(&self, w: usize) -> Self {
        let skip = self.rows.len().saturating_sub(w);
        Self {
            rows: self.rows.iter().skip(skip).cloned().collect(),
        }
    }

    /// Forget the rows (once a decision no longer needs them).
    pub(crate) fn clear(&mut self) {
        self.rows = VecDeque::new();
    }

    /// The mean query of the window.
    pub(crate) fn mean(&self) -> Vec<f32> {
        let Some(first) = self.rows.front() else {
            return Vec::new();
        };
        let mut acc = vec![0f32; first.len()];
        for r in &self.rows {
            acc.iter_mut().zip(r).for_each(|(a, x)| *a += x);
        }
        let inv = 1.0 / self.rows.len() as f32;
        acc.iter_mut().for_each(|a| *a *= inv);
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_rows_and_their_mean() {
        let mut w = QueryWindow::default();
        w.push(vec![vec![1.0, 2.0], vec![3.0, 4.0]], 2);
        w.push(vec![vec![5.0, 6.0]], 2);
        assert_eq!(w.rows().len(), 2);
        assert_eq!(w.mean(), vec![4.0, 5.0]);
        w.clear();
        assert!(w.mean().is_empty());
    }
}
