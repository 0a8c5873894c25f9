#!/usr/bin/env bash
# MPS on a real GPU: NVIDIA's control daemon started by our code, two clients getting their limits
# (scripts/device/mps_check.py says what runs and what is checked).
#
#   bash scripts/device/mps_check.sh --offline [--out DIR]   # anywhere: the stand-in control program, no GPU
#   bash scripts/device/mps_check.sh [--out DIR]             # the GPU machine (device tool: --out $OUT)
#
# Needs on the GPU machine: nvidia-smi, nvidia-cuda-mps-control and libcuda.so.1 (the driver's), Python 3.
# It uses GPU 0, a private pipe directory under /tmp, changes no GPU setting (compute mode stays), and
# quits the daemon it started. Exit 0 passed, 1 failed, 2 usage. The last line is the verdict.
set -euo pipefail
cd "$(dirname "$0")/../.."
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --offline) args+=(--offline) ;;
    --out) args+=(--out "$2"); shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-}
if [ -z "$py" ]; then if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi; fi
exec timeout 300 "$py" scripts/device/mps_check.py "${args[@]}"
