#!/usr/bin/env bash
# Build lcut with CUDA for a GPU machine that has the NVIDIA driver and the
# CUDA 13 libraries but no Rust toolchain (and no network).
#
# - nvcc compiles candle's kernels to PTX for compute capability
#   $CUDA_COMPUTE_CAP (default 89: Debian's nvcc 11.8 knows no sm_90a, which
#   candle's kernel builder picks for 90; the driver compiles compute-8.9 PTX
#   for Hopper when a kernel is first loaded).
# - The binary is linked against the CUDA 13 runtime libraries from NVIDIA's
#   wheels on PyPI, so it asks for libcudart.so.13, libcublas.so.13 and
#   libcurand.so.10 by name; the GPU machine resolves them from its own CUDA 13
#   installation (scripts/gpu-check.sh finds them).
# - Output: dist/lcut-cuda (stripped) and dist/lcut-cuda.xz (about 8 MB; the
#   kernels' PTX is text and compresses well).
#
# Needs: cargo, python3 with pip, xz; root for apt-get if nvcc is missing.
set -euo pipefail

# The machine's own Debian sources: the deb822 file of a Debian 12+ image,
# else the one-line sources.list.
debian_sources_file() {
  if [ -e /etc/apt/sources.list.d/debian.sources ]; then
    echo /etc/apt/sources.list.d/debian.sources
  else
    echo /etc/apt/sources.list
  fi
}

# add_nonfree FILE: add the contrib and non-free components (nvcc is in
# non-free) to every Debian source in FILE, keeping its own URIs and suites
# (a mirror or a snapshot stays what it is). FILE is a deb822 `.sources`
# file (its `Components:` lines) or a one-line sources.list (its `deb` and
# `deb-src` lines). Components already there are not repeated; the file is
# rewritten through a temporary file beside it, so a failure leaves it whole.
add_nonfree() {
  local file=$1 tmp
  [ -f "$file" ] || { echo "add_nonfree: no sources file $file" >&2; return 1; }
  # deb822 stanzas list components on a `Components:` line; the one-line
  # format ends each `deb`/`deb-src` line with them
  local lines='^[ \t]*deb(-src)?[ \t]'
  [[ $file == *.sources ]] && lines='^Components:'
  tmp=$(mktemp "$file.XXXXXX")
  awk -v lines="$lines" '
    $0 ~ lines {
      n = split("contrib non-free", add, " ")
      for (i = 1; i <= n; i++)
        if ((" " $0 " ") !~ (" " add[i] " ")) $0 = $0 " " add[i]
    }
    { print }
  ' "$file" >"$tmp"
  chmod --reference="$file" "$tmp"
  mv "$tmp" "$file"
}

install_nvcc() {
  echo "== installing nvcc (Debian non-free nvidia-cuda-toolkit)"
  add_nonfree "$(debian_sources_file)"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nvidia-cuda-toolkit
}

main() {
  local root cache target lib w so
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cache=${LCUT_CUDA_CACHE:-$HOME/.cache/lcut-cuda13}
  target=${CARGO_TARGET_DIR:-$root/target/cuda}

  if ! command -v nvcc >/dev/null; then
    install_nvcc
  fi

  echo "== CUDA 13 libraries to link against (NVIDIA wheels)"
  mkdir -p "$cache/wheels" "$cache/root/lib"
  python3 -m pip download -q --no-deps --only-binary=:all: --dest "$cache/wheels" \
    'nvidia-cuda-runtime>=13,<14' 'nvidia-cublas>=13,<14' \
    'nvidia-cuda-nvrtc>=13,<14' 'nvidia-curand>=10.4,<11'
  for w in "$cache"/wheels/*.whl; do
    python3 -m zipfile -e "$w" "$cache/unpacked"
  done
  lib="$cache/unpacked/nvidia/cu13/lib"
  for so in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libcurand.so.10; do
    test -e "$lib/$so" || { echo "missing $so in the wheels" >&2; exit 1; }
    ln -sf "$lib/$so" "$cache/root/lib/$so"
    ln -sf "$so" "$cache/root/lib/${so%%.so*}.so"
  done

  echo "== cargo build --features cuda (target dir $target)"
  cd "$root"
  CUDA_HOME="$cache/root" \
  CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-89} \
  CUDARC_CUDA_VERSION=13000 \
    cargo build --release -p lcut-cli --features cuda --target-dir "$target"

  mkdir -p dist
  strip -o dist/lcut-cuda "$target/release/lcut"
  xz -T0 -6 -c dist/lcut-cuda > dist/lcut-cuda.xz.partial
  mv dist/lcut-cuda.xz.partial dist/lcut-cuda.xz
  echo "== dist/lcut-cuda.xz ($(du -h dist/lcut-cuda.xz | cut -f1)); it asks for:"
  readelf -d dist/lcut-cuda | grep NEEDED | sed 's/.*\[/  /; s/\]//'
}

# Sourced (scripts/build-cuda-test.sh), only the functions are defined.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  main "$@"
fi
