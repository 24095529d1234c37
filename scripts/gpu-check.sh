#!/usr/bin/env bash
# On a GPU machine, from the repository root, with dist/lcut-cuda.xz from
# scripts/build-cuda.sh: GPU parity against the transformers reference cases
# (f32, and bf16 next to transformers' own bf16 logits), then the
# long-context benchmark of a random-weight Llama-3.1-8B-shaped model, full
# vs SPEED (L_cut 24 of 32, BoS anchor).
#
#   scripts/gpu-check.sh [OUT_DIR] [STEP...]
#
# STEP is `parity` (f32 and bf16; in bf16 `lcut parity` also holds the fused
# attention kernel to the CPU's exact attention), `parity16` (bf16 next to the
# CPU's bf16 transformers logits, and f16: the 16-bit paths the fused kernel
# runs, without starting PyTorch), `diagnose` (the bundled
# model's diagnostics on the GPU against the CPU, f32,
# scripts/compare_reports.py), `bench:LENGTHS` (e.g. bench:1k,8k,32k) or
# `baseline:LENGTHS` (the same with the fused attention turned off,
# LCUT_FUSED_ATTENTION=0: the materialised attention, for a ratio in the
# same call), `families` (the mixture-of-experts and newest-layout reference
# cases, fixtures/oracle/moe and fixtures/oracle/layouts, in f32 against
# transformers; in bf16 and f16 their figures only, since routing near-ties
# move those cases past the dense bounds on the CPU too, fixtures/oracle/README.md;
# `families:f32` or `families:bf16,f16` for some of them)
# or `synth:SHAPE:LAYERS:LENGTHS` (`lcut synth` writes SHAPE cut to LAYERS
# layers in bf16, kept in /tmp for later steps, then the same bench on it: e.g.
# synth:qwen3-30b-a3b:8:1k,8k), or `unstacked:SHAPE:LAYERS:LENGTHS`, the same with the experts
# unstacked (LCUT_STACKED_EXPERTS=0: each chosen expert runs its own kernels), for a ratio in
# the same call, or `rowwise:SHAPE:LAYERS:LENGTHS`, the same with Qwen3.5's linear layers
# run row by row on the host (LCUT_LINEAR_CHUNK=0) instead of in chunks on the GPU, for a
# ratio in the same call.
# The default is
# `parity diagnose bench:1k,8k,32k baseline:8k bench:64k bench:128k`; each
# bench step writes its own JSON, so a step cut short leaves the ones before.
# OUT_DIR (default gpu-results) receives log.txt, nvidia-smi.txt,
# gpu-memory.csv (the driver's memory in use, every 200 ms), parity-f32.json,
# parity-bf16.json, bench-<lengths>.json, baseline-<lengths>.json,
# families-<folder>-<dtype>.json, synth-<shape>-<layers>l-<lengths>.json and
# unstacked-<shape>-<layers>l-<lengths>.json and rowwise-<shape>-<layers>l-<lengths>.json.
set -uo pipefail
out=${1:-gpu-results}
shift || true
steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then
  steps=(parity diagnose "bench:1k,8k,32k" "baseline:8k" "bench:64k" "bench:128k")
fi
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1

bin=dist/lcut-cuda
if [ ! -x "$bin" ]; then
  if command -v xz >/dev/null; then
    xz -dc dist/lcut-cuda.xz > "$bin"
  else
    python3 -c 'import lzma, shutil; shutil.copyfileobj(lzma.open("dist/lcut-cuda.xz"), open("dist/lcut-cuda", "wb"))'
  fi
  chmod +x "$bin"
fi

