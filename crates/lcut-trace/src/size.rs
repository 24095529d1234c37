//! Upper bounds on a [`PromptTrace`]'s size: as JSON, and in memory.
//!
//! As JSON:
//!
//! With L layers, H heads, T decode steps, B prompt bins, and strings (the id,
//! the prompt tokens, the generated tokens) of S bytes in all, N of them:
//!
//! ```text
//! bytes <= 2304 + 17 * (6*L*T*H + L*B + 2*(L + 1)) + 79*(L + 1)*T + 32*T + 21*(B + 1) + 6*S + 3*N
//! ```
//!
//! 17 bytes per float (at most 16 characters for an `f32`, or `null`, and a comma),
//! 79 per (hidden state, step) of the logit lens (four floats and a token id of
//! at most 11 characters), 32 per step for its token id and query position, 21
//! per bin edge, at most 6 bytes per string byte after JSON escaping plus quotes
//! and a comma, and 2304 for keys, punctuation, shapes and the scalar fields.
//! Prompt length enters only through B (at most `max_prompt_bins`) and the
//! prompt token strings. A mixture-of-experts model's routing adds
//! [`routing_size_bound`], a model with attention sinks `17*L*T*H + 128` for
//! the sink's share (one more `[L, T, H]` tensor), a model with layers
//! without attention rows `21*L + 64` for their indices.
//!
//! In memory (heap and struct):
//!
//! ```text
//! bytes <= 24*L*T*H + 4*L*B + 8*(B + 1) + 8*(L + 1) + 20*(L + 1)*T + 12*T + 24*N + S + 1280
//! ```
//!
//! six f32 tensors of `[L, T, H]`, the `[L, B]` prompt map, the bin edges,
//! two curvature series, the logit lens (four f32 tensors and the top token
//! ids, `[L + 1, T]`), an id and a position per step, N strings holding S
//! bytes of text in all (24 bytes each for the `String` itself), and 1280
//! for the struct and its vectors' headers; its routing adds
//! [`routing_memory_bound`], the sink's share `4*L*T*H`, the indices of
//! layers without attention rows 8 per entry held.

use crate::lens::LensTrace;
use crate::routing::RoutingTrace;
use crate::trace::PromptTrace;

/// Bytes the JSON of a trace's routing takes at most, for S sparse layers,
/// T steps, k experts per token and a compared policy's name of P bytes:
///
/// ```text
/// bytes <= 512 + 21*S + 34*S*T + 11*S*T*k + 6*P
/// ```
///
/// 21 per layer index, 17 per float (an entropy and an overlap per layer and
/// step), 11 per expert id (at most 10 digits and a comma), 6 per byte of the
/// policy's name after escaping, and 512 for keys, shapes and punctuation.
pub fn routing_size_bound(
    sparse_layers: usize,
    num_steps: usize,
    top_k: usize,
    policy_bytes: usize,
) -> usize {
    let (s, t, k) = (sparse_layers, num_steps, top_k);
    512 + 21 * s + 34 * s * t + 11 * s * t * k + 6 * policy_bytes
}

/// Bytes a trace's routing holds on the heap at most (sizes as
/// [`routing_size_bound`]): 8 per layer index, 4 per entropy, overlap and
/// expert id, the policy's name, and 64 for the overlap's struct.
///
/// ```text
/// bytes <= 64 + 8*S + 8*S*T + 4*S*T*k + P
/// ```
pub fn routing_memory_bound(
    sparse_layers: usize,
    num_steps: usize,
    top_k: usize,
    policy_bytes: usize,
) -> usize {
    let (s, t, k) = (sparse_layers, num_steps, top_k);
    64 + 8 * s + 8 * s * t + 4 * s * t * k + policy_bytes
}

/// The sizes [`routing_size_bound`] takes, of a trace's routing (its
/// vectors built to their length, as the engine builds them).
fn routing_sizes(r: &RoutingTrace, policy_bytes: fn(&str) -> usize) -> [usize; 4] {
    [
        r.layers.len(),
        r.num_steps(),
        r.top_k,
        r.overlap.as_ref().map_or(0, |o| policy_bytes(&o.policy)),
    ]
}

/// The bound above, for the given sizes.
pub fn trace_size_bound(
    num_layers: usize,
    num_heads: usize,
    num_steps: usize,
    num_bins: usize,
    string_bytes: usize,
    num_strings: usize,
) -> usize {
    let (l, h, t, b) = (num_layers, num_heads, num_steps, num_bins);
    2304 + 17 * (6 * l * t * h + l * b + 2 * (l + 1))
        + 79 * (l + 1) * t
        + 32 * t
        + 21 * (b + 1)
        + 6 * string_bytes
        + 3 * num_strings
}

