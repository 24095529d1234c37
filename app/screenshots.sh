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
#   (with LIVE_L_CUT=24 HEATMAP_HOVER=270,400 for the README's shots)
#
# The viewer is built in release. `heatmaps-128k` is the viewer's large
# synthetic trace. With a model, one diagnostic run (with the sweep) in the
# viewer gives `heatmaps-run`, `curves` and `sweep` (the tabs are clicked),
# then a live generation gives `live`; without one, `curves` and `sweep` show
# `lcut-report`'s demo report. Writes docs/screenshots/*.png (1280x800).
#
# Environment: LIVE_PROMPT, LIVE_TOKENS (most new tokens) and LIVE_L_CUT
# (default: the run's recommendation, or the viewer's 3/4 of the depth when
# that is no cut) for the live shot; RUN_TIMEOUT (seconds, default 3600) for
# the run; HEATMAP_HOVER (x,y) where the pointer rests on the run's heatmaps
# (on SmolLM2, 270,400 is the access code of the first prompt at layer 20);
# SHOTS_DIR (default docs/screenshots).
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
viewer=./target/release/lcut-viewer
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

# wait_for SECONDS: wait for the viewer's line that a --run or --generate
# job ended; fail on "failed:" or a timeout.
wait_for() {
  local limit=$1 i
  for ((i = 0; i < limit; i++)); do
    if grep -qE '^(run done|generation done|run stopped|generation stopped|failed)' "$tmp/viewer.log"; then
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

start --no-model --demo-large --screenshot-view heatmaps
sleep 10
capture heatmaps-128k 600,430
stop

if [ -d "$model" ] || [ -f "$model" ]; then
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
  args=(--model "$model" --screenshot-view live --live-prompt "$live_prompt"
    --live-max-new-tokens "$live_tokens" --generate)
  [ -n "$cut" ] && args+=(--l-cut "$cut")
  start "${args[@]}"
  wait_for 1200
  cat "$tmp/viewer.log"
  capture live
  stop
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
