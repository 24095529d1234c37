//! A `lcut paper` folder on disk: `run.json` (the model, the suite and the
//! settings the folder belongs to) and one file per part under `parts/`,
//! each holding the part's settings and the results of its units (suite
//! items, or prompt lengths for the timing), written atomically.
//!
//! A rerun reads them back: a part whose every unit is done is skipped, a
//! part cut short goes on from the units it has, and a folder made with
//! another model, suite or settings is refused naming what differs, before
//! any work. Shards of one run (`--shard I/N`) each hold their own units;
//! `lcut paper-merge` joins them into the folder of the whole run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use lcut_trace::{ModelIdentity, PaperPart, SuiteSource};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::common::write_atomic;

/// What a folder belongs to: every `lcut paper` run into it must match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// The tool that made it.
    pub tool_version: String,
    /// The model (its path is not compared: machines mount models apart).
    pub model: ModelIdentity,
    /// The suite, with the shard this folder holds.
    pub suite: SuiteSource,
    /// The settings, as resolved (presets and overrides).
    pub settings: Value,
}

/// One unit's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unit<T> {
    /// The unit: a suite item's index, or a prompt length's place.
    pub index: usize,
    /// What it gave.
    pub result: T,
}

/// One part's file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartFile<T> {
    /// The part.
    pub part: PaperPart,
    /// What made it (compared on resume and merge).
    pub settings: Value,
    /// The units this file is to hold (this shard's).
    pub units: Vec<usize>,
    /// Why the part was skipped (then `units` is empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The results so far, by unit.
    pub done: Vec<Unit<T>>,
}

impl<T> PartFile<T> {
    /// Units not done yet, in order.
    pub fn missing(&self) -> Vec<usize> {
        self.units
            .iter()
            .copied()
            .filter(|u| !self.done.iter().any(|d| d.index == *u))
            .collect()
    }

    /// Whether every unit is done.
    pub fn complete(&self) -> bool {
        self.missing().is_empty()
    }
}

/// `DIR/run.json`.
pub fn manifest_path(dir: &Path) -> PathBuf {
    dir.join("run.json")
}

/// `DIR/parts/NAME.json`.
pub fn part_path(dir: &Path, part: PaperPart) -> PathBuf {
    dir.join("parts").join(format!("{}.json", part.name()))
}

fn read<T: DeserializeOwned>(path: &Path, what: &str) -> Result<Option<T>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .with_context(|| format!("{} is not {what}", path.display()))
}

fn write<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    write_atomic(path, &serde_json::to_vec(value)?)
}

/// The fields where `new` differs from `old`, as `path: old -> new`
/// (nested objects by dotted path, other values whole).
pub fn differences(old: &Value, new: &Value) -> Vec<String> {
    fn walk(prefix: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                keys.sort_unstable();
                keys.dedup();
                for k in keys {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(
                        &path,
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                        out,
                    );
                }
            }
            _ if a != b => out.push(format!("{prefix}: {a} -> {b}")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", old, new, &mut out);
    out
}

/// The manifest as compared: the paths of the model and the adapters
/// left out (machines mount them apart; their hashes stay).
fn comparable(m: &Manifest) -> Result<Value> {
    let mut v = serde_json::to_value(m)?;
    if let Some(model) = v.get_mut("model").and_then(Value::as_object_mut) {
        model.remove("path");
    }
    let adapters = v
        .pointer_mut("/settings/adapters")
        .and_then(Value::as_array_mut);
    for a in adapters.into_iter().flatten() {
        if let Some(a) = a.as_object_mut() {
            a.remove("path");
        }
    }
    Ok(v)
}

/// Check `dir` belongs to the run of `manifest` (write it when the folder
/// is new); a folder of another model, suite, shard or settings is refused
/// naming each difference.
pub fn claim_folder(dir: &Path, manifest: &Manifest) -> Result<()> {
    let path = manifest_path(dir);
    match read::<Manifest>(&path, "an `lcut paper` run description")? {
        None => write(&path, manifest),
        Some(old) => {
            let diff = differences(&comparable(&old)?, &comparable(manifest)?);
            if diff.is_empty() {
                return Ok(());
            }
            bail!(
                "{} holds parts of another run, which this one will not mix with its own: {}\n\
                 (give another --out, or the same model, suite and settings to resume it)",
                dir.display(),
                diff.join("; ")
            )
        }
    }
}

/// Read the manifest of `dir`.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    read(&manifest_path(dir), "an `lcut paper` run description")?.with_context(|| {
        format!(
            "{} has no run.json: not an `lcut paper` folder",
            dir.display()
        )
    })
}

/// Read the file of `part` in `dir`, if there is one.
pub fn load_part<T: DeserializeOwned>(dir: &Path, part: PaperPart) -> Result<Option<PartFile<T>>> {
    read(&part_path(dir, part), "an `lcut paper` part file")
}

/// Write the file of a part, atomically.
pub fn save_part<T: Serialize>(dir: &Path, file: &PartFile<T>) -> Result<()> {
    write(&part_path(dir, file.part), file)
}

/// How a part is to run: where, with what settings, over which units.
pub struct PartPlan<'a> {
    /// The run's folder.
    pub dir: &'a Path,
    /// The part.
    pub part: PaperPart,
    /// What makes it (compared with a file already there).
    pub settings: Value,
    /// The units this run is to do.
    pub units: Vec<usize>,
    /// Why the part is skipped (no units then).
    pub note: Option<String>,
}

/// How often a part cut short is written while it runs.
const CHECKPOINT: Duration = Duration::from_secs(20);

