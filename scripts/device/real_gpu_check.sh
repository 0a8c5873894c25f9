#!/usr/bin/env bash
# One GPU node end to end with NVIDIA's parts in the loop (scripts/device/gpu_node_check.py says what runs).
#
#   scripts/device/real_gpu_check.sh pack                 # here: build and compress the parts into .device-bundle/
#   scripts/device/real_gpu_check.sh run [--simulated] [--gpus N] [--out DIR]
#
# `run` on the GPU machine (the device tool: carry [".device-bundle"], one command):
#     bash scripts/device/real_gpu_check.sh run --out $OUT
# unpacks the bundle into /tmp/topo-gpu-check, installs the wheels into /tmp/topo-gpu-check/site (no
# network there), then runs the check in private mount and network namespaces against the node's own
# driver. `--simulated` (here, root, after `scripts/kubelet_tests.sh prepare`): the same against a simulated
# DGX H100's driver root (our NVML shim, a fake nvidia-smi), parts from the local caches when there is no
# bundle. The last line printed is the verdict; DIR/gpu-check.json holds everything observed.
# Exit 0 passed, 1 failed, 2 usage.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmd=${1:-}; shift || true
mode=real gpus=1 out=/tmp/topo-gpu-check/out
while [ $# -gt 0 ]; do
  case "$1" in
    --simulated) mode=simulated ;;
    --gpus) gpus=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
py=${PYTHON:-}
if [ -z "$py" ]; then if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi; fi
W=/tmp/topo-gpu-check
t0=$(date +%s)
stamp() { echo "[real_gpu_check $(( $(date +%s) - t0 ))s] $*" >&2; }

case "$cmd" in
  pack) exec "$py" scripts/device/bundle.py pack .device-bundle ;;
  run) ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac

rm -rf "$W/bin" "$W/images" "$W/run"
mkdir -p "$W" "$out"
if [ -d .device-bundle ]; then
  stamp "unpacking .device-bundle"
  "$py" scripts/device/bundle.py unpack .device-bundle "$W"
  if [ -d "$W/wheels" ] && [ "$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != 3.12 ]; then
    stamp "the wheels are for Python 3.12 (the GPU machine's); $py is not: using its own packages"
  elif [ -d "$W/wheels" ]; then
    stamp "installing $(ls "$W/wheels" | wc -l) wheels into $W/site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$W/site" "$W"/wheels/*.whl
    export PYTHONPATH="$W/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
elif [ "$mode" = simulated ]; then
  stamp "no bundle: parts from the local caches"
  "$py" scripts/device/bundle.py locate "$W"
else
  echo "no .device-bundle here: run 'scripts/device/real_gpu_check.sh pack' first and carry it" >&2; exit 2
fi
[ "$mode" = real ] && { nvidia-smi -L >&2 || true; }
stamp "check ($mode)"
args=(scripts/device/gpu_node_check.py --mode "$mode" --workdir "$W/run" --bin "$W/bin" --images "$W/images"
      --gpus "$gpus" --python "$py" --out "$out/gpu-check.json")
rc=0
# The check makes its own namespaces (tests/e2e/cluster/sandbox.py): mount, network and UTS where this
# machine allows them; else a mount namespace only (the ports are free on a machine of its own).
if ! unshare --mount --net --uts --propagation private true 2>/dev/null; then
  stamp "no network namespace here; private mount namespace only"
  args+=(--no-private-network)
fi
"$py" "${args[@]}" || rc=$?
stamp "done (exit $rc)"
exit "$rc"
