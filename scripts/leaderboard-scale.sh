#!/usr/bin/env bash
# The leaderboard at scale: RULER at 4K with SAMPLES items of each of the 13
# tasks (650 at the default 50), every method at the four ratios, on one model,
# as two shards side by side (one thread each, each pinned to its own CPU).
#
#   scripts/leaderboard-scale.sh [MODEL] [SAMPLES]
#   scripts/leaderboard-scale.sh --save [MODEL] [SAMPLES]
#
# MODEL defaults to SmolLM2-135M-Instruct's Q4_1 file (scripts/fetch-model.sh);
# the runs go to runs/scale-<model>-<samples>/. The items are ordered sample by
# sample (every task's first item, then every task's second, ...), so a run
# stopped early still covers the tasks evenly. Each shard journals every item
# as it finishes: run the script again after an interruption and it resumes
# where each shard stopped, counting nothing twice. `lcut eval-merge` then
# joins the shards; with `--partial` it reads a run before it ends.
#
# A run longer than one sitting is carried in the repository: `--save` writes
# each shard's journal, xz-compressed, to results/scale-<model>-<samples>/
# (about 1 KB an item), and a later run on another machine starts each shard
# from there when its own journal holds fewer items. SHARDS (default "0 1")
# runs only the shards named, e.g. SHARDS=0 beside other work on the second CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
save=false
if [ "${1:-}" = "--save" ]; then
  save=true
  shift
fi
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
samples=${2:-50}
lcut=${LCUT:-target/release/lcut}
name=$(basename "$model" .gguf)
out=runs/scale-$name-$samples
kept=results/scale-$name-$samples
# lines of a journal (its header and one per item), 0 when there is none
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
if $save; then
  mkdir -p "$kept"
  for i in 0 1; do
    journal=$out/s$i/items.jsonl
    [ -f "$journal" ] || continue
    xz -9 -c "$journal" >"$kept/s$i.items.jsonl.xz.tmp"
    mv "$kept/s$i.items.jsonl.xz.tmp" "$kept/s$i.items.jsonl.xz"
    echo "saved shard $i: $(($(lines "$journal") - 1)) items to $kept/s$i.items.jsonl.xz"
  done
  exit 0
fi
mkdir -p "$out"
for i in 0 1; do
  saved=$kept/s$i.items.jsonl.xz
  journal=$out/s$i/items.jsonl
  if [ -f "$saved" ] && [ "$(xz -dc "$saved" | wc -l)" -gt "$(lines "$journal")" ]; then
    mkdir -p "$out/s$i"
    xz -dc "$saved" >"$journal.tmp"
    mv "$journal.tmp" "$journal"
    echo "shard $i starts from $saved: $(($(lines "$journal") - 1)) items"
  fi
done
suite=$out/suite.jsonl
if [ ! -f "$suite" ]; then
  "$lcut" suite --ruler 4k --model "$model" --samples "$samples" --out "$out/suite-by-task.jsonl"
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; \
    r.sort(key=lambda d: d['id'].rsplit('-',1)[1]); \
    open(sys.argv[2],'w').writelines(json.dumps(d)+'\n' for d in r)" \
    "$out/suite-by-task.jsonl" "$suite"
fi
P=full,speed+bos,slim,swiftkv+bos,streamingllm,snapkv,pyramidkv,knorm,tova,expected
shards=${SHARDS:-0 1}
echo "$(date -u +%FT%TZ) start shards $shards: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/wall.log"
for i in $shards; do
  RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1 taskset -c "$i" "$lcut" eval --model "$model" \
    --dtype q --suite "$suite" --policies "$P" --ratios 0.25,0.5,0.75,0.875 \
    --timing-items 0 --shard "$i/2" --out "$out/s$i" 2>"$out/s$i.log" &
done
wait
echo "$(date -u +%FT%TZ) end: load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/wall.log"
if [ "$shards" = "0 1" ]; then
  "$lcut" eval-merge "$out/s0" "$out/s1" --out "$out/merged"
fi
