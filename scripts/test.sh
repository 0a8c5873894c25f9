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

# ruff and mypy (scripts/lint.sh). A finding does not stop the tests (a 20-minute run is not thrown away for
# a lint slip), but the run fails, and says why as its last line.
stage "static checks: ruff, mypy"
lint=0
bash scripts/lint.sh || lint=$?

# Three workers (pytest-xdist), one test file per unit of work (module-scoped fixtures such as a cluster per
# module stay in one process), the long files first (tests/conftest.py): on 2 cores most of the e2e's time is
# waiting on a kubelet or an API server, which the other workers fill. TOPO_DP_TEST_WORKERS=0 runs in one process.
# The kind e2e (tests/e2e/kind) runs through kind's podman provider where no Docker engine exists: it builds its
# node image here (cached). KIND_PODMAN=0 leaves it to a Docker engine (skipped without one).
export KIND_PODMAN="${KIND_PODMAN:-1}"
stage "tests"
rc=0
workers="${TOPO_DP_TEST_WORKERS:-3}"
if [ "$workers" = 0 ]; then dist=(); else dist=(-n "$workers" --dist loadfile --no-loadscope-reorder); fi
.venv/bin/python -m pytest "${dist[@]}" "$@" || rc=$?
if [ "$lint" -ne 0 ]; then
  echo "FAILED: static checks (ruff/mypy): see the \"static checks\" stage above" >&2
  [ "$rc" -ne 0 ] || rc=$lint
fi
exit "$rc"
