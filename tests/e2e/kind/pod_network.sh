#!/usr/bin/env bash
# The pod network of a kind cluster made without kindnetd (which the module proxy does not
# serve, so the node image cannot carry it): on every node a bridge CNI config for the node's
# own .spec.podCIDR, and a route to every other node's podCIDR through that node's address.
# Then wait until every node is Ready. Runs where run.sh's podman path runs (KUBECONFIG set).
#
#   tests/e2e/kind/pod_network.sh CLUSTER
set -euo pipefail
CLUSTER="$1"
nodes=$(kind get nodes --name "$CLUSTER")
declare -A cidr ip
for n in $nodes; do
  for _ in $(seq 120); do
    cidr[$n]=$(kubectl get node "$n" -o jsonpath='{.spec.podCIDR}' 2>/dev/null || true)
    [ -n "${cidr[$n]}" ] && break
    sleep 1
  done
  [ -n "${cidr[$n]}" ] || { echo "FAIL: node $n got no podCIDR"; exit 1; }
  ip[$n]=$(kubectl get node "$n" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
done
for n in $nodes; do
  podman exec -i "$n" sh -c 'cat > /etc/cni/net.d/10-kind-bridge.conflist' <<CONF
{
  "cniVersion": "0.4.0",
  "name": "kind-bridge",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "${cidr[$n]}"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CONF
  for m in $nodes; do
    [ "$m" = "$n" ] || podman exec "$n" ip route replace "${cidr[$m]}" via "${ip[$m]}"
  done
  echo "node $n: pods in ${cidr[$n]} (address ${ip[$n]})"
done
kubectl wait --for=condition=Ready node --all --timeout=300s
