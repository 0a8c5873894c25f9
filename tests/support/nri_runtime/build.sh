#!/usr/bin/env bash
# Build tests/support/nri_runtime (containerd/nri v0.8.0's runtime side, pkg/adaptation) once and
# cache it; prints the binary's path. See scripts/go_build_cached.sh (exit codes: 0 ok, 3 no Go
# toolchain, 1 build failed).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
exec bash "$HERE/../../../scripts/go_build_cached.sh" "$HERE" nri-runtime
