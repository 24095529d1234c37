//! Deterministic mutants of files for the damaged-file tests: byte-level
//! damage for binary formats ([`mutants`]), JSON-aware damage for JSON
//! formats ([`json_mutants`]: wrong types, huge and non-finite numbers,
//! duplicated and missing keys, invalid UTF-8, deep nesting, truncation at
//! every token boundary), and a runner that feeds each mutant to a loader
//! under `catch_unwind` and names the mutant that panicked ([`MutantRun`]).
//! The same seed gives the same mutants.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Value};

/// Number of mutants a test runs: `LCUT_MUTANTS` when set to a number,
/// `default` otherwise.
pub fn mutant_count(default: usize) -> usize {
    std::env::var("LCUT_MUTANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One mutation of a file's `bytes` for the damaged-file tests: bit flips, a
/// truncation, a 64-bit length or count replaced by a huge value, a run of
/// 0xFF, or a 32-bit field replaced; 85% of the positions fall in the first
/// `header_len` bytes.
fn mutate(bytes: &[u8], header_len: usize, rng: &mut StdRng) -> Vec<u8> {
    let mut b = bytes.to_vec();
    if b.len() < 8 {
        b.truncate(rng.random_range(0..=b.len()));
        return b;
    }
    let at = |rng: &mut StdRng, len: usize| {
        if rng.random_bool(0.85) {
            rng.random_range(0..header_len.min(len).max(1))
        } else {
            rng.random_range(0..len.max(1))
        }
    };
    match rng.random_range(0..5) {
        0 => {
            // flip one to eight bits
            for _ in 0..rng.random_range(1..=8) {
                let i = at(rng, b.len());
                b[i] ^= 1 << rng.random_range(0..8);
            }
        }
        1 => {
            let cut = rng.random_range(0..b.len());
            b.truncate(cut);
        }
        2 => {
            // a length or count replaced by a huge value
            let i = at(rng, b.len() - 8) & !7;
            let huge = [
                u64::MAX,
                1 << 40,
                1 << 32,
                u64::from(u32::MAX),
                rng.random(),
            ];
            let v = huge[rng.random_range(0..huge.len())];
            b[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
        3 => {
            let i = at(rng, b.len());
            let end = (i + rng.random_range(1..64)).min(b.len());
            b[i..end].fill(0xFF);
        }
        _ => {
            // a 32-bit field (type, rank, version) replaced
            let i = at(rng, b.len() - 4) & !3;
            let v: u32 = [0, 7, 13, 16, 31, 255, u32::MAX][rng.random_range(0..7)];
            b[i..i + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
    b
}

/// An endless, deterministic stream of byte-level mutants of `bytes` (bit
/// flips, truncations, huge lengths, 0xFF runs), the same for the same
/// `seed`; 85% of the damage falls in the first `header_len` bytes.
pub fn mutants(bytes: &[u8], header_len: usize, seed: u64) -> impl Iterator<Item = Vec<u8>> + '_ {
    let mut rng = StdRng::seed_from_u64(seed);
    std::iter::repeat_with(move || mutate(bytes, header_len, &mut rng))
}

/// The prefixes of `bytes` that end at each of `cuts` (offsets past the end
/// are skipped): a file cut short at every boundary of its structure.
pub fn truncations<'a>(bytes: &'a [u8], cuts: &'a [usize]) -> impl Iterator<Item = Vec<u8>> + 'a {
    cuts.iter()
        .filter(|&&c| c < bytes.len())
        .map(|&c| bytes[..c].to_vec())
}

/// The token boundaries of a JSON text: the offsets just before and just
/// after every structural character (`{}[]:,`) and every string, so that a
/// truncation there cuts the document between or inside its tokens.
pub fn json_boundaries(text: &[u8]) -> Vec<usize> {
    let mut cuts = vec![0];
    let mut in_string = false;
    let mut escaped = false;
    for (i, &c) in text.iter().enumerate() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => {
                    in_string = false;
                    cuts.push(i + 1);
                }
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => {
                in_string = true;
                cuts.extend([i, i + 1]);
            }
            b'{' | b'}' | b'[' | b']' | b':' | b',' => cuts.extend([i, i + 1]),
            _ => {}
        }
    }
    cuts.dedup();
    cuts
}

/// One step of a path into a JSON document.
#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// What a node of the seed document is, for picking targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

fn kind(v: &Value) -> Kind {
    match v {
        Value::Null => Kind::Null,
        Value::Bool(_) => Kind::Bool,
        Value::Number(_) => Kind::Number,
        Value::String(_) => Kind::String,
        Value::Array(_) => Kind::Array,
        Value::Object(_) => Kind::Object,
    }
}

/// Most nodes of a seed document that mutations aim at.
const MAX_NODES: usize = 200_000;

fn collect(v: &Value, path: &mut Vec<Step>, out: &mut Vec<(Vec<Step>, Kind)>) {
    if out.len() >= MAX_NODES {
        return;
    }
    out.push((path.clone(), kind(v)));
    match v {
        Value::Array(xs) => {
            for (i, x) in xs.iter().enumerate() {
                path.push(Step::Index(i));
                collect(x, path, out);
                path.pop();
            }
        }
        Value::Object(m) => {
            for (k, x) in m {
                path.push(Step::Key(k.clone()));
                collect(x, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(root: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(root, |v, step| match (step, v) {
        (Step::Key(k), Value::Object(m)) => m.get_mut(k).expect("path of the seed"),
        (Step::Index(i), Value::Array(xs)) => &mut xs[*i],
        _ => unreachable!("paths come from the seed document"),
    })
}

/// A string no seed document holds: where it lands in the serialised text,
/// raw bytes (invalid JSON, invalid UTF-8) are spliced in.
const SPLICE: &str = "\u{1}lcut-mutant-splice\u{1}";

/// Serialise `doc`, then replace the placeholder [`SPLICE`] by `raw`.
fn splice(doc: &Value, raw: &[u8]) -> Vec<u8> {
    let text = serde_json::to_vec(doc).expect("a Value serialises");
    let needle = serde_json::to_vec(&Value::from(SPLICE)).expect("a string serialises");
    match text.windows(needle.len()).position(|w| w == needle) {
        Some(at) => [&text[..at], raw, &text[at + needle.len()..]].concat(),
        None => text,
    }
}

/// Numbers that break counts, sizes and ranges.
fn odd_number(rng: &mut StdRng) -> Value {
    let values: [Value; 12] = [
        Value::from(u64::MAX),
        Value::from(1u64 << 40),
        Value::from(1u64 << 32),
        Value::from((1u64 << 53) + 1),
        Value::from(u64::from(u32::MAX) + 1),
        Value::from(-1),
        Value::from(i64::MIN),
        Value::from(0),
        Value::from(1e308),
        Value::from(-1e308),
        Value::from(0.5),
        Value::from(1e-310),
    ];
    values[rng.random_range(0..values.len())].clone()
}

/// Raw tokens that are not valid JSON numbers, or are out of range.
const RAW_NUMBERS: [&str; 12] = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-1e400",
    "1e-400",
    "18446744073709551616",
    "-9223372036854775809",
    "-0",
    "01",
    "1.",
    "99999999999999999999999999999999",
];

/// Strings that are not what a field wants.
fn odd_string(rng: &mut StdRng) -> Value {
    let s: String = match rng.random_range(0..8) {
        0 => String::new(),
        1 => "NaN".into(),
        2 => "inf".into(),
        3 => "-Infinity".into(),
        4 => "\u{0}".into(),
        5 => "é\u{1F389}\u{202E}".into(),
        6 => "x".repeat(rng.random_range(1000..100_000)),
        _ => "18446744073709551616".into(),
    };
    Value::String(s)
}

/// Raw string tokens that are not valid UTF-8 or not valid JSON strings.
const RAW_STRINGS: [&[u8]; 7] = [
    b"\"\xff\xfe\"",
    b"\"a\xc3\x28b\"",
    b"\"\xed\xa0\x80\"",
    b"\"\\ud800\"",
    b"\"\\u12\"",
    b"\"unterminated",
    b"\"tab\there\"",
];

/// A value of another type than `v`.
fn wrong_type(v: &Value, rng: &mut StdRng) -> Value {
    let choices = [
        Value::Null,
        Value::Bool(true),
        Value::from("text"),
        Value::from(0),
        Value::from(-1),
        Value::Array(vec![]),
        Value::Object(Map::new()),
        Value::Array(vec![v.clone()]),
        Value::Object(Map::from_iter([("value".to_string(), v.clone())])),
    ];
    loop {
        let c = &choices[rng.random_range(0..choices.len())];
        if kind(c) != kind(v) || c.is_array() || c.is_object() {
            return c.clone();
        }
    }
}

/// JSON-aware mutants of one seed document; see [`json_mutants`].
pub struct JsonMutants {
    text: Vec<u8>,
    doc: Value,
    nodes: Vec<(Vec<Step>, Kind)>,
    cuts: Vec<usize>,
    next_cut: usize,
    rng: StdRng,
}

/// An endless, deterministic stream of mutants of the JSON text `text`: first
/// the text cut at every token boundary (at most 2,000 cuts, evenly spread),
/// then random damage: a value replaced by one of another type, by a huge,
/// negative or non-finite number (also as raw tokens such as `NaN` and
/// `1e400`) or by an odd string; a key removed, duplicated or renamed; an
/// array emptied, shortened or repeated; invalid UTF-8 and bad escapes
/// spliced into a string; a value nested hundreds of levels deep; byte-level
/// damage of the text ([`mutants`]). Panics if `text` is not JSON (a seed
/// is a fixture).
pub fn json_mutants(text: &[u8], seed: u64) -> JsonMutants {
    let doc: Value = serde_json::from_slice(text).expect("the seed is valid JSON");
    let mut nodes = Vec::new();
    collect(&doc, &mut Vec::new(), &mut nodes);
    let all = json_boundaries(text);
    let step = all.len().div_ceil(2000).max(1);
    let cuts = all.into_iter().step_by(step).collect();
    JsonMutants {
        text: text.to_vec(),
        doc,
        nodes,
        cuts,
        next_cut: 0,
        rng: StdRng::seed_from_u64(seed),
    }
}

impl JsonMutants {
    /// A random node, preferring those of `want` when the seed has any.
    fn pick(&mut self, want: &[Kind]) -> usize {
        let matching: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| want.contains(&self.nodes[i].1))
            .collect();
        if matching.is_empty() || self.rng.random_bool(0.1) {
            self.rng.random_range(0..self.nodes.len())
        } else {
            matching[self.rng.random_range(0..matching.len())]
        }
    }

    /// A random object member (a node reached by a key), if the seed has one.
    fn pick_member(&mut self) -> Option<usize> {
        let members: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| matches!(self.nodes[i].0.last(), Some(Step::Key(_))))
            .collect();
        (!members.is_empty()).then(|| members[self.rng.random_range(0..members.len())])
    }

    /// The document with the node at `i` replaced by `new`.
    fn replaced(&self, i: usize, new: Value) -> Value {
        let mut doc = self.doc.clone();
        *node_mut(&mut doc, &self.nodes[i].0) = new;
        doc
    }

    /// The document with `raw` bytes in place of the node at `i`.
    fn spliced(&self, i: usize, raw: &[u8]) -> Vec<u8> {
        splice(&self.replaced(i, Value::from(SPLICE)), raw)
    }

    fn random_mutant(&mut self) -> Vec<u8> {
        let to_vec = |v: &Value| serde_json::to_vec(v).expect("a Value serialises");
        match self.rng.random_range(0..12) {
            0 => {
                let i = self.pick(&[Kind::Number, Kind::String, Kind::Bool, Kind::Null]);
                let v = wrong_type(&self.nodes_value(i), &mut self.rng);
                to_vec(&self.replaced(i, v))
            }
            1 => {
                let i = self.pick(&[Kind::Number]);
                let v = odd_number(&mut self.rng);
                to_vec(&self.replaced(i, v))
            }
            2 => {
                let i = self.pick(&[Kind::Number]);
                let raw = RAW_NUMBERS[self.rng.random_range(0..RAW_NUMBERS.len())];
                self.spliced(i, raw.as_bytes())
            }
            3 => {
                let i = self.pick(&[Kind::String]);
                let v = odd_string(&mut self.rng);
                to_vec(&self.replaced(i, v))
            }
            4 => {
                let i = self.pick(&[Kind::String]);
                let raw = RAW_STRINGS[self.rng.random_range(0..RAW_STRINGS.len())];
                self.spliced(i, raw)
            }
            5 => self.remove_member(),
            6 => self.duplicate_member(),
            7 => self.rename_member(),
            8 => self.damage_array(),
            9 => {
                let i = self.pick(&[Kind::Object, Kind::Array]);
                let depth = self.rng.random_range(100..400);
                let inner = to_vec(&self.nodes_value(i));
                let raw = [b"[".repeat(depth), inner, b"]".repeat(depth)].concat();
                self.spliced(i, &raw)
            }
            10 => {
                let cut = self.rng.random_range(0..self.text.len().max(1));
                self.text[..cut].to_vec()
            }
            _ => mutate(&self.text, self.text.len(), &mut self.rng),
        }
    }

    fn nodes_value(&self, i: usize) -> Value {
        self.nodes[i]
            .0
            .iter()
            .fold(&self.doc, |v, step| match step {
                Step::Key(k) => &v[k.as_str()],
                Step::Index(i) => &v[*i],
            })
            .clone()
    }

    /// The parent object of member `i`, and the member's key.
    fn parent_and_key(&self, i: usize) -> (Vec<Step>, String) {
        let path = &self.nodes[i].0;
        let Some(Step::Key(k)) = path.last() else {
            unreachable!("members end in a key")
        };
        (path[..path.len() - 1].to_vec(), k.clone())
    }

    fn remove_member(&mut self) -> Vec<u8> {
        let Some(i) = self.pick_member() else {
            return Vec::new();
        };
        let (parent, key) = self.parent_and_key(i);
        let mut doc = self.doc.clone();
        if let Value::Object(m) = node_mut(&mut doc, &parent) {
            m.remove(&key);
        }
        serde_json::to_vec(&doc).expect("a Value serialises")
    }

    /// The key written twice: once with its value and once with another,
    /// in either order (parsers disagree on which one wins).
    fn duplicate_member(&mut self) -> Vec<u8> {
        let Some(i) = self.pick_member() else {
            return Vec::new();
        };
        let (parent, key) = self.parent_and_key(i);
        let mut doc = self.doc.clone();
        let node = node_mut(&mut doc, &parent);
        let Value::Object(m) = node.take() else {
            unreachable!("the parent of a member is an object")
        };
        let original = m[&key].clone();
        let other = match self.rng.random_range(0..3) {
            0 => original.clone(),
            1 => odd_number(&mut self.rng),
            _ => wrong_type(&original, &mut self.rng),
        };
        let member = |k: &str, v: &Value| {
            format!(
                "{}:{}",
                Value::from(k),
                serde_json::to_string(v).expect("a Value serialises")
            )
        };
        let mut parts: Vec<String> = m.iter().map(|(k, v)| member(k, v)).collect();
        let extra = member(&key, &other);
        if self.rng.random_bool(0.5) {
            parts.push(extra);
        } else {
            parts.insert(0, extra);
        }
        *node = Value::from(SPLICE);
        splice(&doc, format!("{{{}}}", parts.join(",")).as_bytes())
    }

    fn rename_member(&mut self) -> Vec<u8> {
        let Some(i) = self.pick_member() else {
            return Vec::new();
        };
        let (parent, key) = self.parent_and_key(i);
        let renamed = match self.rng.random_range(0..4) {
            0 => String::new(),
            1 => format!("{key}_"),
            2 => key.to_uppercase(),
            _ => key.chars().skip(1).collect(),
        };
        let mut doc = self.doc.clone();
        if let Value::Object(m) = node_mut(&mut doc, &parent)
            && let Some(v) = m.remove(&key)
        {
            m.insert(renamed, v);
        }
        serde_json::to_vec(&doc).expect("a Value serialises")
    }

    fn damage_array(&mut self) -> Vec<u8> {
        let i = self.pick(&[Kind::Array]);
        let mut doc = self.doc.clone();
        let node = node_mut(&mut doc, &self.nodes[i].0);
        if let Value::Array(xs) = node {
            match self.rng.random_range(0..5) {
                0 => xs.clear(),
                1 => {
                    if !xs.is_empty() {
                        xs.remove(self.rng.random_range(0..xs.len()));
                    }
                }
                2 => {
                    if let Some(x) = xs.first().cloned() {
                        xs.insert(0, x);
                    }
                }
                3 => xs.reverse(),
                _ => {
                    let copies = self.rng.random_range(2..50);
                    *xs = xs.iter().cycle().take(xs.len() * copies).cloned().collect();
                }
            }
        } else {
            *node = Value::Array(vec![]);
        }
        serde_json::to_vec(&doc).expect("a Value serialises")
    }
}

impl Iterator for JsonMutants {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if let Some(&cut) = self.cuts.get(self.next_cut) {
            self.next_cut += 1;
            return Some(self.text[..cut].to_vec());
        }
        Some(self.random_mutant())
    }
}

/// Length of a safetensors file's 8-byte prefix and JSON header together
/// (the offset of its tensor data). Panics if `bytes` is not a safetensors
/// file (a seed is a fixture).
pub fn safetensors_header_len(bytes: &[u8]) -> usize {
    let prefix: [u8; 8] = bytes[..8].try_into().expect("a safetensors seed");
    8 + usize::try_from(u64::from_le_bytes(prefix)).expect("a header that fits in memory")
}

/// The safetensors file `good` with its JSON header replaced by `header`,
/// the length prefix fixed to match.
pub fn with_safetensors_header(good: &[u8], header: &[u8]) -> Vec<u8> {
    let header_len = safetensors_header_len(good);
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(&good[header_len..]);
    out
}

/// Every offset where a safetensors file's structure changes: the length
/// prefix, each token of the header, each tensor's start and end.
pub fn safetensors_boundaries(good: &[u8]) -> Vec<usize> {
    let header_len = safetensors_header_len(good);
    let mut cuts: Vec<usize> = (0..=8).collect();
    cuts.extend(json_boundaries(&good[8..header_len]).iter().map(|c| c + 8));
    let header: Value = serde_json::from_slice(&good[8..header_len]).expect("a JSON header");
    for t in header.as_object().into_iter().flat_map(Map::values) {
        if let Some(offsets) = t.get("data_offsets").and_then(Value::as_array) {
            for o in offsets.iter().filter_map(Value::as_u64) {
                let at = header_len + o as usize;
                cuts.extend([at.saturating_sub(1), at, at + 1]);
            }
        }
    }
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

/// An endless, deterministic stream of mutants of the safetensors file
/// `good`: first the file cut at every boundary of its structure
/// ([`safetensors_boundaries`]), then byte-level damage ([`mutants`], 85%
/// in the header) and JSON-aware damage of the header ([`json_mutants`]
/// past its truncations, with the length prefix kept consistent) in turn.
pub fn safetensors_mutants(good: &[u8], seed: u64) -> impl Iterator<Item = Vec<u8>> + '_ {
    let header_len = safetensors_header_len(good);
    let header = &good[8..header_len];
    let headers = json_mutants(header, seed)
        .skip(json_boundaries(header).len().min(2000))
        .map(move |h| with_safetensors_header(good, &h));
    let truncated = safetensors_boundaries(good)
        .into_iter()
        .filter(move |&c| c < good.len())
        .map(move |c| good[..c].to_vec());
    truncated.chain(
        mutants(good, header_len, seed)
            .zip(headers)
            .flat_map(|(a, b)| [a, b]),
    )
}

/// Feeds mutants to a loader, one at a time, under `catch_unwind`; counts
/// those that loaded and those refused with an error, and the slowest.
pub struct MutantRun {
    what: String,
    seed: u64,
    start: Instant,
    slowest: Duration,
    /// Mutants the loader accepted.
    pub loaded: usize,
    /// Mutants the loader refused with an error.
    pub refused: usize,
}

impl MutantRun {
    /// A run over mutants of `what` made with `seed` (both for messages).
    pub fn new(what: &str, seed: u64) -> Self {
        Self {
            what: what.to_string(),
            seed,
            start: Instant::now(),
            slowest: Duration::ZERO,
            loaded: 0,
            refused: 0,
        }
    }

    /// Run `check` on mutant `i` (`bytes`): it returns whether the mutant
    /// loaded (`true`) or was refused with an error (`false`) and asserts
    /// whatever else holds. A panic fails the test naming the mutant.
    pub fn check(&mut self, i: usize, bytes: &[u8], check: impl FnOnce(&[u8]) -> bool) {
        let t = Instant::now();
        match catch_unwind(AssertUnwindSafe(|| check(bytes))) {
            Ok(true) => self.loaded += 1,
            Ok(false) => self.refused += 1,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| e.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(600)]);
                panic!(
                    "{} mutant {i} (seed {}, {} bytes) panicked: {msg}\nit starts: {shown:?}",
                    self.what,
                    self.seed,
                    bytes.len()
                );
            }
        }
        self.slowest = self.slowest.max(t.elapsed());
    }

    /// Print the tally and return the number of mutants run; fails when a
    /// single mutant took longer than `limit` (a near hang).
    pub fn finish(self, limit: Duration) -> usize {
        let n = self.loaded + self.refused;
        eprintln!(
            "{}: {n} mutants (seed {}) in {:.1?}: {} loaded, {} refused with an error; slowest {:.1?}",
            self.what,
            self.seed,
            self.start.elapsed(),
            self.loaded,
            self.refused,
            self.slowest
        );
        assert!(
            self.slowest <= limit,
            "{}: a mutant took {:?}, more than {limit:?}",
            self.what,
            self.slowest
        );
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_mutants_are_deterministic_and_varied() {
        let seed = br#"{"a": 1, "b": [1, 2, {"c": "x"}], "d": {"e": 2.5, "f": null}}"#;
        let a: Vec<_> = json_mutants(seed, 7).take(500).collect();
        let b: Vec<_> = json_mutants(seed, 7).take(500).collect();
        assert_eq!(a, b);
        let invalid = a
            .iter()
            .filter(|m| serde_json::from_slice::<Value>(m).is_err())
            .count();
        assert!(invalid > 50 && invalid < 450, "{invalid} of 500 invalid");
        assert!(a.iter().any(|m| std::str::from_utf8(m).is_err()));
        assert!(a.iter().any(|m| m.windows(3).any(|w| w == b"NaN")));
        assert!(
            a.iter()
                .any(|m| String::from_utf8_lossy(m).matches("\"a\":").count() == 2)
        );
    }

    #[test]
    fn boundaries_cover_every_token() {
        let cuts = json_boundaries(br#"{"k": [1, "a\"b"]}"#);
        assert_eq!(cuts, vec![0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18]);
        let t: Vec<_> = truncations(b"abc", &[0, 2, 9]).collect();
        assert_eq!(t, vec![b"".to_vec(), b"ab".to_vec()]);
    }
}
