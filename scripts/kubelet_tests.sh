#!/usr/bin/env bash
# The real-kubelet tests: build everything they need (cached), then run them.
#
#   scripts/kubelet_tests.sh prepare        # Debian packages, Go modules, harness, kubelet, images
#   scripts/kubelet_tests.sh test [ARGS]    # pytest tests/kubelet tests/e2e [ARGS]
#   scripts/kubelet_tests.sh [all] [ARGS]   # both (default)
#
# Caches live under $TOPO_DP_CACHE_DIR (default ~/.cache/topo-device-plugin): Go modules,
# Go's build cache, and the built binaries/images keyed by their inputs. A warm rerun
# builds nothing. Each stage prints its wall time. Needs root (apt-get, mount namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
case "$mode" in prepare|test|all) shift || true ;; *) mode=all ;; esac

python=${PYTHON:-python3}
TIMES=()
stage_start() { STAGE="$1"; STAGE_T0=$(date +%s.%N); printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }
stage_end() {
  local dt; dt=$(awk -v a="$STAGE_T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  TIMES+=("$(printf '%-28s %7ss' "$STAGE" "$dt")")
  printf '== %s: %ss\n' "$STAGE" "$dt"
}
summary() { [ ${#TIMES[@]} -gt 0 ] || return 0; printf '\n== kubelet_tests.sh stage times\n'; printf '   %s\n' "${TIMES[@]}"; }
trap summary EXIT

venv() {
  if [ ! -x .venv/bin/python ]; then
    stage_start "python environment"
    "$python" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
    stage_end
  fi
}

debian_packages() {
  stage_start "debian packages"
  local missing=() pkg
  # linux-libc-dev: the kernel's uapi headers; tests/netattach checks our RDMA netlink messages against
  # /usr/include/rdma/rdma_netlink.h. iproute2: `ip`, which the netattach tests check results with.
  for pkg in containerd runc busybox-static util-linux libudev1 linux-libc-dev iproute2; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    # Install only; never start the packaged containerd service (the tests run their own).
    local guard=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    [ -n "$guard" ] && rm -f /usr/sbin/policy-rc.d
  else
    echo "already installed: containerd runc busybox-static util-linux libudev1 linux-libc-dev iproute2"
  fi
  containerd --version; runc --version | head -1
  stage_end
}

build() {
  stage_start "$1"
  local rc=0
  .venv/bin/python tests/kubelet/kubelet_build.py "$2" || rc=$?
  stage_end
  # 3: a tool cannot exist here (no Go): the tests then skip and say why, except in CI.
  if [ "$rc" = 3 ] && [ "${TOPO_DP_REQUIRE_KUBELET_E2E:-}" != 1 ]; then return 0; fi
  return "$rc"
}

prepare() {
  venv
  debian_packages
  # Two Kubernetes lines (tests/kubelet/k8s_versions.json), sharing Go's module and build caches.
  build "go modules (both lines)" modules
  build "build harness (current)" harness:current
  build "build harness (race)" harness:race
  build "build kubelet (current)" kubelet
  build "e2e images" images
  cluster_prepare
  dra_prepare
  toolkit_prepare
}

# ---- NVIDIA's container toolkit (tests/support/nvidia_ctk, 1.20.2): nvidia-ctk and nvidia-cdi-hook --------
# tests/cdi/test_toolkit_specs.py and scripts/device/real_gpu_check.sh use them. Exit 3: no Go toolchain
# (skip, except in CI).
toolkit_prepare() {
  local program
  for program in nvidia-ctk nvidia-cdi-hook; do
    stage_start "toolkit: $program"
    local rc=0
    bash tests/support/nvidia_ctk/build.sh "$program" >/dev/null || rc=$?
    stage_end
    if [ "$rc" = 3 ] && [ "${TOPO_DP_REQUIRE_CDI_TOOLS:-}" != 1 ]; then return 0; fi
    [ "$rc" = 0 ] || exit "$rc"
  done
}

# ---- DRA e2e (tests/e2e/dra): containerd v2 and its runc shim, built from their Go module --------
# Debian's containerd 1.6.20 cannot inject CDI devices. Exit 3: no Go toolchain (skip, except in CI).
dra_prepare() {
  local program
  for program in containerd containerd-shim; do
    stage_start "dra: $program v2"
    local rc=0
    bash scripts/go_build_cached.sh "tests/e2e/dra/$program" "$program-v2" >/dev/null || rc=$?
    stage_end
    if [ "$rc" = 3 ] && [ "${TOPO_DP_REQUIRE_KUBELET_E2E:-}" != 1 ]; then return 0; fi
    [ "$rc" = 0 ] || exit "$rc"
  done
}

# ---- local cluster e2e (tests/e2e/cluster) and the built image (tests/image) --------------------
# Debian packages (buildah, mmdebstrap, CNI plugins), the control plane built from the kubelet's
# Kubernetes release, helm, and the project's image; all cached. Exit 3 from the builder means a
# piece cannot exist here (e.g. not root): outside CI the tests then skip and say why.
cluster_prepare() {
  local step
  for step in packages controlplane kubelet helm image; do
    stage_start "cluster: $step"
    local rc=0
    .venv/bin/python tests/e2e/cluster/cluster_build.py "$step" || rc=$?
    stage_end
    if [ "$rc" = 3 ] && [ "${TOPO_DP_REQUIRE_KUBELET_E2E:-}" != 1 ]; then
      echo "cluster: $step is not available here; tests/e2e/cluster and the built-image test will skip"; return 0
    fi
    [ "$rc" = 0 ] || exit "$rc"
  done
  # scheduler-plugins' topology-aware scheduler (tests/e2e/cluster/topo_scheduler.py), from its Go module.
  stage_start "cluster: topo-scheduler"
  local rc=0
  bash scripts/go_build_cached.sh tests/e2e/cluster/topo_scheduler topo-scheduler >/dev/null || rc=$?
  stage_end
  if [ "$rc" = 3 ] && [ "${TOPO_DP_REQUIRE_KUBELET_E2E:-}" != 1 ]; then return 0; fi
  [ "$rc" = 0 ] || exit "$rc"
}

run_tests() {
  venv
  stage_start "pytest tests/kubelet tests/e2e"
  # Under this script the e2e must not skip for a missing containerd: prepare installs it.
  TOPO_DP_REQUIRE_KUBELET_E2E=${TOPO_DP_REQUIRE_KUBELET_E2E:-1} \
    .venv/bin/python -m pytest tests/kubelet tests/e2e "$@"
  stage_end
}

case "$mode" in
  prepare) prepare ;;
  test) run_tests "$@" ;;
  all) prepare; run_tests "$@" ;;
esac
