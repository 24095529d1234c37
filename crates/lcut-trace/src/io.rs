//! Atomic JSON files: write to a temporary file in the target's folder, then
//! rename over the target, so a reader never sees half a file.

use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::TraceError;
use crate::report::{Report, SCHEMA_VERSION};

/// Writes `bytes` to `path` atomically: a temporary file in the same folder
/// is written, flushed to disk and renamed over `path`. On failure the target is
/// untouched and the temporary file removed. The one implementation every
/// crate uses; the error says which step failed.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    fn step(action: &'static str) -> impl Fn(std::io::Error) -> std::io::Error {
        move |e| std::io::Error::new(e.kind(), format!("{action}: {e}"))
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".lcut-tmp-");
    // Temporary files are private (0600) by default; the result should get the
    // usual mode of a new file (0666 less the umask).
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut tmp = builder
        .tempfile_in(dir)
        .map_err(step("creating a temporary file beside it"))?;
    tmp.write_all(bytes).map_err(step("writing"))?;
    tmp.as_file().sync_all().map_err(step("syncing"))?;
    tmp.persist(path)
        .map_err(|e| step("renaming the temporary file onto it")(e.error))?;
    Ok(())
}

/// [`write_file_atomic`] with the trace crate's error.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TraceError> {
    write_file_atomic(path, bytes).map_err(|source| TraceError::Io {
        action: "writing",
        path: path.to_path_buf(),
        source,
    })
}

/// Serialises `value` as compact JSON and writes it atomically to `path`.
pub fn write_json<T: Serialize>(
    path: &Path,
    value: &T,
    what: &'static str,
) -> Result<(), TraceError> {
    let bytes = serde_json::to_vec(value).map_err(|source| TraceError::Encode { what, source })?;
    write_atomic(path, &bytes)
}

/// Reads JSON of type `T` from `path`; `what` names the content for messages.
pub fn read_json<T: DeserializeOwned>(path: &Path, what: &'static str) -> Result<T, TraceError> {
    let bytes = std::fs::read(path).map_err(|source| TraceError::Io {
        action: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    parse_json(path, &bytes, what)
}

fn parse_json<T: DeserializeOwned>(
    path: &Path,
    bytes: &[u8],
    what: &'static str,
) -> Result<T, TraceError> {
    serde_json::from_slice(bytes).map_err(|source| TraceError::Json {
        path: path.to_path_buf(),
        what,
        source,
    })
}

/// Checks the top-level `schema_version` of a JSON document before it is parsed
/// in full, so an old file gets a version message rather than a missing field.
fn check_version(path: &Path, bytes: &[u8]) -> Result<(), TraceError> {
    #[derive(serde::Deserialize)]
    struct Version {
        schema_version: Option<serde_json::Value>,
    }
    let v: Version = parse_json(path, bytes, "lcut JSON file")?;
    match v.schema_version {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(u64::from(SCHEMA_VERSION)) => {
            Ok(())
        }
        found => Err(TraceError::SchemaVersion {
            path: path.to_path_buf(),
            found: found.map_or_else(|| "missing".to_string(), |f| f.to_string()),
            expected: SCHEMA_VERSION,
        }),
    }
}

/// Writes a report as JSON, atomically.
pub fn write_report_json(path: &Path, report: &Report) -> Result<(), TraceError> {
    write_json(path, report, "report")
}

/// Reads a report: checks the schema version, parses, and validates shapes.
pub fn read_report_json(path: &Path) -> Result<Report, TraceError> {
    let bytes = std::fs::read(path).map_err(|source| TraceError::Io {
        action: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    check_version(path, &bytes)?;
    let report: Report = parse_json(path, &bytes, "report")?;
    report.validate(&path.display().to_string())?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        write_atomic(&path, b"first").unwrap();
        write_atomic(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn written_files_are_not_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        write_atomic(&path, b"{}").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_ne!(mode & 0o044, 0, "group/other can read (mode {mode:o})");
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope").join("x.json");
        let msg = write_atomic(&missing, b"x").unwrap_err().to_string();
        assert!(msg.contains("nope"), "{msg}");
        let msg = read_json::<u32>(&missing, "number")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("x.json"), "{msg}");

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, b"{\"a\": 1}").unwrap();
        let msg = read_report_json(&bad).unwrap_err().to_string();
        assert!(
            msg.contains("bad.json") && msg.contains("schema_version"),
            "{msg}"
        );
        let msg = read_json::<Vec<u32>>(&bad, "list").unwrap_err().to_string();
        assert!(msg.contains("bad.json") && msg.contains("list"), "{msg}");
    }

    #[test]
    fn old_schema_version_is_reported_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.json");
        std::fs::write(&old, b"{\"schema_version\": 0}").unwrap();
        let err = read_report_json(&old).unwrap_err();
        assert!(matches!(err, TraceError::SchemaVersion { .. }), "{err}");
        assert!(err.to_string().contains("is 0, expected 1"), "{err}");
    }
}