/// The in-memory bound above, for the given sizes.
pub fn trace_memory_bound(
    num_layers: usize,
    num_heads: usize,
    num_steps: usize,
    num_bins: usize,
    string_bytes: usize,
    num_strings: usize,
) -> usize {
    let (l, h, t, b) = (num_layers, num_heads, num_steps, num_bins);
    24 * l * t * h
        + 4 * l * b
        + 8 * (b + 1)
        + 8 * (l + 1)
        + 20 * (l + 1) * t
        + 12 * t
        + 24 * num_strings
        + string_bytes
        + 1280
}

impl PromptTrace {
    /// Bytes and number of the trace's strings (id, prompt and generated tokens).
    fn strings(&self) -> (usize, usize) {
        std::iter::once(&self.id)
            .chain(&self.prompt_tokens)
            .chain(&self.generated)
            .fold((0, 0), |(b, n), s| (b + s.len(), n + 1))
    }

    /// Floats of the sink's share, where the trace holds it.
    fn sink_floats(&self) -> usize {
        self.sink.as_ref().map_or(0, |s| s.data().len())
    }

    /// [`trace_size_bound`] for this trace's sizes and strings, and
    /// [`routing_size_bound`] for its routing, and the sink's share.
    pub fn size_bound(&self) -> usize {
        let (bytes, count) = self.strings();
        let sink = self
            .sink
            .as_ref()
            .map_or(0, |_| 17 * self.sink_floats() + 128);
        let routing = self.routing.as_ref().map_or(0, |r| {
            let [s, t, k, p] = routing_sizes(r, str::len);
            routing_size_bound(s, t, k, p)
        });
        let split = match self.state_split_layers.is_empty() {
            true => 0,
            false => 21 * self.state_split_layers.len() + 64,
        };
        trace_size_bound(
            self.num_layers,
            self.num_heads,
            self.num_steps(),
            self.num_bins(),
            bytes,
            count,
        ) + routing
            + sink
            + split
    }

    /// The bytes this trace holds now: its struct, its arrays' elements,
    /// its vectors' capacity and its strings (a `String` of 24 bytes each
    /// plus its text's capacity); what [`PromptTrace::memory_bound`] bounds.
    pub fn held_bytes(&self) -> usize {
        let strings =
            |v: &Vec<String>| 24 * v.capacity() + v.iter().map(String::capacity).sum::<usize>();
        let tensors: usize = self
            .phase_tensors()
            .iter()
            .chain([&&self.prefill_entropy])
            .map(|x| 4 * x.data().len())
            .sum::<usize>()
            + 4 * self.sink_floats();
        std::mem::size_of::<Self>()
            + self.id.capacity()
            + strings(&self.prompt_tokens)
            + strings(&self.generated)
            + 4 * self.generated_ids.capacity()
            + 8 * self.query_positions.capacity()
            + tensors
            + 4 * self.prompt_attention.data().len()
            + 8 * self.bin_edges.capacity()
            + 4 * (self.curvature_prompt.0.capacity() + self.curvature_generated.0.capacity())
            + self.lens.as_ref().map_or(0, LensTrace::heap_bytes)
            + self.routing.as_ref().map_or(0, RoutingTrace::heap_bytes)
            + 8 * self.state_split_layers.capacity()
    }

    /// [`trace_memory_bound`] for this trace's sizes and strings (S the
    /// strings' capacity, which may exceed their text's length),
    /// [`routing_memory_bound`] for its routing, and the sink's share.
    pub fn memory_bound(&self) -> usize {
        let (bytes, count) = std::iter::once(&self.id)
            .chain(&self.prompt_tokens)
            .chain(&self.generated)
            .fold((0, 0), |(b, n), s| (b + s.capacity(), n + 1));
        let routing = self.routing.as_ref().map_or(0, |r| {
            let [s, t, k, _] = routing_sizes(r, str::len);
            let p = r.overlap.as_ref().map_or(0, |o| o.policy.capacity());
            routing_memory_bound(s, t, k, p)
        });
        trace_memory_bound(
            self.num_layers,
            self.num_heads,
            self.num_steps(),
            self.num_bins(),
            bytes,
            count,
        ) + routing
            + 4 * self.sink_floats()
            + 8 * self.state_split_layers.capacity()
    }
}

#[cfg(test)]
mod tests {
    use crate::lens::LensTrace;
    use crate::routing::{RoutingOverlap, RoutingTrace};
    use crate::tensor::{Tensor2, Tensor3};
    use crate::trace::{PromptTrace, TraceHeader};

    /// The longest f32 text serde_json writes (14 characters).
    const WIDE: f32 = -1.175_494_4e-38;

