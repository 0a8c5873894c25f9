"""The chart next to the GPU Operator: following its `nvidia.com/gpu.deploy.*` node labels.

What a user notices is on which nodes the DaemonSet keeps a pod while NVIDIA's mig-manager
repartitions a node (or the driver manager reloads the driver) and after. The rendered pod
spec's `nodeSelector` and required node affinity decide that; each test renders the real chart
with `helm template` and evaluates those two fields against node label sets the way the
scheduler and the DaemonSet controller do (Kubernetes' label-selector operators), through the
label values NVIDIA's tools write. Those values, and the order they are written in, come from
NVIDIA's sources (docs/gpu-operator.md names the files and commits): mig-manager (mig-parted
v0.15.0, pkg/mig/reconfigure/reconfigure.go) pauses a label unless it is `false`, and restores
`true` unless it was `false`; the driver manager (k8s-driver-manager v0.12.0,
cmd/driver-manager/main.go) pauses `true` and appends its pause to other values. No GPU Operator
runs here; that the DaemonSet controller removes and re-creates a pod when a node's labels stop
or start matching is Kubernetes' behaviour, not checked by these tests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chart.test_chart import CHART, RELEASE, Rendered, decode, render, run_helm

DEVICE_PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
CLIENT = "nvidia.com/gpu.deploy.client"
MIG_PAUSE = "paused-for-mig-change"
DRIVER_PAUSE = "paused-for-driver-upgrade"


# ---- NVIDIA's label transitions, restated from their sources -----------------------------------


def mig_manager_pause(value: str | None) -> str:
    """mig-parted's maybeSetPaused: every value but `false` (an absent label included) is paused."""
    return "false" if value == "false" else MIG_PAUSE


def mig_manager_restore(value: str | None) -> str:
    """mig-parted's maybeSetTrue, applied to the value read before the pause."""
    return "false" if value == "false" else "true"


def driver_manager_pause(value: str) -> str:
    """k8s-driver-manager's maybeSetPaused."""
    if value in ("", "false") or DRIVER_PAUSE in value:
        return value
    return DRIVER_PAUSE if value == "true" else f"{value}_{DRIVER_PAUSE}"


