//! Head exceptions above a SPEED cut: the (layer, K/V head) pairs that keep
//! reading the prompt above the cut, as written (`+heads:FILE`, `+heads:N`
//! with `+ranking:FILE`, `+window:W`) and as resolved against a model.
//!
//! Files (JSON, layers and heads 0-based):
//! - a head file: `[[layer, kv_head], ...]`, or `{"model": {...}, "heads":
//!   [[layer, kv_head], ...]}` as `lcut diagnose --kv-budget` writes it;
//! - a ranking: `{"model": {...}, "ranking": [[layer, kv_head, mass], ...]}`
//!   (highest decode-to-prefill mass first), as `lcut diagnose` writes it.
//!
//! `model` names the model a file was made for (`config_hash`,
//! `num_layers`, `num_kv_heads`); a file made for another model is refused.
//!
//! Resolved sets are interned (`&'static`), so that a policy stays a small
//! `Copy` value: a run resolves a handful of head sets, each kept once.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::PolicyError;

/// Where the kept heads come from, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeadSource {
    /// `+heads:FILE`: the pairs a head file lists.
    File(&'static str),
    /// `+heads:N`: the N pairs at or above the cut with the most
    /// decode-to-prefill mass in a ranking (`+ranking:FILE`, or the one
    /// the caller supplies when none is written).
    Top {
        /// How many pairs.
        count: usize,
        /// The ranking file, when written.
        ranking: Option<&'static str>,
    },
}

/// Head exceptions as written after a SPEED cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadChoice {
    /// The kept heads, if any are named.
    pub source: Option<HeadSource>,
    /// `+window:W`: the heads not kept still read BoS's anchors and the
    /// last W prompt positions above the cut (DuoAttention's streaming heads).
    pub window: Option<usize>,
}

/// The model a policy is resolved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelDims<'a> {
    /// Its depth.
    pub num_layers: usize,
    /// Its K/V heads, when known.
    pub kv_heads: Option<usize>,
    /// The hash of its config that reports record, when known.
    pub config_hash: Option<&'a str>,
}

impl ModelDims<'_> {
    /// A model known only by its depth.
    pub fn depth(num_layers: usize) -> Self {
        Self {
            num_layers,
            kv_heads: None,
            config_hash: None,
        }
    }
}

/// The resolved kept heads: ascending (layer, K/V head) pairs, interned.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeadSet(&'static [(usize, usize)]);

impl HeadSet {
    /// The pairs, ascending.
    pub fn pairs(&self) -> &'static [(usize, usize)] {
        self.0
    }

    /// Whether K/V head `kv_head` of `layer` is kept.
    pub fn contains(&self, layer: usize, kv_head: usize) -> bool {
        self.0.binary_search(&(layer, kv_head)).is_ok()
    }

    /// How many heads of `layer` are kept.
    pub fn count_at(&self, layer: usize) -> usize {
        let from = self.0.partition_point(|&(l, _)| l < layer);
        let to = self.0.partition_point(|&(l, _)| l <= layer);
        to - from
    }

    /// The highest layer with a kept head.
    pub fn top_layer(&self) -> Option<usize> {
        self.0.last().map(|&(l, _)| l)
    }

    /// The set of `pairs` (deduplicated), interned.
    pub fn of(pairs: impl IntoIterator<Item = (usize, usize)>) -> Self {
        let set: BTreeSet<(usize, usize)> = pairs.into_iter().collect();
        let pairs: Vec<(usize, usize)> = set.into_iter().collect();
        static SETS: Mutex<Vec<&'static [(usize, usize)]>> = Mutex::new(Vec::new());
        let mut sets = SETS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = sets.iter().find(|s| **s == pairs.as_slice()) {
            return Self(found);
        }
        let leaked: &'static [(usize, usize)] = Box::leak(pairs.into_boxed_slice());
        sets.push(leaked);
        Self(leaked)
    }
}

impl fmt::Debug for HeadSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl Serialize for HeadSet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for HeadSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self::of(Vec::<(usize, usize)>::deserialize(d)?))
    }
}

