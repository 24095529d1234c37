//! Writes a synthetic report in every format: `cargo run -p lcut-report --example demo -- OUT_DIR`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "demo-report".into()),
    );
    let report = lcut_diag::synthetic::synthetic_report(6, 16, 8, true)?;
    for format in lcut_report::Format::ALL {
        let path = lcut_report::write_report(&report, &dir, format)?;
        println!("{}", path.display());
    }
    Ok(())
}
