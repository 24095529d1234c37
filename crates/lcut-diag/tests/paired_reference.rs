//! lcut's exact McNemar p-values and Holm adjustment against statsmodels
//! and scipy on the committed cases of `fixtures/oracle/stats`
//! (`mcnemar_holm.py` made `mcnemar_holm.json`): every p-value to 1e-9
//! relative, every rejection at 0.05 the same.

#![allow(clippy::unwrap_used)] // a test of fixed files unwraps

use std::path::Path;

use lcut_diag::{ALPHA, holm, mcnemar_exact};
use serde_json::Value;

fn reference() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/oracle/stats/mcnemar_holm.json");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn assert_close(got: f64, want: f64, what: &str) {
    let rel = (got - want).abs() / want.abs().max(f64::MIN_POSITIVE);
    assert!(
        rel <= 1e-9 || got == want,
        "{what}: lcut {got:e}, reference {want:e} (relative {rel:e})"
    );
}

#[test]
fn mcnemar_p_values_match_statsmodels() {
    let r = reference();
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 15, "{} cases", cases.len());
    for case in cases {
        let b = case["b"].as_u64().unwrap() as usize;
        let c = case["c"].as_u64().unwrap() as usize;
        let name = case["name"].as_str().unwrap();
        assert_close(mcnemar_exact(b, c), case["p"].as_f64().unwrap(), name);
        // the order of the two methods does not change the p-value
        assert_eq!(mcnemar_exact(b, c), mcnemar_exact(c, b), "{name}");
    }
    // the edge cases are there: no discordant item, one, 650 items, lopsided
    let has = |f: &dyn Fn(usize, usize, usize) -> bool| {
        cases.iter().any(|c| {
            let n = |k: &str| c[k].as_u64().unwrap() as usize;
            f(
                n("b"),
                n("c"),
                n("both_right") + n("b") + n("c") + n("both_wrong"),
            )
        })
    };
    assert!(has(&|b, c, _| b + c == 0));
    assert!(has(&|b, c, _| b + c == 1));
    assert!(has(&|_, _, n| n == 650));
    assert!(has(&|b, c, _| b.min(c) <= 1 && b.max(c) >= 600));
}

#[test]
fn holm_matches_statsmodels() {
    let r = reference();
    assert_eq!(r["alpha"].as_f64().unwrap(), ALPHA);
    let cases = r["cases"].as_array().unwrap();
    for family in r["holm"].as_array().unwrap() {
        let name = family["name"].as_str().unwrap();
        let p = match family["cases"].as_array() {
            // lcut's own McNemar p-values of the cases, adjusted together
            Some(members) => members
                .iter()
                .map(|i| {
                    let case = &cases[i.as_u64().unwrap() as usize];
                    let n = |k: &str| case[k].as_u64().unwrap() as usize;
                    mcnemar_exact(n("b"), n("c"))
                })
                .collect(),
            None => floats(&family["p"]),
        };
        let got = holm(&p);
        let want = floats(&family["p_holm"]);
        assert_eq!(got.len(), want.len(), "{name}");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(*g, *w, &format!("{name}, test {k}"));
        }
        let reject: Vec<bool> = family["reject"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_bool().unwrap())
            .collect();
        let ours: Vec<bool> = got.iter().map(|&q| q <= ALPHA).collect();
        assert_eq!(ours, reject, "{name}: rejections at {ALPHA}");
    }
}
