//! The journal of a leaderboard run (`items.jsonl` in its folder): the
//! run's header on the first line, then one line per finished item,
//! appended and flushed as each finishes. A rerun with the same settings
//! reads it back and skips the items it holds; a last line cut short by an
//! interrupted write is dropped (that item runs again); a journal of other
//! settings is refused by name rather than mixed in.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{LeaderboardError, LeaderboardHeader, LeaderboardItem};
use crate::error::Result;

/// What a journal holds: its run's header and the items finished so far
/// (a last line cut short by an interrupted write left out).
struct JournalLines {
    header: LeaderboardHeader,
    items: Vec<LeaderboardItem>,
    /// The journal's text without its cut line, when its last line was cut.
    cut_short: Option<String>,
}

/// Read the journal at `path`: `None` when it does not exist or holds no
/// line yet.
fn read_lines(path: &Path) -> Result<Option<JournalLines>> {
    let err = |line: usize, reason: String| LeaderboardError::Journal {
        path: path.to_path_buf(),
        line,
        reason,
    };
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|e| err(0, e.to_string()))?;
    let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
    // a last line without its newline was cut short: drop it
    let cut = lines.last().is_some_and(|l| !l.ends_with('\n'));
    if cut {
        lines.pop();
    }
    let Some(first) = lines.first() else {
        return Ok(None);
    };
    let header: LeaderboardHeader = serde_json::from_str(first)
        .map_err(|e| err(1, format!("not a leaderboard header: {e}")))?;
    let mut items = Vec::new();
    for (k, line) in lines.iter().enumerate().skip(1) {
        let item: LeaderboardItem = serde_json::from_str(line)
            .map_err(|e| err(k + 1, format!("not an item of this run: {e}")))?;
        if item.results.len() != header.configs.len() {
            return Err(err(
                k + 1,
                format!(
                    "{} results for {} configurations",
                    item.results.len(),
                    header.configs.len()
                ),
            )
            .into());
        }
        items.push(item);
    }
    Ok(Some(JournalLines {
        header,
        items,
        cut_short: cut.then(|| lines.concat()),
    }))
}

/// The header and finished items of the run whose journal is at `path`
/// (a run still going, or stopped): a refused or missing journal is a named
/// error.
pub fn read(path: &Path) -> Result<(LeaderboardHeader, Vec<LeaderboardItem>)> {
    let read = read_lines(path)?.ok_or_else(|| LeaderboardError::Journal {
        path: path.to_path_buf(),
        line: 0,
        reason: "no journal here, or an empty one (no run has started in this folder)".into(),
    })?;
    Ok((read.header, read.items))
}

/// An open journal, appending.
pub struct Journal {
    path: PathBuf,
    state: JournalState,
}

/// Whether a journal's file exists yet.
enum JournalState {
    /// A new run's journal: its header line, written with the first item,
    /// so that a run refused before any item leaves no journal behind.
    Unstarted(String),
    /// The file, open for appending.
    Open(File),
}

impl Journal {
    /// Open the journal at `path` for a run of `header`, or prepare a new
    /// one (written, with its folder, when the first item is appended): the
    /// items it already holds (in file order).
    pub fn open(path: &Path, header: &LeaderboardHeader) -> Result<(Self, Vec<LeaderboardItem>)> {
        let Some(read) = read_lines(path)? else {
            let line = serde_json::to_string(header).map_err(|e| LeaderboardError::Journal {
                path: path.to_path_buf(),
                line: 1,
                reason: e.to_string(),
            })?;
            let journal = Self {
                path: path.to_path_buf(),
                state: JournalState::Unstarted(format!("{line}\n")),
            };
            return Ok((journal, Vec::new()));
        };
        if &read.header != header {
            return Err(LeaderboardError::OtherRun {
                path: path.to_path_buf(),
                what: differing_fields(&read.header, header),
            }
            .into());
        }
        if let Some(kept) = &read.cut_short {
            // rewrite without the cut line, atomically
            lcut_trace::write_atomic(path, kept.as_bytes())?;
        }
        let journal = Self {
            path: path.to_path_buf(),
            state: JournalState::Open(Self::append_to(path)?),
        };
        Ok((journal, read.items))
    }

    /// The file at `path`, open for appending.
    fn append_to(path: &Path) -> Result<File> {
        Ok(OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(|e| LeaderboardError::Journal {
                path: path.to_path_buf(),
                line: 0,
                reason: e.to_string(),
            })?)
    }

    /// Append one finished item and flush it to the disk (a new journal's
    /// first item is written with its header, in one atomic write).
    pub fn append(&mut self, item: &LeaderboardItem) -> Result<()> {
        let io = |e: std::io::Error| LeaderboardError::Journal {
            path: self.path.clone(),
            line: 0,
            reason: e.to_string(),
        };
        let line = serde_json::to_string(item).map_err(|e| LeaderboardError::Journal {
            path: self.path.clone(),
            line: 0,
            reason: e.to_string(),
        })?;
        match &mut self.state {
            JournalState::Open(file) => {
                file.write_all(format!("{line}\n").as_bytes()).map_err(io)?;
                file.sync_data().map_err(io)?;
            }
            JournalState::Unstarted(header) => {
                if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                lcut_trace::write_atomic(&self.path, format!("{header}{line}\n").as_bytes())?;
                self.state = JournalState::Open(Self::append_to(&self.path)?);
            }
        }
        Ok(())
    }
}

/// The top-level fields in which two headers differ, named.
fn differing_fields(a: &LeaderboardHeader, b: &LeaderboardHeader) -> String {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return "the header".into();
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let differ: Vec<&str> = keys
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(String::as_str)
        .collect();
    differ.join(", ")
}
