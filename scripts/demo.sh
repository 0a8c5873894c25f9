#!/usr/bin/env bash
# Install the plugin into .venv (editable, as scripts/test.sh does) and serve a built-in
# simulated DGX A100 to a kubelet stand-in.
# No GPU, no kubelet and no root needed. Extra arguments go to `topo-device-plugin demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/topo-device-plugin demo --simulate dgx-a100 "$@"
