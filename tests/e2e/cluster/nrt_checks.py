"""The NodeResourceTopology checks on the real cluster (test_chart_lifecycle.py runs them on its cluster).

What they prove with the real API server, kubelet and chart: the daemon's object appears owned by the Node,
its `available` follows the kubelet's pod-resources as pods take and release GPUs, and the chart's
ValidatingAdmissionPolicy (evaluated by the API server) refuses a token bound to another node every write of
this node's NRT object, ResourceSlices and labels, while a token bound to this node may write them.
"""

from __future__ import annotations

import json
from typing import Any

from cluster import API, NODE, Cluster
from sandbox import NODE_IP, wait_for
from workloads import NAMESPACE, RELEASE

NRT = "noderesourcetopologies.topology.node.k8s.io"
SA = f"{RELEASE}-topo-device-plugin"
OTHER = "topo-other-node"


def nrt_values(c: Cluster) -> dict[str, Any]:
    """Chart values that turn the publisher on (the kubelet's config file of this cluster) and the Node label.
    No kube-proxy in this cluster: the pods reach the API server at the node's address (in the serving
    certificate's names) instead of the `kubernetes` Service's, as tests/e2e/dra does."""
    return {"nrt": {"enabled": True, "kubeletConfig": str(c.w / "kubelet.yaml")}, "fabricLabels": {"node": True},
            "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                         {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]}


def published(c: Cluster) -> dict[str, Any] | None:
    proc = c.kubectl("get", NRT, NODE, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def available(obj: dict[str, Any]) -> dict[tuple[str, str], int]:
    return {(z["name"], r["name"]): int(r["available"]) for z in obj.get("zones", ()) for r in z.get("resources", ())}


def expected_available(c: Cluster, disc: dict[str, dict[str, list[int]]]) -> dict[tuple[str, str], int]:
    """What pod-resources says is free, per zone and resource: every advertised device not held by a container."""
    pr = c.podresources()
    held = {(res, dev) for p in pr.get("pods") or [] for ctr in p.get("containers") or []
            for res, devs in (ctr.get("devices") or {}).items() for dev in devs}
    out: dict[tuple[str, str], int] = {}
    for res, devs in disc.items():
        for dev, numa in devs.items():
            key = (f"node-{numa[0]}", res)
            out[key] = out.get(key, 0) + ((res, dev) not in held)
    return out


def matches_pod_resources(c: Cluster, disc: dict[str, dict[str, list[int]]]) -> bool:
    obj = published(c)
    return obj is not None and available(obj) == expected_available(c, disc)


def wait_matching(c: Cluster, disc: dict[str, dict[str, list[int]]], what: str) -> dict[str, Any]:
    wait_for(what, lambda: matches_pod_resources(c, disc), 120)
    obj = published(c)
    assert obj is not None
    return obj


# ---- tokens bound to a node ---------------------------------------------------------------------------------


def node_token(c: Cluster, node: str) -> str:
    """The daemon's service account's token bound to a Node object: the API server puts the node's name into
    the token's user info (authentication.kubernetes.io/node-name), as for the pod's own token."""
    return c.kubectl("create", "token", SA, "-n", NAMESPACE, "--bound-object-kind", "Node",
                     "--bound-object-name", node, "--duration", "10m").stdout.strip()


def as_token(c: Cluster, token: str, *args: str, input: str | None = None):
    return c.sb.sh(c.bins["kubectl"], f"--server={API}", f"--certificate-authority={c.pki.ca_cert}",
                   f"--token={token}", *args, check=False, input=input, env={"HOME": str(c.home)})


def make_other_node(c: Cluster) -> None:
    """A second Node object (no kubelet behind it): what a token of another node's daemon is bound to. Tainted so
    that the DaemonSet makes no pod for it (the chart's pods tolerate only their own taints)."""
    c.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": OTHER, "labels": {"topo-e2e": "other"}},
             "spec": {"taints": [{"key": "topo-e2e/no-kubelet", "effect": "NoSchedule"}]}})


def grant_slices(c: Cluster) -> None:
    """RBAC on ResourceSlices for the daemon's account (device-plugin mode has none), so what refuses another
    node's slice below is the admission policy, not RBAC."""
    c.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "topo-e2e-slices"},
             "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                        "verbs": ["get", "create", "update", "delete"]}]})
    c.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "topo-e2e-slices"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "topo-e2e-slices"},
             "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": NAMESPACE}]})


def slice_for(node: str, name: str) -> str:
    return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
                       "spec": {"driver": "topo.dev", "nodeName": node,
                                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                                "devices": [{"name": "probe"}]}})
