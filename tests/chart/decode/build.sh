#!/usr/bin/env bash
# Build chart-decode (this directory's Go program) once and cache it; prints the binary's path.
# See scripts/go_build_cached.sh (exit codes: 0 ok, 3 no Go toolchain, 1 build failed).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$HERE/../../../scripts/go_build_cached.sh" "$HERE" chart-decode
