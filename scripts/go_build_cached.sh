#!/usr/bin/env bash
# Build a test-support Go program (a directory with go.mod, go.sum and *.go) once and cache it.
#
#   scripts/go_build_cached.sh DIR NAME [PACKAGE]    # prints the path of the binary on stdout
#
# PACKAGE (default `.`, DIR's own main package) builds a program of a module DIR's go.mod
# requires, at the version go.mod pins (a `//go:build tools` file in DIR imports it, so
# `go mod tidy` records its dependencies in go.sum).
#
# The binary is keyed by a hash of DIR's go.mod, go.sum and Go sources, so an edit rebuilds it
# and an unchanged tree reuses it at once. Binary, Go module cache and Go build cache live under
# $TOPO_DP_CACHE_DIR (default ~/.cache/topo-device-plugin: bin/, gomod/, gobuild/, the same caches
# the kubelet builds use). go.sum is committed: the build runs with -mod=readonly.
# CGO=1 in the environment builds with cgo (a program that dlopens a C library, e.g. nvidia-ctk
# through go-nvml); the default is a static, cgo-free binary. STRIP=1 leaves out the symbol table
# and debug information (-ldflags=-s; scripts/device/bundle.py, whose transfer is size-limited).
# Exit codes: 0 ok (path printed), 3 no Go toolchain, 1 build failed, 2 usage.
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 || ! -f "$1/go.mod" ]]; then
  echo "usage: $0 DIR NAME [PACKAGE]   (DIR holds go.mod)" >&2
  exit 2
fi
DIR="$(cd "$1" && pwd)"
NAME="$2"
PACKAGE="${3:-.}"
CGO="${CGO:-0}"
CACHE="${TOPO_DP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topo-device-plugin}"
BIN_DIR="$CACHE/bin"

log() { printf '%s build: %s\n' "$NAME" "$*" >&2; }

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

# The key covers the sources and the Go version, so an edit or a new toolchain rebuilds.
key="$( (cd "$DIR" && cat go.mod go.sum ./*.go; "$GO_BIN" version; echo "$PACKAGE"; [[ "$CGO" = 0 ]] || echo "cgo=$CGO"; [[ -z "${STRIP:-}" ]] || echo "strip") | sha256sum | cut -c1-16)"
TARGET="$BIN_DIR/$NAME-$key"
if [[ -x "$TARGET" ]]; then printf '%s\n' "$TARGET"; exit 0; fi

mkdir -p "$BIN_DIR"
exec 9>"$BIN_DIR/.$NAME.lock"
flock 9
if [[ -x "$TARGET" ]]; then printf '%s\n' "$TARGET"; exit 0; fi

start=$(date +%s)
tmp="$TARGET.tmp.$$"
trap 'rm -f "$tmp"' EXIT
if ! (cd "$DIR" && CGO_ENABLED="$CGO" GOTOOLCHAIN=local GOMODCACHE="$CACHE/gomod" GOCACHE="$CACHE/gobuild" \
      GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath -buildvcs=false${STRIP:+ -ldflags=-s}" \
      nice -n "${NICE:-15}" "$GO_BIN" build -o "$tmp" "$PACKAGE") >&2; then
  log "go build failed"
  exit 1
fi
mv -f "$tmp" "$TARGET"
# Drop binaries of older source versions.
find "$BIN_DIR" -maxdepth 1 -name "$NAME-*" ! -name "$NAME-$key" -type f -delete 2>/dev/null || true
log "built $TARGET in $(( $(date +%s) - start ))s"
printf '%s\n' "$TARGET"
