//! Which code made a record: the build of lcut that ran it and the
//! instruction-set level its kernels ran at. Two runs with the same
//! [`MadeBy`] compute the same bits (whatever their thread counts); another
//! build or level rounds differently, which can tip a near-tie token. A
//! leaderboard journal records it per item, a suite result and a sweep per
//! run (the union of their shards' once merged), so that a run resumed
//! with another binary, or shards run on other CPUs, say so.
//!
//! This module holds the record and the notes that name it; reading the
//! running build's own (its GNU build ID, its kernels' level) is
//! `lcut_engine::made_by::current`.

use serde::{Deserialize, Serialize};

/// The build and instruction-set level a record was made with.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MadeBy {
    /// `lcut <version> <build ID>` (the build ID's first 16 hex digits).
    pub build: String,
    /// The kernels' instruction-set level (`avx2`, `avx512`, ...), as
    /// `LCUT_ISA` may cap it.
    pub isa: String,
}

impl std::fmt::Display for MadeBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {}", self.build, self.isa)
    }
}

/// The builds and levels of the parts of a merged result: each part's,
/// sorted and each once.
pub fn union<'a>(parts: impl IntoIterator<Item = &'a [MadeBy]>) -> Vec<MadeBy> {
    let mut all: Vec<MadeBy> = parts.into_iter().flatten().cloned().collect();
    all.sort();
    all.dedup();
    all
}

/// A line saying which builds and levels made `items` (`None` where one
/// made them all): how many items each made, those made before records
/// named it counted apart. A table of items from more than one may hold,
/// on a near-tie item, a token that another build would have chosen.
pub fn mixed_note<'a>(made_by: impl Iterator<Item = Option<&'a MadeBy>>) -> Option<String> {
    let mut counts: Vec<(Option<&MadeBy>, usize)> = Vec::new();
    for m in made_by {
        match counts.iter_mut().find(|(k, _)| *k == m) {
            Some((_, n)) => *n += 1,
            None => counts.push((m, 1)),
        }
    }
    if counts.len() <= 1 {
        return None;
    }
    counts.sort();
    let parts: Vec<String> = counts
        .iter()
        .map(|(m, n)| match m {
            Some(m) => format!("{n} by {m}"),
            None => format!("{n} by a build that did not record itself"),
        })
        .collect();
    Some(format!(
        "Made by {} builds or instruction-set levels: {}. Each item is one build's whole \
         computation; another build or level rounds differently, which can change a token \
         where two were nearly tied.",
        counts.len(),
        parts.join(", ")
    ))
}

/// A line naming the builds and levels of `made_by` when there are several
/// (a result merged from shards that ran on other builds or CPUs); `None`
/// for one or none.
pub fn several_note(made_by: &[MadeBy]) -> Option<String> {
    (made_by.len() > 1).then(|| {
        let names: Vec<String> = made_by.iter().map(MadeBy::to_string).collect();
        format!(
            "Made by {} builds or instruction-set levels: {}. Shards of one run give its \
             result exactly only from one; another rounds differently, which can change a \
             token where two were nearly tied.",
            made_by.len(),
            names.join("; ")
        )
    })
}

/// Said when a run resumes a journal some of whose items `made_by` did not
/// make: how many, and what that means for the table. `None` when this
/// build and level made them all.
pub fn resume_note<'a>(
    made_by: impl Iterator<Item = Option<&'a MadeBy>>,
    current: &MadeBy,
) -> Option<String> {
    let (mut other, mut all) = (0, 0);
    for m in made_by {
        all += 1;
        other += usize::from(m != Some(current));
    }
    (other > 0).then(|| {
        format!(
            "{other} of the {all} items already journaled were made by another build or \
             instruction-set level than this one ({current}), or by one that did not record \
             itself: the table will say so; such an item rerun now could differ by a token \
             where two were nearly tied"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build as a record names one.
    fn made_by(build: &str, isa: &str) -> MadeBy {
        MadeBy {
            build: build.into(),
            isa: isa.into(),
        }
    }

    #[test]
    fn one_build_makes_no_note_and_several_are_counted() {
        let a = made_by("lcut 0.1.0 aaaa", "avx2");
        let b = made_by("lcut 0.1.0 aaaa", "avx512");
        assert_eq!(mixed_note([Some(&a), Some(&a)].into_iter()), None);
        assert_eq!(mixed_note(std::iter::empty()), None);
        let note = mixed_note([Some(&a), None, Some(&b), Some(&a)].into_iter()).unwrap();
        assert!(note.contains("Made by 3 builds"), "{note}");
        assert!(note.contains("2 by lcut 0.1.0 aaaa on avx2"), "{note}");
        assert!(note.contains("1 by lcut 0.1.0 aaaa on avx512"), "{note}");
        assert!(
            note.contains("1 by a build that did not record itself"),
            "{note}"
        );
    }

    #[test]
    fn several_builds_of_a_merged_result_are_named() {
        let a = made_by("lcut 0.1.0 0123456789abcdef", "avx2");
        let b = made_by("lcut 0.1.0 0123456789abcdef", "portable");
        assert_eq!(several_note(&[]), None);
        assert_eq!(several_note(std::slice::from_ref(&a)), None);
        let note = several_note(&[a.clone(), b.clone()]).unwrap();
        assert!(note.starts_with("Made by 2 builds"), "{note}");
        assert!(
            note.contains("lcut 0.1.0 0123456789abcdef on avx2")
                && note.contains("lcut 0.1.0 0123456789abcdef on portable"),
            "{note}"
        );
        assert!(!note.contains("  "), "{note}");
    }

    #[test]
    fn a_merged_result_names_each_part_s_build_once_in_order() {
        let a = made_by("lcut 0.1.0 bbbb", "avx2");
        let b = made_by("lcut 0.1.0 aaaa", "avx512");
        let c = made_by("lcut 0.1.0 aaaa", "avx2");
        let parts: [&[MadeBy]; 4] = [
            &[a.clone(), b.clone()],
            &[],
            &[c.clone(), a.clone()],
            std::slice::from_ref(&a),
        ];
        assert_eq!(union(parts), vec![c, b, a]);
        assert_eq!(union(std::iter::empty::<&[MadeBy]>()), Vec::new());
    }

    #[test]
    fn a_resume_names_the_items_another_build_made() {
        let here = made_by("lcut 0.1.0 fedcba9876543210", "avx2");
        let other = made_by("lcut 0.0.9 0123456789abcdef", "avx2");
        assert_eq!(resume_note([Some(&here)].into_iter(), &here), None);
        let note = resume_note([Some(&here), Some(&other), None].into_iter(), &here).unwrap();
        assert!(note.starts_with("2 of the 3 items"), "{note}");
        assert!(
            note.contains("lcut 0.1.0 fedcba9876543210 on avx2"),
            "{note}"
        );
        assert!(!note.contains("  "), "{note}");
    }
}
