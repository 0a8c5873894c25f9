#!/usr/bin/env bash
# Build the go-gpuallocator driver (NVIDIA's go-gpuallocator v0.6.0 over go-nvml's NVML mock) once
# and cache it; prints the binary's path. go-nvml needs cgo (it loads libnvidia-ml.so.1 lazily, so
# nothing of NVIDIA's driver is needed to build or run it). See scripts/go_build_cached.sh
# (exit codes: 0 ok, 3 no Go toolchain, 1 build failed).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CGO=1 exec bash "$HERE/../../scripts/go_build_cached.sh" "$HERE" gpuallocator-real