    fn worst_case(
        prompt_len: usize,
        tokens: bool,
        l: usize,
        h: usize,
        t: usize,
        b: usize,
    ) -> PromptTrace {
        let header = TraceHeader {
            index: usize::MAX,
            id: "\u{1}\"x\\".repeat(4),
            prompt_tokens: if tokens {
                (0..prompt_len).map(|i| format!("\n tok{i}\u{7}")).collect()
            } else {
                vec![]
            },
            prompt_len,
            decode_start: prompt_len - 1,
            anchor_len: 1,
        };
        let mut tr = PromptTrace::zeroed(header, l, h, t, b);
        for tensor in [
            &mut tr.bos,
            &mut tr.anchor,
            &mut tr.prefill,
            &mut tr.decode,
            &mut tr.self_mass,
            &mut tr.prefill_entropy,
        ] {
            *tensor = Tensor3::filled([l, t, h], WIDE);
        }
        tr.prompt_attention.view_mut().fill(WIDE);
        tr.curvature_prompt.fill(WIDE);
        tr.curvature_generated.fill(WIDE);
        let mut lens = LensTrace::empty(l + 1, t);
        for x in [
            &mut lens.logprob,
            &mut lens.rank,
            &mut lens.top1,
            &mut lens.kl,
        ] {
            *x = Tensor2::filled([l + 1, t], WIDE);
        }
        lens.top_ids.fill(u32::MAX);
        tr.lens = Some(lens);
        tr.routing = Some(worst_routing(l, t));
        tr.sink = Some(Tensor3::filled([l, t, h], WIDE));
        tr.generated = (0..t).map(|_| "\u{0}\u{0}".to_string()).collect();
        tr.generated_ids = vec![u32::MAX; t];
        tr.query_positions = (0..t).map(|k| usize::MAX - t + k).collect();
        tr
    }

    /// Routing at every layer, 8 experts per token of 4_000_000_000 (the
    /// widest ids), every float at its widest, compared under a policy.
    fn worst_routing(l: usize, t: usize) -> RoutingTrace {
        let k = 8;
        let experts = (0..l * t)
            .flat_map(|_| (0..k).map(|j| 3_999_999_999 - j as u32))
            .collect();
        RoutingTrace {
            num_experts: 4_000_000_000,
            top_k: k,
            layers: (0..l).collect(),
            entropy: Tensor2::filled([l, t], WIDE),
            experts,
            overlap: Some(RoutingOverlap {
                policy: "speed:3+bos+heads:\u{1}\"dir/heads.json".into(),
                overlap: Tensor2::filled([l, t], WIDE),
            }),
        }
    }

    /// (prompt length, prompt token strings kept, layers, heads, steps,
    /// prompt bins) of the worst-case traces the bounds are held to.
    const WORST_CASES: [(usize, bool, usize, usize, usize, usize); 4] = [
        (10, true, 2, 2, 3, 64),
        (5000, true, 8, 4, 16, 64),
        (200_000, false, 32, 32, 8, 128),
        (2, true, 1, 1, 0, 2),
    ];

    #[test]
    fn serialized_size_is_within_the_bound() {
        for (p, tokens, l, h, t, b) in WORST_CASES {
            let tr = worst_case(p, tokens, l, h, t, b);
            let size = serde_json::to_vec(&tr).unwrap().len();
            let bound = tr.size_bound();
            assert!(
                size <= bound,
                "size {size} > bound {bound} for {:?}",
                (p, l, h, t, b)
            );
            if l * t * h >= 1000 {
                // The bound is not vacuous: within 25% of a worst-case trace.
                assert!(bound * 4 <= size * 5, "bound {bound} far above {size}");
            }
        }
    }

    /// What a trace holds in memory is within its bound, and the bound is
    /// not loose where the per-step records dominate.
    #[test]
    fn held_memory_is_within_the_bound() {
        for (p, tokens, l, h, t, b) in WORST_CASES {
            let tr = worst_case(p, tokens, l, h, t, b);
            let (held, bound) = (tr.held_bytes(), tr.memory_bound());
            assert!(
                held <= bound,
                "held {held} > bound {bound} for {:?}",
                (p, l, h, t, b)
            );
            if l * t * h >= 1000 {
                assert!(bound * 10 <= held * 11, "bound {bound} far above {held}");
            }
        }
    }

    #[test]
    fn size_does_not_grow_with_prompt_length_without_tokens() {
        let short = serde_json::to_vec(&worst_case(100, false, 4, 4, 8, 32))
            .unwrap()
            .len();
        let long = serde_json::to_vec(&worst_case(1_000_000, false, 4, 4, 8, 32))
            .unwrap()
            .len();
        // Only the digits of a few numbers (prompt length, bin edges) differ.
        assert!(long.abs_diff(short) < 32 * 8, "{short} vs {long}");
    }
}
