"""Which partners the pod-resources check drops, table-driven, and how `List` answers become holdings.

A partner is dropped only on positive evidence that it belongs to a container
other than the one asking: its container already holds the requested
resource, or the group's newest `Allocate` went to another container. A
device `List` does not show (a non-restartable init container's, which the
kubelet leaves out) is always kept.
"""

from __future__ import annotations

import pytest

from plugin.api.podresources.v1 import api_pb2
from plugin.allocation.pod_resources import Holdings, drop_stale

GPU, NIC, NIC2 = "nvidia.com/gpu", "example.com/nic", "example.com/nic-b"


def holdings(**containers: dict[str, list[str]]) -> Holdings:
    """containers: name -> {resource: IDs}, as List would show them."""
    resp = api_pb2.ListPodResourcesResponse()
    pod = resp.pod_resources.add(name="p", namespace="ns")
    for name, held in containers.items():
        c = pod.containers.add(name=name)
        for res, ids in held.items():
            c.devices.add(resource_name=res, device_ids=ids)
    return Holdings.from_list(resp)


CASES = {
    "the asking container's own devices are kept": (
        NIC, {GPU: ("0", "1")}, holdings(a={GPU: ["0", "1"]}), {GPU: ("0", "1")}),
    "devices List does not show (an init container's) are kept": (
        NIC, {GPU: ("0",)}, holdings(a={GPU: ["5"]}), {GPU: ("0",)}),
    "a container that already holds the requested resource is not the one asking": (
        NIC, {GPU: ("4",)}, holdings(slow={NIC: ["n0"], GPU: ["4"]}), {}),
    "the group's newest Allocate went to another container: the older one's devices go": (
        NIC2, {GPU: ("0",), NIC: ("n1",)}, holdings(a={GPU: ["0"]}, b={NIC: ["n1"]}), {NIC: ("n1",)}),
    "the newest Allocate's container is unknown (an init container): nothing is dropped": (
        NIC2, {GPU: ("0",), NIC: ("n1",)}, holdings(a={GPU: ["0"]}), {GPU: ("0",), NIC: ("n1",)}),
    "reused devices List shows in the app container are the app's": (
        NIC, {GPU: ("2", "3")}, holdings(app={GPU: ["2", "3"]}), {GPU: ("2", "3")}),
    "an empty group stays empty": (NIC, {}, holdings(a={GPU: ["0"]}), {}),
}


@pytest.mark.parametrize("resource,group,held,want", CASES.values(), ids=CASES.keys())
def test_drop_stale(resource, group, held, want):
    assert drop_stale(resource, group, held) == want


def test_holdings_from_list_per_numa_entries_and_namespaces():
    """The kubelet sends one ContainerDevices per (device, NUMA node); containers are told apart by
    namespace, pod and name."""
    resp = api_pb2.ListPodResourcesResponse()
    for ns in ("a", "b"):
        c = resp.pod_resources.add(name="p", namespace=ns).containers.add(name="c")
        c.devices.add(resource_name=GPU, device_ids=[f"{ns}0"]).topology.nodes.add(ID=0)
        c.devices.add(resource_name=GPU, device_ids=[f"{ns}1"]).topology.nodes.add(ID=1)
        c.devices.add(resource_name=NIC, device_ids=[])
    h = Holdings.from_list(resp)
    assert h.holder == {(GPU, "a0"): "a/p/c", (GPU, "a1"): "a/p/c", (GPU, "b0"): "b/p/c", (GPU, "b1"): "b/p/c"}
    assert h.resources == {"a/p/c": frozenset({GPU}), "b/p/c": frozenset({GPU})}
