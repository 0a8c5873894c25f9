#!/usr/bin/env bash
# Build chart-decode (this directory's Go program) once and cache it.
#
#   tests/chart/decode/build.sh      # prints the path of the binary on stdout
#
# The binary is keyed by a hash of go.mod, go.sum and the Go sources, so an edit
# rebuilds it and an unchanged tree reuses it instantly. It lives in
# $TOPO_DP_CACHE_DIR/bin (default ~/.cache/topo-device-plugin/bin).
# Exit codes: 0 ok (path printed), 3 no Go toolchain, 1 build failed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${TOPO_DP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topo-device-plugin}"
BIN_DIR="$CACHE/bin"

log() { printf 'chart-decode build: %s\n' "$*" >&2; }

key="$(cd "$HERE" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)"
TARGET="$BIN_DIR/chart-decode-$key"
if [[ -x "$TARGET" ]]; then printf '%s\n' "$TARGET"; exit 0; fi

mkdir -p "$BIN_DIR"
exec 9>"$BIN_DIR/.chart-decode.lock"
flock 9
if [[ -x "$TARGET" ]]; then printf '%s\n' "$TARGET"; exit 0; fi

GO_BIN="${GO:-}"
if [[ -z "$GO_BIN" ]]; then
  if command -v go >/dev/null 2>&1; then GO_BIN="$(command -v go)"
  elif [[ -x /usr/local/go/bin/go ]]; then GO_BIN=/usr/local/go/bin/go
  fi
fi
if [[ -z "$GO_BIN" ]] || ! "$GO_BIN" version >/dev/null 2>&1; then
  log "no Go toolchain found (set GO=/path/to/go)"
  exit 3
fi

start=$(date +%s)
tmp="$TARGET.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# -mod=readonly: go.sum is committed; a missing entry is an error, not a silent update.
if ! (cd "$HERE" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath" \
      nice -n "${NICE:-15}" "$GO_BIN" build -o "$tmp" .) >&2; then
  log "go build failed"
  exit 1
fi
mv -f "$tmp" "$TARGET"
# Drop binaries of older source versions.
find "$BIN_DIR" -maxdepth 1 -name 'chart-decode-*' ! -name "chart-decode-$key" -type f -delete 2>/dev/null || true
log "built $TARGET in $(( $(date +%s) - start ))s"
printf '%s\n' "$TARGET"