# Where this machine keeps libcuda.so.1 (the driver's), libcudart.so.13,
# libcublas.so.13, libcublasLt.so.13 and libcurand.so.10: a CUDA toolkit, the
# driver's folder, or NVIDIA's wheels in Python's site-packages (beside PyTorch).
cuda_root=${CUDA_HOME:-/usr/local/cuda}
candidates=("$cuda_root/lib64" "$cuda_root/lib" /usr/local/cuda/targets/x86_64-linux/lib
            /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu)
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
if [ -n "$site" ]; then candidates+=("$site"/nvidia/cu13/lib "$site"/nvidia/*/lib); fi
libdirs=""
for so in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
  found=""
  for d in "${candidates[@]}"; do
    if [ -e "$d/$so" ]; then found=$d; break; fi
  done
  if [ -z "$found" ]; then
    hit=$(find / -xdev -name "$so" -print -quit 2>/dev/null)
    if [ -n "$hit" ]; then found=$(dirname "$hit"); fi
  fi
  if [ -z "$found" ]; then
    echo "no $so on this machine: lcut-cuda needs the NVIDIA driver and the CUDA 13 runtime libraries" >&2
    exit 1
  fi
  case ":$libdirs:" in *":$found:"*) ;; *) libdirs="${libdirs:+$libdirs:}$found" ;; esac
done
echo "CUDA libraries from: $libdirs"
# only lcut gets them: python3 (used below) must keep its own libraries
lcut() { LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin" "$@"; }
if LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$bin" | grep 'not found'; then
  exit 1
fi

nvidia-smi > "$out/nvidia-smi.txt" 2>&1
# the driver's view of the GPU's memory while the steps run
nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu \
  --format=csv -lms 200 > "$out/gpu-memory.csv" 2>/dev/null &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
status=0

parity() {
  echo "== parity on cuda in f32"
  lcut parity --device cuda --dtype f32 --json "$out/parity-f32.json" || status=1
  # transformers' own bf16 logits on this GPU when python3 has torch and
  # transformers; else the ones made on the CPU (fixtures/oracle/bf16)
  local hf=fixtures/oracle/bf16
  if ! python3 -c 'import torch, transformers' 2>/dev/null; then
    echo "(python3 has no torch and transformers: using the CPU's bf16 logits)"
  elif python3 fixtures/oracle/hf_dtype_logits.py fixtures/oracle /tmp/lcut-hf-bf16 bfloat16 cuda \
       > /tmp/lcut-hf-bf16.log 2>&1; then
    hf=/tmp/lcut-hf-bf16
  else
    tail -5 /tmp/lcut-hf-bf16.log
    echo "(transformers in bf16 on the GPU failed, above: using the CPU's bf16 logits)"
  fi
  echo "== parity on cuda in bf16, next to transformers' bf16 logits from $hf"
  lcut parity --device cuda --dtype bf16 --transformers-logits "$hf" \
    --json "$out/parity-bf16.json" || status=1
}

parity16() {
  echo "== parity on cuda in bf16 (transformers' bf16 logits from the CPU) and f16"
  lcut parity --device cuda --dtype bf16 --transformers-logits fixtures/oracle/bf16 \
    --json "$out/parity-bf16.json" || status=1
  lcut parity --device cuda --dtype f16 --json "$out/parity-f16.json" || status=1
}

diagnose() {
  echo "== diagnose the bundled model on cuda and on the cpu (f32), then compare"
  lcut diagnose --device cpu --max-new-tokens 16 --out /tmp/lcut-diag-cpu >/dev/null &&
    lcut diagnose --device cuda --max-new-tokens 16 --out /tmp/lcut-diag-cuda &&
    python3 scripts/compare_reports.py /tmp/lcut-diag-cpu/report.json \
      /tmp/lcut-diag-cuda/report.json 1e-3 || status=1
}

# bench NAME LENGTHS: the Llama-3.1-8B shape, full and SPEED 24/32, into NAME-<lengths>.json
bench() {
  echo "== $1 at $2 ($(date -u +%T))"
  lcut bench --device cuda --dtype bf16 \
    --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 \
    --policies full,speed:24+bos --prompt-lengths "$2" --new-tokens 128 \
    --prefill-chunk 2048 --json "$out/$1-${2//,/_}.json" || status=1
}

# families DTYPE...: the family cases in each DTYPE (f32 passes or fails the step)
families() {
  local folder dtype
  for dtype in "$@"; do
    for folder in moe layouts; do
      if [ "$dtype" = f32 ]; then
        echo "== parity of fixtures/oracle/$folder on cuda in f32 ($(date -u +%T))"
        lcut parity --device cuda --dtype f32 --cases "fixtures/oracle/$folder" \
          --json "$out/families-$folder-f32.json" || status=1
      else
        echo "== figures of fixtures/oracle/$folder on cuda in $dtype (not a pass/fail step)"
        lcut parity --device cuda --dtype "$dtype" --cases "fixtures/oracle/$folder" \
          --json "$out/families-$folder-$dtype.json" || true
      fi
    done
  done
}

# synth NAME SHAPE LAYERS LENGTHS: a random-weight SHAPE of LAYERS layers in bf16, full and SPEED
# at 3/4, into NAME-<shape>-<layers>l-<lengths>.json; the model is kept in /tmp for the next step
# or call that asks for it (another build's)
synth() {
  local name=$1
  shift
  local dir=/tmp/lcut-synth-$1-$2
  if [ ! -d "$dir" ]; then
    echo "== synth $1 with $2 layers ($(date -u +%T))"
    rm -rf "$dir.part"
    lcut synth --shape "$1" --layers "$2" --format safetensors-bf16 --out "$dir.part" &&
      mv "$dir.part" "$dir" || { status=1; return; }
  fi
  echo "== bench $1 ($2 layers) at $3 ($(date -u +%T))"
  lcut bench --device cuda --dtype bf16 --model "$dir" \
    --policies full,speed:3/4+bos --prompt-lengths "$3" --new-tokens 64 \
    --prefill-chunk 2048 --json "$out/$name-$1-$2l-${3//,/_}.json" || status=1
}

for step in "${steps[@]}"; do
  case $step in
    parity) parity ;;
    parity16) parity16 ;;
    families) families f32 bf16 f16 ;;
    families:*) IFS=, read -r -a dtypes <<< "${step#families:}"; families "${dtypes[@]}" ;;
    synth:*)
      IFS=: read -r _ shape layers lengths <<< "$step"
      synth synth "$shape" "$layers" "$lengths"
      ;;
    unstacked:*)
      IFS=: read -r _ shape layers lengths <<< "$step"
      export LCUT_STACKED_EXPERTS=0
      synth unstacked "$shape" "$layers" "$lengths"
      unset LCUT_STACKED_EXPERTS
      ;;
    rowwise:*)
      IFS=: read -r _ shape layers lengths <<< "$step"
      export LCUT_LINEAR_CHUNK=0
      synth rowwise "$shape" "$layers" "$lengths"
      unset LCUT_LINEAR_CHUNK
      ;;
    diagnose) diagnose ;;
    bench:*) bench bench "${step#bench:}" ;;
    baseline:*)
      export LCUT_FUSED_ATTENTION=0
      bench baseline "${step#baseline:}"
      unset LCUT_FUSED_ATTENTION
      ;;
    *) echo "unknown step $step (parity, parity16, diagnose, families[:DTYPES], bench:LENGTHS, baseline:LENGTHS, synth:SHAPE:LAYERS:LENGTHS, unstacked:SHAPE:LAYERS:LENGTHS, rowwise:SHAPE:LAYERS:LENGTHS)"; status=1 ;;
  esac
done
exit $status