def mig_repartition(labels: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The node's labels while mig-manager reconfigures MIG, and after it restored them.

    The device-plugin label is always written; the client label only when the node has it."""
    before = dict(labels)
    during, after = dict(labels), dict(labels)
    during[DEVICE_PLUGIN] = mig_manager_pause(before.get(DEVICE_PLUGIN))
    after[DEVICE_PLUGIN] = mig_manager_restore(before.get(DEVICE_PLUGIN))
    if before.get(CLIENT):
        during[CLIENT] = mig_manager_pause(before[CLIENT])
        after[CLIENT] = mig_manager_restore(before[CLIENT])
    return during, after


# ---- where the rendered pod may run ----------------------------------------------------------------


def _requirement_matches(req: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = req["key"], req["operator"], req.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values  # NotIn matches an absent label
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not handled by this test")


def runs_on(rendered: Rendered, labels: dict[str, str]) -> bool:
    """Whether the DaemonSet's pod template selects a node with these labels (nodeSelector AND
    any one required node-selector term, as the DaemonSet controller evaluates it)."""
    spec = rendered.pod_spec
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(all(_requirement_matches(r, labels) for r in term.get("matchExpressions", []))
               for term in required["nodeSelectorTerms"])


@pytest.fixture(scope="module")
def default(helm, tmp_path_factory) -> Rendered:
    return render(helm, tmp_path_factory.mktemp("gpu-operator-default"), {})


@pytest.fixture(scope="module")
def off(helm, tmp_path_factory) -> Rendered:
    return render(helm, tmp_path_factory.mktemp("gpu-operator-off"),
                  {"gpuOperator": {"honourDeployLabels": False}})


@pytest.fixture(scope="module")
def client_selector(helm, tmp_path_factory) -> Rendered:
    return render(helm, tmp_path_factory.mktemp("gpu-operator-client"),
                  {"gpuOperator": {"gpuClientNodeSelector": True}})


# A GPU node under a ClusterPolicy (GPU Operator v26.7.0 labels both), one where the user keeps
# NVIDIA's plugin off by hand, and nodes from before v26.7.0 (no client label) or without the
# operator at all.
NODES = {
    "operator v26.7": {DEVICE_PLUGIN: "true", CLIENT: "true"},
    "operator v26.7, NVIDIA's plugin off on this node": {DEVICE_PLUGIN: "false", CLIENT: "true"},
    "operator before v26.7": {DEVICE_PLUGIN: "true"},
    "no GPU Operator": {},
}


# ---- honourDeployLabels (on by default) -----------------------------------------------------------


def test_default_pod_has_the_pause_affinity_on_both_labels(default):
    terms = default.pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    pauses = [MIG_PAUSE, DRIVER_PAUSE, f"{MIG_PAUSE}_{DRIVER_PAUSE}"]
    assert terms == [{"matchExpressions": [
        {"key": DEVICE_PLUGIN, "operator": "NotIn", "values": pauses},
        {"key": CLIENT, "operator": "NotIn", "values": pauses},
    ]}]
    assert CLIENT not in (default.pod_spec.get("nodeSelector") or {})


@pytest.mark.parametrize("node", NODES)
def test_pod_leaves_while_mig_manager_repartitions_and_returns_after(default, node):
    labels = NODES[node]
    assert runs_on(default, labels)
    during, after = mig_repartition(labels)
    assert not runs_on(default, during), during
    if labels.get(DEVICE_PLUGIN) == "false":
        assert during[DEVICE_PLUGIN] == "false"  # mig-manager keeps `false`: the client label carries the pause
    assert runs_on(default, after), after


@pytest.mark.parametrize("node", [n for n in NODES if NODES[n]])
def test_pod_leaves_while_the_driver_manager_reloads_the_driver(default, node):
    labels = NODES[node]
    during = {k: driver_manager_pause(v) for k, v in labels.items()}
    assert not runs_on(default, during), during
    during_mig = {k: driver_manager_pause(v) for k, v in mig_repartition(labels)[0].items()}
    assert not runs_on(default, during_mig), during_mig


@pytest.mark.parametrize("value", ["true", "false", ""])
def test_not_paused_values_keep_the_pod(default, value):
    assert runs_on(default, {DEVICE_PLUGIN: value, CLIENT: value})


def test_off_renders_no_affinity_and_the_pod_stays_through_a_pause(off):
    assert "affinity" not in off.pod_spec
    during, _ = mig_repartition(NODES["operator v26.7"])
    assert runs_on(off, during)


def test_user_affinity_terms_each_get_the_requirements(helm, tmp_path):
    own: list[dict[str, Any]] = [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
                                 {"matchExpressions": [{"key": "example.com/pool", "operator": "Exists"}]}]
    preferred = [{"weight": 1, "preference": {"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}}]
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "other"}}}]}
    affinity: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": own},
                         "preferredDuringSchedulingIgnoredDuringExecution": preferred},
        "podAntiAffinity": anti,
    }
    r = render(helm, tmp_path, {"affinity": affinity})
    got = r.pod_spec["affinity"]
    assert got["podAntiAffinity"] == anti
    assert got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    terms = got["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0] for t in terms] == [t["matchExpressions"][0] for t in own]
    assert all([e["key"] for e in t["matchExpressions"][1:]] == [DEVICE_PLUGIN, CLIENT] for t in terms)
    # the user's terms still decide, and a pause still wins over them
    assert runs_on(r, {"example.com/pool": "p", DEVICE_PLUGIN: "true"})
    assert not runs_on(r, {"nvidia.com/gpu.present": "false"})
    assert not runs_on(r, {"example.com/pool": "p", DEVICE_PLUGIN: MIG_PAUSE})
    off = render(helm, tmp_path, {"affinity": affinity, "gpuOperator": {"honourDeployLabels": False}})
    assert off.pod_spec["affinity"] == affinity


# ---- gpuClientNodeSelector (off by default) ---------------------------------------------------------


def test_client_node_selector_is_what_mig_manager_waits_on(client_selector, default):
    # mig-manager and the driver manager wait for DaemonSet pods whose nodeSelector has this key
    assert client_selector.pod_spec["nodeSelector"] == {CLIENT: "true"}
    assert "nodeSelector" not in default.pod_spec
    assert runs_on(client_selector, NODES["operator v26.7"])
    assert runs_on(client_selector, NODES["operator v26.7, NVIDIA's plugin off on this node"])
    # the price: no pod where the GPU Operator did not put the label
    assert not runs_on(client_selector, NODES["operator before v26.7"])
    assert not runs_on(client_selector, NODES["no GPU Operator"])
    during, after = mig_repartition(NODES["operator v26.7"])
    assert not runs_on(client_selector, during) and runs_on(client_selector, after)


def test_client_node_selector_keeps_the_users_node_selector(helm, tmp_path):
    r = render(helm, tmp_path, {"nodeSelector": {"feature.node.kubernetes.io/pci-10de.present": "true"},
                                "gpuOperator": {"gpuClientNodeSelector": True, "honourDeployLabels": False}})
    assert r.pod_spec["nodeSelector"] == {"feature.node.kubernetes.io/pci-10de.present": "true", CLIENT: "true"}
    assert "affinity" not in r.pod_spec


def test_both_on_decode_strictly(helm, decoder, tmp_path):
    r = render(helm, tmp_path, {"gpuOperator": {"gpuClientNodeSelector": True},
                                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [{"matchFields": [
                                        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}})
    proc = decode(decoder, r.text)  # k8s.io/api types, unknown fields refused
    assert proc.returncode == 0, proc.stderr
    assert "DaemonSet" in {json.loads(line)["kind"] for line in proc.stdout.splitlines()}
    term = r.pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]
    assert term["matchFields"][0]["values"] == ["n1"]
    assert [e["key"] for e in term["matchExpressions"]] == [DEVICE_PLUGIN, CLIENT]
    assert r.pod_spec["nodeSelector"] == {CLIENT: "true"}


@pytest.mark.parametrize("flag,value,where", [
    ("--set", "gpuOperator.honourDeployLabels=yes", "/gpuOperator/honourDeployLabels"),
    ("--set", "gpuOperator.gpuClientNodeSelector=1", "/gpuOperator/gpuClientNodeSelector"),
    ("--set", "gpuOperator.pauseValues=x", "pauseValues"),
])
def test_schema_rejects_bad_gpu_operator_values(helm, flag, value, where):
    proc = run_helm(helm, "template", RELEASE, str(CHART), flag, value)
    assert proc.returncode != 0, f"{value} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert where in proc.stderr, proc.stderr
