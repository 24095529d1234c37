//! Work that needs no model, shared by every worker: reading a saved report
//! and exporting one. Both can take seconds on a large run, so they run on
//! the worker thread, not in a frame.

use std::path::{Path, PathBuf};

use lcut_report::Format;
use lcut_trace::{Report, read_report_json};

use crate::backend::{Event, WorkerPort};
use crate::failure::{FailureKind, JobError};

/// The report file a path names: the path itself, or `report.json` inside a
/// folder (a saved run).
pub fn report_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("report.json")
    } else {
        path.to_path_buf()
    }
}

/// Reads a report (checking schema version and shapes).
pub fn load_report(path: &Path) -> Result<Report, JobError> {
    let file = report_file(path);
    read_report_json(&file).map_err(|e| JobError::new(FailureKind::ReadReport, e.to_string()))
}

/// Reads the report at `path` and sends [`Event::ReportReady`] or
/// [`Event::DiagnoseFailed`].
pub fn serve_open_report(port: &WorkerPort, path: &Path) {
    port.progress(0, 1, format!("reading {}", path.display()));
    match load_report(path) {
        Ok(report) => port.send(Event::ReportReady {
            report: Box::new(report),
            source: report_file(path).display().to_string(),
        }),
        Err(e) => port.send(Event::DiagnoseFailed(e)),
    };
}

/// Writes `report` as `dir/report.FORMAT` and sends [`Event::Exported`] or
/// [`Event::ExportFailed`].
pub fn serve_export(port: &WorkerPort, report: &Report, format: Format, dir: &Path) {
    port.progress(0, 1, format!("writing {format} to {}", dir.display()));
    match lcut_report::write_report(report, dir, format) {
        Ok(path) => port.send(Event::Exported(path)),
        Err(e) => port.send(Event::ExportFailed(JobError::new(
            FailureKind::Export,
            format!("exporting {format} to {}: {e}", dir.display()),
        ))),
    };
}
