//! `lcut ... | head` ends quietly: a command whose reader has gone does not
//! panic with "failed printing to stdout".

use std::process::{Command, Stdio};

use anyhow::{Result, ensure};

#[test]
fn output_into_a_closed_pipe_is_no_panic() -> Result<()> {
    let model =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/copy-full");
    let text = "abc ".repeat(2000);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args(["tokenize", "--verbose", "--model"])
        .arg(&model)
        .arg(&text)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // the reader goes away before the command has written anything
    drop(child.stdout.take());
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
        "stderr: {stderr}"
    );
    Ok(())
}
