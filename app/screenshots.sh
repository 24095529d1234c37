#!/usr/bin/env bash
# Takes the README's screenshots of the real viewer under Xvfb.
#
#   apt-get install -y --no-install-recommends xvfb imagemagick xauth xdotool
#   app/screenshots.sh [MODEL_DIR] [PROMPTS_JSONL]
#
# MODEL_DIR defaults to the bundled model (fixtures/models/copy-full); the
# synthetic views use `lcut-report`'s demo report and the viewer's large
# synthetic trace. Writes docs/screenshots/*.png (1280x800).
set -euo pipefail
cd "$(dirname "$0")/.."

model="${1:-fixtures/models/copy-full}"
prompts="${2:-}"
out=docs/screenshots
mkdir -p "$out"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
export DISPLAY=:97

cargo build -q -p lcut-viewer
demo="$(mktemp -d)"
cargo run -q -p lcut-report --example demo -- "$demo" >/dev/null

Xvfb "$DISPLAY" -screen 0 1280x800x24 >/dev/null 2>&1 &
xvfb=$!
trap 'kill $xvfb 2>/dev/null || true' EXIT
sleep 2

# shot NAME SECONDS [viewer args...]: start the viewer, wait, capture, stop.
# HOVER=x,y moves the pointer there before the capture (default: a corner).
shot() {
  local name=$1 wait=$2
  shift 2
  ./target/debug/lcut-viewer --size 1280x800 "$@" >/dev/null 2>&1 &
  local pid=$!
  sleep "$wait"
  if [ -n "${CLICK:-}" ]; then
    xdotool mousemove ${CLICK/,/ } click 1
    sleep "${CLICK_WAIT:-5}"
  fi
  local hover=${HOVER:-1275,795}
  xdotool mousemove ${hover/,/ }
  sleep 1
  import -window root "$out/$name.png"
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "$out/$name.png"
}

HOVER=600,430 shot heatmaps-128k 10 --no-model --demo-large --screenshot-view heatmaps
shot curves 6 --no-model --report "$demo/report.json" --screenshot-view curves
shot sweep 6 --no-model --report "$demo/report.json" --screenshot-view sweep
if [ -d "$model" ]; then
  args=(--model "$model" --run --screenshot-view heatmaps)
  [ -n "$prompts" ] && args+=(--prompts "$prompts")
  HOVER=500,420 shot heatmaps-run 25 "${args[@]}"
  # The Generate button of the live view (at 1280x800).
  CLICK=606,157 CLICK_WAIT=8 shot live 8 --model "$model" --screenshot-view live
fi
