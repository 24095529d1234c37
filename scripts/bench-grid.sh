#!/usr/bin/env bash
# Time the leaderboard grid of one RULER item against the full model alone,
# two builds of lcut interleaved, so that what one prompt run per item saves
# is measured in the same session on the same machine.
#
#   scripts/bench-grid.sh BASE_LCUT NEW_LCUT [ROUNDS]
#
# Uses models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-model.sh) and
# the first RULER-4K item lcut writes for it. Each round runs: the grid
# (every method at the four ratios) with the base build, then with the new
# one, then the full model alone with each. Two threads pinned to CPUs 0-1;
# every line says the load it ran at. Compare the journals of the last
# round's grids (runs/bench-grid-*/items.jsonl) for equal results.
set -euo pipefail
base=${1:?base lcut binary}; new=${2:?new lcut binary}; rounds=${3:-2}
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
P=full,speed+bos,slim,swiftkv+bos,streamingllm,snapkv,pyramidkv,knorm,tova,expected
mkdir -p runs
"$new" suite --ruler 4k --model "$M" --samples 1 --tasks niah_single_1 --out runs/bench-grid.jsonl >/dev/null
export RAYON_NUM_THREADS=2 CANDLE_NUM_THREADS=2
isa=$(grep -q -w avx512f /proc/cpuinfo && echo avx512f || { grep -q -w avx2 /proc/cpuinfo && echo avx2; } || echo portable)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) ($isa)"
timed() { # label command...
  local s e; s=$(date +%s.%N); "${@:2}" >/dev/null 2>&1; e=$(date +%s.%N)
  echo "$1 $(echo "$e - $s" | bc) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
}
for round in $(seq 1 "$rounds"); do
  for which in base new; do
    bin=$base; [ "$which" = new ] && bin=$new
    rm -rf "runs/bench-grid-$which"
    timed "round $round $which grid" taskset -c 0,1 "$bin" eval --model "$M" --dtype q \
      --suite runs/bench-grid.jsonl --policies "$P" --ratios 0.25,0.5,0.75,0.875 \
      --timing-items 0 --out "runs/bench-grid-$which"
  done
  for which in base new; do
    bin=$base; [ "$which" = new ] && bin=$new
    timed "round $round $which full alone" taskset -c 0,1 "$bin" eval --model "$M" --dtype q \
      --suite runs/bench-grid.jsonl --policies full
  done
done