/// `text`, interned (file names written in policies).
pub(crate) fn intern(text: &str) -> &'static str {
    static TEXTS: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut texts = TEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = texts.iter().find(|t| **t == text) {
        return found;
    }
    let leaked: &'static str = Box::leak(text.to_string().into_boxed_str());
    texts.push(leaked);
    leaked
}

/// The model a head file or ranking says it was made for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileModel {
    /// The hash of the model's config (as reports record it).
    #[serde(default)]
    pub config_hash: Option<String>,
    /// Its depth.
    #[serde(default)]
    pub num_layers: Option<usize>,
    /// Its K/V heads.
    #[serde(default)]
    pub num_kv_heads: Option<usize>,
}

/// A head file: the pairs, and the model it names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeadFile {
    /// The model it was made for.
    #[serde(default)]
    pub model: FileModel,
    /// The cut it was chosen for, when written by a recommendation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut: Option<usize>,
    /// The kept pairs.
    pub heads: Vec<(usize, usize)>,
}

/// A ranking of (layer, K/V head) pairs by decode-to-prefill mass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeadRanking {
    /// The model it was made for.
    #[serde(default)]
    pub model: FileModel,
    /// `(layer, kv_head, mass)`, highest mass first.
    pub ranking: Vec<(usize, usize, f64)>,
}

fn file_error(path: &str, reason: impl Into<String>) -> PolicyError {
    PolicyError::HeadFile {
        path: path.to_string(),
        reason: reason.into(),
    }
}

fn read_json(path: &str) -> Result<serde_json::Value, PolicyError> {
    let text = std::fs::read_to_string(Path::new(path))
        .map_err(|e| file_error(path, format!("cannot be read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| file_error(path, format!("is not JSON: {e}")))
}

/// Read a head file (either form).
pub fn read_head_file(path: &str) -> Result<HeadFile, PolicyError> {
    let value = read_json(path)?;
    let parsed = match value.is_array() {
        true => serde_json::from_value::<Vec<(usize, usize)>>(value).map(|heads| HeadFile {
            heads,
            ..HeadFile::default()
        }),
        false => serde_json::from_value::<HeadFile>(value),
    };
    parsed.map_err(|e| {
        file_error(
            path,
            format!("is not a list of [layer, kv_head] pairs (0-based): {e}"),
        )
    })
}

/// Read a ranking file.
pub fn read_ranking(path: &str) -> Result<HeadRanking, PolicyError> {
    serde_json::from_value(read_json(path)?).map_err(|e| {
        file_error(
            path,
            format!("is not a ranking {{\"ranking\": [[layer, kv_head, mass], ...]}}: {e}"),
        )
    })
}

/// Refuse a file made for another model than `dims`.
fn check_model(path: &str, model: &FileModel, dims: &ModelDims<'_>) -> Result<(), PolicyError> {
    let differ = |what: &str, file: String, ours: String| {
        file_error(
            path,
            format!("was made for another model ({what} {file}, this model's {ours})"),
        )
    };
    if let Some(n) = model.num_layers
        && n != dims.num_layers
    {
        return Err(differ("layers", n.to_string(), dims.num_layers.to_string()));
    }
    if let (Some(n), Some(ours)) = (model.num_kv_heads, dims.kv_heads)
        && n != ours
    {
        return Err(differ("K/V heads", n.to_string(), ours.to_string()));
    }
    if let (Some(h), Some(ours)) = (&model.config_hash, dims.config_hash)
        && h != ours
    {
        return Err(differ("config hash", h.clone(), ours.to_string()));
    }
    Ok(())
}

/// Refuse a pair below the cut, past the last layer or past the model's
/// K/V heads.
fn check_pair(
    path: &str,
    (layer, kv_head): (usize, usize),
    l_cut: usize,
    dims: &ModelDims<'_>,
) -> Result<(), PolicyError> {
    let reason = if layer >= dims.num_layers {
        Some(format!(
            "layer {layer} is past the last layer ({})",
            dims.num_layers - 1
        ))
    } else if layer < l_cut {
        Some(format!(
            "layer {layer} is below the cut {l_cut} (heads are kept above it: layers {l_cut}..{})",
            dims.num_layers - 1
        ))
    } else {
        dims.kv_heads
            .filter(|&kv| kv_head >= kv)
            .map(|kv| format!("K/V head {kv_head} is past the model's {kv} K/V heads"))
    };
    match reason {
        Some(reason) => Err(PolicyError::HeadOutOfRange {
            path: path.to_string(),
            layer,
            kv_head,
            reason,
        }),
        None => Ok(()),
    }
}

impl HeadChoice {
    /// The kept pairs for a cut at `l_cut` of the model `dims`; `ranking`
    /// is the ranking to take `+heads:N` from when the policy names none.
    pub fn resolve(
        &self,
        l_cut: usize,
        dims: &ModelDims<'_>,
        ranking: Option<&HeadRanking>,
    ) -> Result<HeadSet, PolicyError> {
        let pairs: Vec<(usize, usize)> = match self.source {
            None => vec![],
            Some(HeadSource::File(path)) => {
                let file = read_head_file(path)?;
                check_model(path, &file.model, dims)?;
                for &pair in &file.heads {
                    check_pair(path, pair, l_cut, dims)?;
                }
                file.heads
            }
            Some(HeadSource::Top {
                count,
                ranking: named,
            }) => {
                let (path, read);
                let ranking = match named {
                    Some(p) => {
                        path = p;
                        read = read_ranking(p)?;
                        &read
                    }
                    None => {
                        path = "the model's ranking";
                        ranking.ok_or(PolicyError::RankingMissing { count })?
                    }
                };
                check_model(path, &ranking.model, dims)?;
                let above: Vec<(usize, usize)> = ranking
                    .ranking
                    .iter()
                    .filter(|(l, _, _)| *l >= l_cut)
                    .map(|&(l, h, _)| (l, h))
                    .take(count)
                    .collect();
                for &pair in &above {
                    check_pair(path, pair, l_cut, dims)?;
                }
                above
            }
        };
        Ok(HeadSet::of(pairs))
    }
}

impl fmt::Display for HeadChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            Some(HeadSource::File(path)) => write!(f, "+heads:{path}")?,
            Some(HeadSource::Top { count, ranking }) => {
                write!(f, "+heads:{count}")?;
                if let Some(r) = ranking {
                    write!(f, "+ranking:{r}")?;
                }
            }
            None => {}
        }
        if let Some(w) = self.window {
            write!(f, "+window:{w}")?;
        }
        Ok(())
    }
}

