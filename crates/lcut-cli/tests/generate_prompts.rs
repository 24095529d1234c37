//! `lcut generate --prompts FILE`: every prompt of a prompt set generated,
//! up to eight decoded side by side, gives each prompt the tokens `lcut
//! generate PROMPT` gives it alone (greedy), in the file's order, also for
//! prompts that start after the first eight have ended; a malformed line
//! is named before anything runs.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const PROMPTS: &str = "fixtures/prompts/copy.jsonl";

fn lcut(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lcut"))
        .current_dir(lcut_testkit::workspace_root())
        .args(args)
        .output()
        .expect("lcut runs")
}

fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json written")).expect("json")
}

#[test]
fn every_prompt_gets_the_tokens_it_gets_alone() {
    let tmp = tempfile::tempdir().expect("temp dir");
    // eleven prompts: more than one pass takes, so later ones start as others end
    let lines =
        std::fs::read_to_string(lcut_testkit::workspace_root().join(PROMPTS)).expect("prompt set");
    let mut set = String::new();
    let mut texts = Vec::new();
    for (i, line) in lines.lines().cycle().take(11).enumerate() {
        let v: Value = serde_json::from_str(line).expect("a prompt line");
        let text = v["prompt"].as_str().expect("prompt").to_string();
        set.push_str(&serde_json::json!({"id": format!("p{i}"), "prompt": text}).to_string());
        set.push('\n');
        texts.push(text);
    }
    let file = tmp.path().join("prompts.jsonl");
    std::fs::write(&file, set).expect("write prompts");
    let all = tmp.path().join("all.json");
    let out = lcut(&[
        "generate",
        "--prompts",
        file.to_str().expect("utf-8"),
        "--policy",
        "speed:3+bos",
        "--max-new-tokens",
        "8",
        "--json",
        all.to_str().expect("utf-8"),
    ]);
    ok(&out);
    let all = read(&all);
    let results = all.as_array().expect("a list of results");
    assert_eq!(results.len(), 11);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["id"], format!("p{i}"), "results in the file's order");
    }
    for i in [0, 5, 10] {
        let one = tmp.path().join(format!("one{i}.json"));
        ok(&lcut(&[
            "generate",
            &texts[i],
            "--policy",
            "speed:3+bos",
            "--max-new-tokens",
            "8",
            "--json",
            one.to_str().expect("utf-8"),
        ]));
        let alone = read(&one);
        assert_eq!(
            results[i]["tokens"], alone["tokens"],
            "prompt {i}: side by side {} alone {}",
            results[i]["tokens"], alone["tokens"]
        );
    }
}

#[test]
fn a_malformed_prompt_line_is_named_before_anything_runs() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let file = tmp.path().join("bad.jsonl");
    std::fs::write(&file, "{\"prompt\": \"copy : a [ b ]\"}\n{\"prompt\": 3}\n").expect("write");
    let json = tmp.path().join("out.json");
    let out = lcut(&[
        "generate",
        "--prompts",
        file.to_str().expect("utf-8"),
        "--json",
        json.to_str().expect("utf-8"),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.jsonl") && stderr.contains("line 2"),
        "{stderr}"
    );
    assert!(!json.exists());
}
