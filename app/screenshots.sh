#!/usr/bin/env bash
# Takes the README's screenshots of the real viewer under Xvfb.
#
#   apt-get install -y --no-install-recommends xvfb imagemagick xauth xdotool
#   app/screenshots.sh [MODEL] [PROMPTS_JSONL]
#
# MODEL is a model folder or a .gguf file (default: the bundled model,
# fixtures/models/copy-full); PROMPTS_JSONL the prompts of the diagnostic run
# (default: the bundled set). The README's shots are of the real model:
#
#   scripts/fetch-model.sh
#   app/screenshots.sh models/SmolLM2-135M-Instruct.Q4_1.gguf fixtures/prompts/smollm2.jsonl
#
#   (with LIVE_L_CUT=24 HEATMAP_HOVER=270,400 for the README's shots, and
#   LIVE_POLICY='slim:1/3@50%,2/3@25%+block:4+unit:2' for the live ones)
#
# The viewer is built in release. `heatmaps-128k` is the viewer's large
# synthetic trace. With a model, one diagnostic run (with the sweep) in the
# viewer gives `heatmaps-run`, `curves` and `sweep` (the tabs are clicked),
# then a live generation gives `live` (full, SPEED and the third policy,
# SlimInfer by default, with the SlimInfer run's existence map and score
# bars) and, scrolled down, `live-slim` (its active blocks per decode step
# and overlap curve); without one, `curves` and `sweep` show `lcut-report`'s
# demo report. Writes docs/screenshots/*.png (1280x800).
#
# Environment: LIVE_PROMPT, LIVE_TOKENS (most new tokens), LIVE_L_CUT
# (default: the run's recommendation, or the viewer's 3/4 of the depth when
# that is no cut) and LIVE_POLICY (the third policy; default the viewer's
# SlimInfer policy, empty for none) for the live shots; ONLY_LIVE=1 takes
# the live shots alone (no 128K trace, no diagnostic run); RUN_TIMEOUT (seconds, default 3600) for
# the run; HEATMAP_HOVER (x,y) where the pointer rests on the run's heatmaps
# (on SmolLM2, 270,400 is the access code of the first prompt at layer 20);
# HEADS_REPORT (a saved diagnose run) and HEADS_BUDGET take `heads`, the
# Heads view with the picks of that K/V budget (after the other shots, or
# alone with ONLY_HEADS=1);
# SHOTS_DIR (default docs/screenshots); CARGO_TARGET_DIR as cargo reads it.
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-fixtures/models/copy-full}"
prompts="${2:-}"
out="${SHOTS_DIR:-docs/screenshots}"
live_prompt="${LIVE_PROMPT:-Explain in two sentences why the sky is blue.}"
live_tokens="${LIVE_TOKENS:-64}"
run_timeout="${RUN_TIMEOUT:-3600}"
mkdir -p "$out"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
export DISPLAY=:97

cargo build -q --release -p lcut-viewer
viewer="${CARGO_TARGET_DIR:-target}/release/lcut-viewer"
tmp="$(mktemp -d)"

Xvfb "$DISPLAY" -screen 0 1280x800x24 >/dev/null 2>&1 &
xvfb=$!
pid=
trap 'kill $pid $xvfb 2>/dev/null || true' EXIT
sleep 2

# Tabs of the central panel (1280x800 window, no job running).
tab_curves=118,89
tab_sweep=308,89

# start [viewer args...]: start the viewer, its stdout in $tmp/viewer.log.
start() {
  "$viewer" --size 1280x800 "$@" >"$tmp/viewer.log" 2>"$tmp/viewer.err" &
  pid=$!
}

# wait_for SECONDS [REGEX]: wait for the viewer's line that a --run,
# --generate or --kv-budget job ended (or a line matching REGEX); fail on
# "failed:" or a timeout.
wait_for() {
  local limit=$1 i
  local ended=${2:-'^(run done|generation done|run stopped|generation stopped|heads done|failed)'}
  for ((i = 0; i < limit; i++)); do
    if grep -qE "$ended" "$tmp/viewer.log"; then
      if grep -q '^failed' "$tmp/viewer.log"; then
        cat "$tmp/viewer.log" >&2
        exit 1
      fi
      sleep 2
      return
    fi
    sleep 1
  done
  echo "the viewer did not finish within $limit s" >&2
  exit 1
}

