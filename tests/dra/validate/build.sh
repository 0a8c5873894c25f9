#!/usr/bin/env bash
# Build slice-validate (this directory's Go program: the Kubernetes 1.37 API server's
# ResourceSlice decoding and validation) once and cache it.
#
#   tests/dra/validate/build.sh      # prints the path of the binary on stdout
#
# The binary is keyed by a hash of go.mod, go.sum, the Go sources and the Go version, so
# an edit rebuilds it and an unchanged tree reuses it at once. It lives in
# $TOPO_DP_CACHE/bin (default ~/.cache/topo-device-plugin/bin); modules and build cache go
# to $TOPO_DP_CACHE/gomod and $TOPO_DP_CACHE/gobuild, shared with the other Go builds.
# Exit codes: 0 ok (path printed), 3 no Go toolchain, 1 build failed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${TOPO_DP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/topo-device-plugin}"
BIN_DIR="$CACHE/bin"

log() { printf 'slice-validate build: %s\n' "$*" >&2; }

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

key="$( (cd "$HERE" && cat go.mod go.sum ./*.go; "$GO_BIN" version) | sha256sum | cut -c1-16)"
TARGET="$BIN_DIR/slice-validate-$key"
if [[ -x "$TARGET" ]]; then printf '%s\n' "$TARGET"; exit 0; fi

mkdir -p "$BIN_DIR"
exec 9>"$BIN_DIR/.slice-validate.lock"
flock 9
if [[ -x "$TARGET" ]]; then printf '%s\n' "$TARGET"; exit 0; fi

start=$(date +%s)
tmp="$TARGET.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# -mod=readonly: go.sum is committed; a missing entry is an error, not a silent update.
if ! (cd "$HERE" && CGO_ENABLED=0 GOTOOLCHAIN=local GOMODCACHE="$CACHE/gomod" GOCACHE="$CACHE/gobuild" \
      GOFLAGS="${GOFLAGS:-} -mod=readonly -trimpath -buildvcs=false" \
      nice -n "${NICE:-15}" "$GO_BIN" build -o "$tmp" .) >&2; then
  log "go build failed"
  exit 1
fi
mv -f "$tmp" "$TARGET"
# Drop binaries of older source versions.
find "$BIN_DIR" -maxdepth 1 -name 'slice-validate-*' ! -name "slice-validate-$key" -type f -delete 2>/dev/null || true
log "built $TARGET in $(( $(date +%s) - start ))s"
printf '%s\n' "$TARGET"
