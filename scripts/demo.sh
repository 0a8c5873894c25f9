#!/usr/bin/env bash
# Install the plugin into .venv (editable, as scripts/test.sh does) and serve a built-in
# simulated DGX A100 to a kubelet stand-in.
# No GPU, no kubelet and no root needed. Extra arguments go to `topo-device-plugin demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/install_venv.sh
install_venv ""
exec .venv/bin/topo-device-plugin demo --simulate dgx-a100 "$@"
