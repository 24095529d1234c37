//! Reading a suite file: one JSON object per line, each problem named with
//! its line number.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{Scoring, SuiteItem};

/// What is wrong with a suite file.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    /// The file cannot be read.
    #[error("suite {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line is not a JSON object.
    #[error("suite {path}, line {line}: malformed JSON: {reason}")]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// The parser's message.
        reason: String,
    },
    /// A required field is missing, empty or not a string.
    #[error("suite {path}, line {line}: no {field:?} (a non-empty string is required)")]
    MissingField {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// The field.
        field: &'static str,
    },
    /// The scoring rule is not one lcut knows.
    #[error(
        "suite {path}, line {line}: unknown scoring rule {rule:?} (expected exact, contains, \
         choice, string_match_all or string_match_part)"
    )]
    UnknownScoring {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// The rule as written.
        rule: String,
    },
    /// Any other bad line (choices, duplicate id).
    #[error("suite {path}, line {line}: {reason}")]
    BadItem {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The file has no items.
    #[error("suite {path}: no items")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Read a suite file (see [`parse_suite`]).
pub fn read_suite(path: &Path) -> Result<Vec<SuiteItem>, SuiteError> {
    read_suite_hashed(path).map(|(items, _)| items)
}

/// Read a suite file (see [`parse_suite`]) once: its items and
/// [`lcut_trace::hash_bytes`] of the bytes read (the suite hash that
/// results record).
pub fn read_suite_hashed(path: &Path) -> Result<(Vec<SuiteItem>, String), SuiteError> {
    let io = |source| SuiteError::Io {
        path: path.to_path_buf(),
        source,
    };
    let bytes = std::fs::read(path).map_err(io)?;
    // as read_to_string: text that is not UTF-8 is an I/O error
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    Ok((parse_suite(text, path)?, lcut_trace::hash_bytes(&bytes)))
}

/// Parse suite text (`path` names it in errors): blank lines are skipped;
/// `prompt` and `answer` are required (`question`, `answer_prefix`,
/// `answers`, `completion` and `max_new_tokens` are optional), `scoring`
/// defaults to `contains`,
/// `kind` to `task` and `length` to `any`; an `id` defaults to `lineN`
/// and must be unique; a `choice` item needs `choices` holding the answer.
pub fn parse_suite(text: &str, path: &Path) -> Result<Vec<SuiteItem>, SuiteError> {
    let mut items = Vec::new();
    let mut seen = HashSet::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let item = parse_line(raw, i + 1, path)?;
        if !seen.insert(item.id.clone()) {
            return Err(SuiteError::BadItem {
                path: path.to_path_buf(),
                line: i + 1,
                reason: format!("the id {:?} is used by an earlier item", item.id),
            });
        }
        items.push(item);
    }
    if items.is_empty() {
        return Err(SuiteError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(items)
}

/// One line as an item.
fn parse_line(raw: &str, line: usize, path: &Path) -> Result<SuiteItem, SuiteError> {
    let json_err = |reason: String| SuiteError::Json {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| json_err(e.to_string()))?;
    let obj = value
        .as_object()
        .ok_or_else(|| json_err("expected an object {\"prompt\": ..., \"answer\": ...}".into()))?;
    let text = |field: &'static str| -> Option<String> {
        obj.get(field)
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .filter(|s| !s.trim().is_empty())
    };
    let required = |field: &'static str| {
        text(field).ok_or_else(|| SuiteError::MissingField {
            path: path.to_path_buf(),
            line,
            field,
        })
    };
    let prompt = required("prompt")?;
    let answer = required("answer")?;
    let scoring = match obj.get("scoring") {
        None => Scoring::Contains,
        Some(v) => {
            let rule = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            Scoring::parse(&rule).ok_or_else(|| SuiteError::UnknownScoring {
                path: path.to_path_buf(),
                line,
                rule,
            })?
        }
    };
    let bad = |reason: String| SuiteError::BadItem {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let choices: Vec<String> = match obj.get("choices") {
        None => Vec::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| bad(format!("`choices` must be a list of strings: {e}")))?,
    };
    if scoring == Scoring::Choice && !choices.iter().any(|c| c.trim() == answer.trim()) {
        return Err(bad(format!(
            "a choice item needs `choices` holding the answer {answer:?}"
        )));
    }
    let answers: Vec<String> = match obj.get("answers") {
        None => Vec::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| bad(format!("`answers` must be a list of strings: {e}")))?,
    };
    if answers.iter().any(|a| a.trim().is_empty()) {
        return Err(bad("`answers` holds an empty reference string".into()));
    }
    let question = text("question");
    // an answer stem may be a single space; only its presence matters
    let answer_prefix = obj
        .get("answer_prefix")
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .ok_or_else(|| bad("`answer_prefix` must be a string".into()))
        })
        .transpose()?;
    if answer_prefix.is_some() && question.is_none() {
        return Err(bad(
            "an `answer_prefix` needs a `question` (it follows the question)".into(),
        ));
    }
    let completion = match obj.get("completion") {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| bad("`completion` must be true or false".into()))?,
    };
    let max_new_tokens = match obj.get("max_new_tokens") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad("`max_new_tokens` must be a positive integer".into()))?
                as usize,
        ),
    };
    Ok(SuiteItem {
        id: text("id").unwrap_or_else(|| format!("line{line}")),
        kind: text("kind").unwrap_or_else(|| "task".into()),
        length: text("length").unwrap_or_else(|| "any".into()),
        variant: text("variant"),
        system: text("system"),
        prompt,
        question,
        answer_prefix,
        completion,
        max_new_tokens,
        answer,
        scoring,
        choices,
        answers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<SuiteItem>, SuiteError> {
        parse_suite(text, Path::new("s.jsonl"))
    }

    #[test]
    fn hashed_read_gives_the_items_and_the_hash_of_the_file() {
        let path = crate::bundled::workspace_root().join("fixtures/suites/smollm2.jsonl");
        let (items, hash) = read_suite_hashed(&path).unwrap();
        assert_eq!(items, read_suite(&path).unwrap());
        assert_eq!(hash, lcut_trace::hash_bytes(&std::fs::read(&path).unwrap()));
    }

    #[test]
    fn reads_items_with_defaults() {
        let items = parse(
            "{\"id\":\"a\",\"prompt\":\"p\",\"answer\":\"x\"}\n\n\
             {\"prompt\":\"q\",\"answer\":\"dog\",\"scoring\":\"choice\",\"choices\":[\"dog\",\"cat\"],\"kind\":\"choice\"}\n",
        )
        .unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].scoring, Scoring::Contains);
        assert_eq!(items[1].id, "line3");
        assert_eq!(items[1].kind, "choice");
    }

    #[test]
    fn bad_lines_are_named_with_their_number() {
        let cases = [
            ("{\"prompt\":\"p\"}", "line 1", "\"answer\""),
            (
                "{\"prompt\":\"p\",\"answer\":\"a\",\"scoring\":\"regex\"}",
                "line 1",
                "regex",
            ),
            ("{\"prompt\":\"p\",\"answer\":", "line 1", "malformed JSON"),
            ("[1,2]", "line 1", "expected an object"),
            (
                "{\"prompt\":\"p\",\"answer\":\"a\",\"scoring\":\"choice\",\"choices\":[\"b\"]}",
                "line 1",
                "choices",
            ),
        ];
        for (text, line, what) in cases {
            let err = parse(&format!("\n{text}")).unwrap_err().to_string();
            let line = line.replace('1', "2");
            assert!(err.contains(&line) && err.contains(what), "{err}");
        }
        let err = parse("{\"prompt\":\"p\",\"answer\":\"a\",\"scoring\":\"regex\"}").unwrap_err();
        assert!(matches!(err, SuiteError::UnknownScoring { line: 1, .. }));
        let err = parse("{\"prompt\":\"p\"}").unwrap_err();
        assert!(matches!(
            err,
            SuiteError::MissingField {
                field: "answer",
                ..
            }
        ));
        for (text, what) in [
            (
                "{\"prompt\":\"p\",\"answer\":\"a\",\"answer_prefix\":\"A:\"}",
                "needs a `question`",
            ),
            (
                "{\"prompt\":\"p\",\"answer\":\"a\",\"answers\":[\"a\",\"\"]}",
                "empty reference",
            ),
            (
                "{\"prompt\":\"p\",\"answer\":\"a\",\"max_new_tokens\":0}",
                "positive integer",
            ),
            (
                "{\"prompt\":\"p\",\"answer\":\"a\",\"completion\":\"yes\"}",
                "true or false",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains("line 1") && err.contains(what), "{err}");
        }
        let dup = "{\"id\":\"a\",\"prompt\":\"p\",\"answer\":\"x\"}\n".repeat(2);
        assert!(parse(&dup).unwrap_err().to_string().contains("line 2"));
        assert!(matches!(parse("\n").unwrap_err(), SuiteError::Empty { .. }));
    }
}
