#!/usr/bin/env bash
# kind end-to-end test of the chart: build the image, create a kind cluster, install
# charts/topo-device-plugin with a simulated DGX A100 (8 GPUs), and check pods.
#
#   tests/e2e/kind/run.sh            # exit 0 pass, 1 fail, 77 skipped (reason printed)
#   KEEP_CLUSTER=1 tests/e2e/kind/run.sh   # leave the cluster for debugging
#
# Needs a Docker engine, kind, kubectl and helm. Where one is missing it prints
# "SKIP: <reason>" and exits 77 (tests/e2e/kind/test_kind.py turns that into a pytest skip).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
CLUSTER="${KIND_CLUSTER:-topo-dp-e2e}"
IMAGE="${KIND_IMAGE:-topo-device-plugin:e2e}"
NS=topo-system
T0=$(date +%s)

skip() { echo "SKIP: $*"; exit 77; }
stage() { echo "== $* (+$(( $(date +%s) - T0 ))s)"; }
fail() { echo "FAIL: $*"; exit 1; }

command -v docker >/dev/null 2>&1 || skip "the docker CLI is not installed"
docker info >/dev/null 2>&1 || skip "no Docker engine is reachable (\`docker info\` failed): kind needs one"
for tool in kind kubectl helm; do
  command -v "$tool" >/dev/null 2>&1 || skip "$tool is not installed"
done
[ -f "$ROOT/charts/topo-device-plugin/Chart.yaml" ] || fail "charts/topo-device-plugin is missing"

stage "build image $IMAGE"
docker build -t "$IMAGE" "$ROOT"

stage "kind cluster $CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --config "$HERE/kind-config.yaml" --wait 180s
fi
cleanup() {
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
export KUBECONFIG="${KUBECONFIG_FILE:-$(mktemp)}"
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG"
kind load docker-image "$IMAGE" --name "$CLUSTER"
docker pull busybox:1.36 >/dev/null && kind load docker-image busybox:1.36 --name "$CLUSTER"

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
sleep 5
phase=$(kubectl get pod toomany -o jsonpath='{.status.phase}')
[ "$phase" = Pending ] || fail "pod toomany is $phase, wanted Pending"
kubectl get events --field-selector involvedObject.name=toomany -o jsonpath='{.items[*].message}' | grep -q "Insufficient nvidia.com/gpu" \
  || fail "no 'Insufficient nvidia.com/gpu' event for pod toomany"

stage "kubelet restart: the plugin registers again"
docker exec "$WORKER" systemctl restart kubelet
sleep 5
wait_gpus 8

kubectl delete pod gpu2 toomany --wait=false
stage "PASS"