# capture NAME [x,y]: rest the pointer at x,y (default: a corner), capture.
capture() {
  local hover=${2:-1275,795}
  xdotool mousemove ${hover/,/ }
  sleep 1
  import -window root "$out/$1.png"
  echo "$out/$1.png"
}

# click x,y: click there and let the frame settle.
click() {
  xdotool mousemove ${1/,/ } click 1
  sleep 2
}

stop() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pid=
}

# heads_shot: the Heads view of a saved diagnose run of MODEL (HEADS_REPORT:
# a report.json or its folder) with the picks of the plan for the K/V budget
# HEADS_BUDGET (default 0.75), as `heads`; then those picks run beside the
# full model and SPEED+BoS at equal K/V on the live prompt, as `heads-live`.
heads_shot() {
  local args=(--model "$model" --report "$HEADS_REPORT" --kv-budget "${HEADS_BUDGET:-0.75}")
  start "${args[@]}" --screenshot-view heads
  wait_for 300
  cat "$tmp/viewer.log"
  capture heads
  stop
  start "${args[@]}" --run-heads --live-prompt "$live_prompt" --live-max-new-tokens "$live_tokens"
  wait_for 1200 '^(generation done|generation stopped|failed)'
  cat "$tmp/viewer.log"
  capture heads-live
  stop
}

if [ -n "${ONLY_HEADS:-}" ]; then
  heads_shot
  exit 0
fi

only_live="${ONLY_LIVE:-}"
if [ -z "$only_live" ]; then
  start --no-model --demo-large --screenshot-view heatmaps
  sleep 10
  capture heatmaps-128k 600,430
  stop
fi

# live_shots [--l-cut N]: generate in the live view, capture `live`, then
# scroll down to the SlimInfer run's raster and overlap and capture
# `live-slim` (when there is a third policy).
live_shots() {
  local args=(--model "$model" --screenshot-view live --live-prompt "$live_prompt"
    --live-max-new-tokens "$live_tokens" --generate "$@")
  [ -n "${LIVE_POLICY+set}" ] && args+=(--live-policy "$LIVE_POLICY")
  start "${args[@]}"
  wait_for 1200
  cat "$tmp/viewer.log"
  capture live
  if [ "${LIVE_POLICY-x}" != "" ]; then
    xdotool mousemove 640 600
    for _ in 1 2 3 4 5 6 7 8 9 10; do xdotool click 5; done
    sleep 2
    capture live-slim 1275,795
  fi
  stop
}

if [ -n "$only_live" ]; then
  if [ -n "${LIVE_L_CUT:-}" ]; then live_shots --l-cut "$LIVE_L_CUT"; else live_shots; fi
elif [ -d "$model" ] || [ -f "$model" ]; then
  args=(--model "$model" --run --screenshot-view heatmaps)
  [ -n "$prompts" ] && args+=(--prompts "$prompts")
  start "${args[@]}"
  wait_for "$run_timeout"
  grep '^run done' "$tmp/viewer.log"
  capture heatmaps-run "${HEATMAP_HOVER:-500,420}"
  click "$tab_curves"
  capture curves
  click "$tab_sweep"
  capture sweep
  stop
  # The recommendation, unless it is no cut at all (L_cut = L).
  cut=$(sed -n 's/^run done: .*recommended L_cut \([0-9]*\) of \([0-9]*\)$/\1 \2/p' \
    "$tmp/viewer.log" | awk '$1 < $2 { print $1 }')
  cut=${LIVE_L_CUT:-$cut}
  if [ -n "$cut" ]; then live_shots --l-cut "$cut"; else live_shots; fi
else
  demo="$tmp/demo"
  cargo run -q --release -p lcut-report --example demo -- "$demo" >/dev/null
  start --no-model --report "$demo/report.json" --screenshot-view curves
  sleep 6
  capture curves
  stop
  start --no-model --report "$demo/report.json" --screenshot-view sweep
  sleep 6
  capture sweep
  stop
fi
if [ -n "${HEADS_REPORT:-}" ]; then heads_shot; fi
