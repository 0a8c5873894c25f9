#!/usr/bin/env bash
# kind end-to-end test of the chart: build the image, create a kind cluster, install
# charts/topo-device-plugin with a simulated DGX A100 (8 GPUs), and check pods.
#
#   tests/e2e/kind/run.sh            # exit 0 pass, 1 fail, 77 skipped (reason printed)
#   KEEP_CLUSTER=1 tests/e2e/kind/run.sh   # leave the cluster for debugging (Docker only)
#   KIND_PODMAN=1 tests/e2e/kind/run.sh   # no Docker: build a node image here, run through podman
#   KIND_PODMAN=1 KIND_NODES=1 tests/e2e/kind/run.sh   # the same with one node (default 2, as kind-config.yaml)
#
# With a Docker engine (and kind, kubectl, helm installed) it runs on kind's own node image.
# Without one, with KIND_PODMAN=1 (as root, podman installed), it hands over to kind_cluster.py: that builds a
# node image here (node_image.py, cached), then runs this script again inside private
# namespaces with KIND_PROVIDER=podman (kind's podman provider, no registry, no pulls). Where
# neither works it prints "SKIP: <reason>" and exits 77 (test_kind.py turns that into a skip).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
CLUSTER="${KIND_CLUSTER:-topo-dp-e2e}"
PROVIDER="${KIND_PROVIDER:-}"
NS=topo-system
T0=$(date +%s)

skip() { echo "SKIP: $*"; exit 77; }
stage() { echo "== $* (+$(( $(date +%s) - T0 ))s)"; }
fail() { echo "FAIL: $*"; exit 1; }

if [ -z "$PROVIDER" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    PROVIDER=docker
  elif [ "${KIND_PODMAN:-0}" = 1 ]; then
    command -v podman >/dev/null 2>&1 || skip "KIND_PODMAN=1 but podman is not installed (Debian: podman netavark aardvark-dns)"
    [ "$(id -u)" = 0 ] || skip "KIND_PODMAN=1 needs root (rootful podman, mmdebstrap)"
    exec python3 "$HERE/kind_cluster.py" run
  elif ! command -v docker >/dev/null 2>&1; then
    skip "the docker CLI is not installed; KIND_PODMAN=1 builds a node image here and runs through podman instead (root, about 15 min cold)"
  else
    skip "no Docker engine is reachable (\`docker info\` failed); KIND_PODMAN=1 builds a node image here and runs through podman instead (root, about 15 min cold)"
  fi
fi
for tool in kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool is not installed"
done
[ -f "$ROOT/charts/topo-device-plugin/Chart.yaml" ] || fail "charts/topo-device-plugin is missing"

if [ "$PROVIDER" = docker ]; then
  IMAGE="${KIND_IMAGE:-topo-device-plugin:e2e}"
  node_exec() { docker exec "$@"; }
  stage "build image $IMAGE"
  docker build -t "$IMAGE" "$ROOT"
  stage "kind cluster $CLUSTER"
  if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    kind create cluster --name "$CLUSTER" --config "$HERE/kind-config.yaml" --wait 180s
  fi
else
  # Set by kind_cluster.py: the node image, the project's image as an OCI archive, busybox.
  IMAGE="$KIND_IMAGE"
  node_exec() { podman exec "$@"; }
  stage "kind cluster $CLUSTER (podman, $KIND_NODES node(s), node image $KIND_NODE_IMAGE)"
  kind create cluster --name "$CLUSTER" --config "$KIND_CONFIG" --image "$KIND_NODE_IMAGE" --retain
fi
cleanup() {
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
export KUBECONFIG="${KUBECONFIG_FILE:-$(mktemp)}"
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"
if [ "$PROVIDER" = docker ]; then
  kind load docker-image "$IMAGE" --name "$CLUSTER"
  docker pull busybox:1.36 >/dev/null && kind load docker-image busybox:1.36 --name "$CLUSTER"
else
  stage "pod network (a bridge per node, in place of kindnetd) and images"
  bash "$HERE/pod_network.sh" "$CLUSTER"
  kind load image-archive "$KIND_IMAGE_ARCHIVE" --name "$CLUSTER"
  kind load image-archive "$KIND_BUSYBOX_ARCHIVE" --name "$CLUSTER"
fi

stage "install the chart"
helm upgrade --install topo "$ROOT/charts/topo-device-plugin" -n "$NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set simulate=dgx-a100 \
  --set-string nodeSelector."topo-e2e/gpu-node"=true \
  --wait --timeout 180s

WORKER=$(kubectl get nodes -l topo-e2e/gpu-node=true -o jsonpath='{.items[0].metadata.name}')
gpus() { kubectl get node "$WORKER" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
wait_gpus() {
  for _ in $(seq 90); do [ "$(gpus)" = "$1" ] && return 0; sleep 2; done
  fail "node $WORKER allocatable nvidia.com/gpu is '$(gpus)', wanted $1"
}

stage "the node advertises 8 GPUs"
wait_gpus 8

stage "a pod asking for 2 GPUs runs and sees them"
kubectl apply -f "$HERE/pod-gpu2.yaml"
kubectl wait --for=jsonpath='{.status.phase}'=Succeeded pod/gpu2 --timeout=120s
line=$(kubectl logs gpu2)
echo "$line"
ids=${line#NVIDIA_VISIBLE_DEVICES=}
[ "$(echo "$ids" | tr ',' '\n' | grep -c .)" = 2 ] || fail "expected 2 device IDs, got '$ids'"

stage "a pod asking for 9 GPUs is not placed"
kubectl apply -f "$HERE/pod-toomany.yaml"
events() { kubectl get events --field-selector involvedObject.name=toomany -o jsonpath='{.items[*].message}'; }
for _ in $(seq 60); do events | grep -q "Insufficient nvidia.com/gpu" && break; sleep 2; done
events | grep -q "Insufficient nvidia.com/gpu" || fail "no 'Insufficient nvidia.com/gpu' event for pod toomany"
phase=$(kubectl get pod toomany -o jsonpath='{.status.phase}')
[ "$phase" = Pending ] || fail "pod toomany is $phase, wanted Pending"

stage "kubelet restart: the plugin registers again"
started() { node_exec "$WORKER" systemctl show kubelet -p ActiveEnterTimestampMonotonic --value; }
before=$(started)
node_exec "$WORKER" systemctl restart kubelet
for _ in $(seq 60); do
  [ "$(started)" != "$before" ] && [ "$(node_exec "$WORKER" systemctl is-active kubelet)" = active ] && break
  sleep 1
done
[ "$(started)" != "$before" ] || fail "the kubelet on $WORKER did not restart"
wait_gpus 8

kubectl delete pod gpu2 toomany --wait=false
stage "PASS"
