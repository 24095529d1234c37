#!/usr/bin/env bash
# Checks build-cuda.sh's edit of the Debian sources on copies in a temporary
# folder (nothing under /etc is read or written): contrib and non-free are
# added to every source, the URIs and suites stay the machine's own, a second
# run adds nothing, and both the deb822 and the one-line format work.
set -euo pipefail
cd "$(dirname "$0")/.."
bash -n scripts/build-cuda.sh
# shellcheck source=build-cuda.sh
. scripts/build-cuda.sh

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "build-cuda-test: $*" >&2; exit 1; }

cat >"$tmp/debian.sources" <<'SRC'
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
cat >"$tmp/want.sources" <<'SRC'
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
chmod 644 "$tmp/debian.sources"
add_nonfree "$tmp/debian.sources"
diff -u "$tmp/want.sources" "$tmp/debian.sources" || fail "deb822 sources"
add_nonfree "$tmp/debian.sources"
diff -u "$tmp/want.sources" "$tmp/debian.sources" || fail "a second run changed the file"
[ "$(stat -c %a "$tmp/debian.sources")" = 644 ] || fail "the file's mode changed"

cat >"$tmp/sources.list" <<'SRC'
# the machine's mirror
deb http://mirror.example/debian bullseye main
deb-src http://mirror.example/debian bullseye main non-free-firmware
deb [arch=amd64] http://mirror.example/debian-security bullseye-security main non-free
SRC
cat >"$tmp/want.list" <<'SRC'
# the machine's mirror
deb http://mirror.example/debian bullseye main contrib non-free
deb-src http://mirror.example/debian bullseye main non-free-firmware contrib non-free
deb [arch=amd64] http://mirror.example/debian-security bullseye-security main non-free contrib
SRC
add_nonfree "$tmp/sources.list"
diff -u "$tmp/want.list" "$tmp/sources.list" || fail "one-line sources.list"

if add_nonfree "$tmp/missing.sources" 2>/dev/null; then fail "a missing file is not an error"; fi
[ -z "$(find "$tmp" -name '*.sources.*' -o -name 'sources.list.*')" ] || fail "temporary file left behind"
echo "build-cuda-test: ok"