/// Run the units of `plan` not already in its file: `work(unit)` gives a
/// unit's result. The file is written every [`CHECKPOINT`], when a unit
/// fails and at the end; an existing file of other settings is refused
/// naming the differences. `on_start(todo, done)` hears how many units
/// are left of how many.
pub fn run_part<T: Serialize + DeserializeOwned>(
    plan: PartPlan<'_>,
    on_start: &mut dyn FnMut(usize, usize),
    work: &mut dyn FnMut(usize) -> Result<T>,
) -> Result<PartFile<T>> {
    let mut file = match load_part::<T>(plan.dir, plan.part)? {
        Some(f) => {
            let diff = differences(&f.settings, &plan.settings);
            if !diff.is_empty() || f.units != plan.units {
                bail!(
                    "{} was made with other settings, and this run will not mix its results with them: {}",
                    part_path(plan.dir, plan.part).display(),
                    if diff.is_empty() {
                        "other units".to_string()
                    } else {
                        diff.join("; ")
                    }
                );
            }
            f
        }
        None => PartFile {
            part: plan.part,
            settings: plan.settings,
            units: plan.units,
            note: plan.note,
            done: Vec::new(),
        },
    };
    let todo = file.missing();
    on_start(todo.len(), file.units.len());
    let mut saved = Instant::now();
    for unit in todo {
        match work(unit) {
            Ok(result) => file.done.push(Unit {
                index: unit,
                result,
            }),
            Err(e) => {
                save_part(plan.dir, &file)?;
                return Err(e);
            }
        }
        if saved.elapsed() >= CHECKPOINT {
            save_part(plan.dir, &file)?;
            saved = Instant::now();
        }
    }
    file.done.sort_by_key(|u| u.index);
    save_part(plan.dir, &file)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(dir: &Path, settings: Value) -> PartPlan<'_> {
        PartPlan {
            dir,
            part: PaperPart::Table,
            settings,
            units: vec![0, 3, 6, 9],
            note: None,
        }
    }

    #[test]
    fn a_part_cut_short_goes_on_from_its_units() {
        let dir = tempfile::tempdir().unwrap();
        let mut calls = Vec::new();
        let err = run_part::<usize>(
            plan(dir.path(), json!({"cut": 3})),
            &mut |_, _| {},
            &mut |u| {
                calls.push(u);
                if u == 6 {
                    bail!("unit {u} failed")
                } else {
                    Ok(u * 10)
                }
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("unit 6 failed"));
        let partial: PartFile<usize> = load_part(dir.path(), PaperPart::Table).unwrap().unwrap();
        assert_eq!(partial.missing(), vec![6, 9]);
        let mut again = Vec::new();
        let mut started = (0, 0);
        let file = run_part::<usize>(
            plan(dir.path(), json!({"cut": 3})),
            &mut |todo, all| started = (todo, all),
            &mut |u| {
                again.push(u);
                Ok(u * 10)
            },
        )
        .unwrap();
        assert_eq!(again, vec![6, 9]);
        assert_eq!(started, (2, 4));
        assert!(file.complete());
        let results: Vec<usize> = file.done.iter().map(|u| u.result).collect();
        assert_eq!(results, vec![0, 30, 60, 90]);
        // complete: nothing runs
        let file = run_part::<usize>(
            plan(dir.path(), json!({"cut": 3})),
            &mut |_, _| {},
            &mut |_| panic!("a complete part ran again"),
        )
        .unwrap();
        assert!(file.complete());
    }

    #[test]
    fn a_part_of_other_settings_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        run_part::<usize>(
            plan(dir.path(), json!({"cut": 3, "n": 1})),
            &mut |_, _| {},
            &mut |u| Ok(u),
        )
        .unwrap();
        let e = run_part::<usize>(
            plan(dir.path(), json!({"cut": 2, "n": 1})),
            &mut |_, _| {},
            &mut |u| Ok(u),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("table.json") && e.contains("cut: 3 -> 2"), "{e}");
    }

    #[test]
    fn differences_name_nested_fields() {
        let d = differences(
            &json!({"a": 1, "b": {"c": "x", "d": [1]}, "gone": true}),
            &json!({"a": 1, "b": {"c": "y", "d": [1]}, "new": 2}),
        );
        assert_eq!(
            d,
            vec![
                "b.c: \"x\" -> \"y\"",
                "gone: true -> null",
                "new: null -> 2"
            ]
        );
    }

    fn manifest(max_len: usize) -> Manifest {
        Manifest {
            tool_version: "lcut 0".into(),
            model: lcut_diag::synthetic::synthetic_model(4, 2),
            suite: SuiteSource {
                path: "s.jsonl".into(),
                hash: "h".into(),
                items: 3,
                shard: None,
            },
            settings: json!({"max_len": max_len}),
        }
    }

    #[test]
    fn a_folder_of_another_run_is_refused_and_a_moved_model_is_not() {
        let dir = tempfile::tempdir().unwrap();
        claim_folder(dir.path(), &manifest(512)).unwrap();
        let mut moved = manifest(512);
        moved.model.path = "/elsewhere/model".into();
        claim_folder(dir.path(), &moved).unwrap();
        let e = claim_folder(dir.path(), &manifest(256))
            .unwrap_err()
            .to_string();
        assert!(e.contains("settings.max_len: 512 -> 256"), "{e}");
        let mut other = manifest(512);
        other.suite.hash = "h2".into();
        let e = claim_folder(dir.path(), &other).unwrap_err().to_string();
        assert!(e.contains("suite.hash"), "{e}");
    }
}
