#!/usr/bin/env bash
# Build cdi-validate (this directory's Go program: the CDI project's own validation library,
# current and v0.5.4) once and cache it; prints the binary's path. See scripts/go_build_cached.sh.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec bash "$HERE/../../../scripts/go_build_cached.sh" "$HERE" cdi-validate
