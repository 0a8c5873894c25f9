#!/usr/bin/env bash
# Build NVIDIA's container toolkit programs (v1.20.2, go.mod) once and cache them (stripped); prints the
# binary's path. PROGRAM: nvidia-ctk (default) or nvidia-cdi-hook. Both use cgo (go-nvml dlopens
# libnvidia-ml.so.1). See scripts/go_build_cached.sh (exit codes: 0 ok, 3 no Go toolchain,
# 1 build failed).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PROGRAM="${1:-nvidia-ctk}"
case "$PROGRAM" in nvidia-ctk|nvidia-cdi-hook) ;; *) echo "usage: $0 [nvidia-ctk|nvidia-cdi-hook]" >&2; exit 2 ;; esac
CGO=1 STRIP=1 exec bash "$HERE/../../../scripts/go_build_cached.sh" "$HERE" "$PROGRAM" \
  "github.com/NVIDIA/nvidia-container-toolkit/cmd/$PROGRAM"
