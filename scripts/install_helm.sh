#!/usr/bin/env bash
# Build a real `helm` binary from its Go module at a pinned version and cache it.
#
#   scripts/install_helm.sh            # prints the path of the helm binary on stdout
#   HELM_VERSION=v3.21.4 scripts/install_helm.sh
#
# Why build from source: the project's machines reach the Go module proxy but not
# GitHub release downloads. `go install helm.sh/helm/v3/cmd/helm@<version>` fetches
# the exact module (checked against sum.golang.org by the go command) and builds it.
#
# The binary lands in $TOPO_DP_CACHE_DIR/bin (default ~/.cache/topo-device-plugin/bin) as
# helm-<version>, with a `helm` symlink next to it. A rerun with the binary present
# only runs `helm version` (well under a second). Concurrent runs serialise on a lock.
#
# Environment:
#   HELM_VERSION   pinned helm release (default below); must be a v3 tag
#   TOPO_DP_CACHE_DIR  cache root (default $XDG_CACHE_HOME/topo-device-plugin or ~/.cache/...)
#   GO             go binary (default: `go` on PATH, else /usr/local/go/bin/go)
# Exit codes: 0 ok (path printed), 3 no Go toolchain, 1 build failed.
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.21.4}"
CACHE="${TOPO_DP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topo-device-plugin}"
BIN_DIR="$CACHE/bin"
TARGET="$BIN_DIR/helm-$HELM_VERSION"
LINK="$BIN_DIR/helm"

log() { printf 'install_helm: %s\n' "$*" >&2; }

check() {
  # The binary must run and report the pinned version.
  [[ -x "$1" ]] || return 1
  local got
  got="$("$1" version --template '{{.Version}}' 2>/dev/null)" || return 1
  [[ "$got" == "$HELM_VERSION" ]]
}

finish() {
  ln -sfn "helm-$HELM_VERSION" "$LINK"
  printf '%s\n' "$TARGET"
  exit 0
}

# Fast path: no lock, no Go needed.
if check "$TARGET"; then finish; fi

mkdir -p "$BIN_DIR"
exec 9>"$BIN_DIR/.helm.lock"
flock 9
# Another process may have built it while we waited for the lock.
if check "$TARGET"; then finish; fi

GO_BIN="${GO:-}"
if [[ -z "$GO_BIN" ]]; then
  if command -v go >/dev/null 2>&1; then GO_BIN="$(command -v go)"
  elif [[ -x /usr/local/go/bin/go ]]; then GO_BIN=/usr/local/go/bin/go
  fi
fi
if [[ -z "$GO_BIN" ]] || ! "$GO_BIN" version >/dev/null 2>&1; then
  log "no Go toolchain found (set GO=/path/to/go); cannot build helm $HELM_VERSION"
  exit 3
fi

log "building helm $HELM_VERSION with $("$GO_BIN" version) (cold builds take minutes)"
start=$(date +%s)
tmp="$(mktemp -d "$BIN_DIR/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# CGO off: a static binary, as helm's own release builds do. The -X flags give
# `helm version` the real version instead of the module's placeholder.
if ! CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS="${GOFLAGS:-} -trimpath" nice -n "${NICE:-15}" \
    "$GO_BIN" install \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2; then
  log "go install of helm $HELM_VERSION failed"
  exit 1
fi
mv -f "$tmp/helm" "$TARGET"
if ! check "$TARGET"; then
  log "built $TARGET but it does not report $HELM_VERSION: $("$TARGET" version 2>&1 || true)"
  exit 1
fi
log "built $TARGET in $(( $(date +%s) - start ))s"
finish
