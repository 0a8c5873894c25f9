#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run the whole suite.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/daemon -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
stage() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

stage "python environment"
. scripts/install_venv.sh
install_venv test

# The real-kubelet stages: Debian containerd/runc, Go modules, the kubelet harness, the kubelet
# binary and local OCI images, then the local cluster's stages: the control plane, helm and the
# project's image built with buildah (all cached under ~/.cache/topo-device-plugin; prints stage
# times). The strict manifest decoder and hadolint are built by the chart/image tests themselves.
stage "kubelet harness, kubelet, containerd, control plane, image (cached)"
bash scripts/kubelet_tests.sh prepare

stage "tests"
exec .venv/bin/python -m pytest "$@"