impl Serialize for HeadChoice {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for HeadChoice {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        let mut choice = HeadChoice {
            source: None,
            window: None,
        };
        for part in text.split('+').filter(|p| !p.is_empty()) {
            choice
                .take(&text, part)
                .map_err(|e| serde::de::Error::custom(e.to_string()))?;
        }
        Ok(choice)
    }
}

impl HeadChoice {
    /// Take one `+` part (`heads:..`, `ranking:..`, `window:..`) of the
    /// policy `text`; false when the part is none of them.
    pub(crate) fn take(&mut self, text: &str, part: &str) -> Result<bool, PolicyError> {
        let malformed = |reason: String| PolicyError::Malformed {
            text: text.to_string(),
            reason,
        };
        if let Some(v) = part.strip_prefix("heads:") {
            if v.is_empty() {
                return Err(malformed("`heads:` needs a file or a count".into()));
            }
            let ranking = match self.source {
                Some(HeadSource::Top { ranking, .. }) => ranking,
                _ => None,
            };
            self.source = Some(match v.parse::<usize>() {
                Ok(count) => HeadSource::Top { count, ranking },
                Err(_) => HeadSource::File(intern(v)),
            });
            return Ok(true);
        }
        if let Some(v) = part.strip_prefix("ranking:") {
            if v.is_empty() {
                return Err(malformed("`ranking:` needs a file".into()));
            }
            let count = match self.source {
                Some(HeadSource::Top { count, .. }) => count,
                Some(HeadSource::File(_)) => {
                    return Err(malformed(
                        "`ranking:` goes with `heads:N`, not a head file".into(),
                    ));
                }
                None => 0,
            };
            self.source = Some(HeadSource::Top {
                count,
                ranking: Some(intern(v)),
            });
            return Ok(true);
        }
        if let Some(v) = part.strip_prefix("window:") {
            let w = v
                .parse::<usize>()
                .map_err(|_| malformed(format!("window {v:?} is not a token count")))?;
            self.window = Some(w);
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_sorted_deduplicated_and_interned() {
        let a = HeadSet::of([(5, 1), (3, 0), (5, 1)]);
        assert_eq!(a.pairs(), &[(3, 0), (5, 1)]);
        let b = HeadSet::of([(3, 0), (5, 1)]);
        assert!(std::ptr::eq(a.pairs(), b.pairs()));
        assert!(a.contains(5, 1) && !a.contains(5, 0));
        assert_eq!(
            (a.count_at(5), a.count_at(4), a.top_layer()),
            (1, 0, Some(5))
        );
    }

    fn write(name: &str, text: &str) -> String {
        let dir = std::env::temp_dir().join(format!("lcut-heads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path.to_string_lossy().into_owned()
    }

    fn dims() -> ModelDims<'static> {
        ModelDims {
            num_layers: 6,
            kv_heads: Some(2),
            config_hash: Some("abc"),
        }
    }

    fn choice(path: &str) -> HeadChoice {
        HeadChoice {
            source: Some(HeadSource::File(intern(path))),
            window: None,
        }
    }

    #[test]
    fn a_head_file_resolves_in_either_form() {
        let bare = write("bare.json", "[[4, 1], [3, 0]]");
        assert_eq!(
            choice(&bare).resolve(3, &dims(), None).unwrap().pairs(),
            &[(3, 0), (4, 1)]
        );
        let full = write(
            "full.json",
            r#"{"model": {"config_hash": "abc", "num_layers": 6, "num_kv_heads": 2}, "heads": [[5, 0]]}"#,
        );
        assert_eq!(
            choice(&full).resolve(3, &dims(), None).unwrap().pairs(),
            &[(5, 0)]
        );
    }

    #[test]
    fn bad_head_files_are_named_errors() {
        for (name, text, needle) in [
            ("below.json", "[[1, 0]]", "below the cut 3"),
            ("past.json", "[[6, 0]]", "past the last layer (5)"),
            ("head.json", "[[4, 2]]", "past the model's 2 K/V heads"),
            (
                "shape.json",
                "[[4]]",
                "is not a list of [layer, kv_head] pairs",
            ),
            ("json.json", "[[4, 0]", "is not JSON"),
            (
                "other.json",
                r#"{"model": {"config_hash": "xyz"}, "heads": [[4, 0]]}"#,
                "made for another model (config hash xyz",
            ),
            (
                "depth.json",
                r#"{"model": {"num_layers": 30}, "heads": []}"#,
                "made for another model (layers 30",
            ),
        ] {
            let path = write(name, text);
            let err = choice(&path)
                .resolve(3, &dims(), None)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{name}: {err}");
            assert!(err.contains(&path), "{name} names the file: {err}");
        }
        let err = choice("/no/such/heads.json")
            .resolve(3, &dims(), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be read"), "{err}");
    }

    #[test]
    fn the_top_of_a_ranking_above_the_cut() {
        let ranking = HeadRanking {
            model: FileModel::default(),
            ranking: vec![(1, 0, 0.9), (4, 1, 0.5), (5, 0, 0.4), (3, 1, 0.1)],
        };
        let top = HeadChoice {
            source: Some(HeadSource::Top {
                count: 2,
                ranking: None,
            }),
            window: None,
        };
        let set = top.resolve(3, &dims(), Some(&ranking)).unwrap();
        assert_eq!(set.pairs(), &[(4, 1), (5, 0)]);
        let err = top.resolve(3, &dims(), None).unwrap_err();
        assert_eq!(err, PolicyError::RankingMissing { count: 2 });
    }
}
