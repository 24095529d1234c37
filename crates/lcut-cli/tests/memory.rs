//! A run that cannot fit in memory is refused before it starts, with the
//! figures, instead of being killed half way through a prefill.

use std::process::Command;

#[test]
fn a_benchmark_too_large_for_the_machine_is_refused_with_the_figures() {
    // weights alone: 200 layers of width 32768 in f32, about 4 TiB
    let out = Command::new(env!("CARGO_BIN_EXE_lcut"))
        .args([
            "bench",
            "--layers",
            "200",
            "--hidden",
            "32768",
            "--heads",
            "64",
            "--kv-heads",
            "8",
            "--intermediate",
            "131072",
            "--prompt-lengths",
            "1k",
        ])
        .output()
        .expect("lcut runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("need about") && stderr.contains("weights") && stderr.contains("free"),
        "{stderr}"
    );
    // refused before drawing any weights (4 TiB could not have been drawn)
    assert!(stderr.contains("--dtype bf16"), "{stderr}");
}
