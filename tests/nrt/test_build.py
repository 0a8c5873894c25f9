"""The NodeResourceTopology builder on every built-in simulated node (plugin/nrt/build.py)."""

from __future__ import annotations

import pytest

from allocator.topology import Device, DeviceKind, Link, LinkLevel, NodeTopology
from plugin.model.resources import ResourceOptions, build_resources
from plugin.nrt.build import (
    PAIR_LEVELS,
    TopologyManagerSettings,
    available_by_zone,
    build_nrt,
    free_pairs,
    published_resources,
)
from plugin.sources.simulated import builtin_names, load_simulated

SETTINGS = TopologyManagerSettings("single-numa-node", "container", "test")


def _node(name: str):
    topology = load_simulated(name)
    resources = published_resources(build_resources(topology, ResourceOptions()))
    return topology, resources


@pytest.mark.parametrize("name", builtin_names())
def test_one_zone_per_numa_node_with_every_device_counted_once(name):
    topology, resources = _node(name)
    obj = build_nrt("n1", topology, resources, frozenset(), SETTINGS)
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2" and obj["kind"] == "NodeResourceTopology"
    assert obj["metadata"]["name"] == "n1"
    numa = sorted({d.numa for r in resources for d in r.devices if d.numa is not None} | set(topology.numa_nodes))
    assert [z["name"] for z in obj["zones"]] == [f"node-{n}" for n in numa]
    assert all(z["type"] == "Node" for z in obj["zones"])
    for r in resources:
        with_numa = [d for d in r.devices if d.numa is not None]
        per_zone = [e for z in obj["zones"] for e in z["resources"] if e["name"] == r.name]
        assert sum(int(e["capacity"]) for e in per_zone) == len(with_numa)
        assert sum(int(e["allocatable"]) for e in per_zone) == sum(d.healthy for d in with_numa)
        assert all(e["available"] == e["allocatable"] for e in per_zone)  # nothing held


@pytest.mark.parametrize("name", builtin_names())
def test_held_devices_leave_available_in_their_zone_only(name):
    topology, resources = _node(name)
    before = available_by_zone(build_nrt("n1", topology, resources, frozenset(), SETTINGS))
    r = resources[0]
    held_dev = next(d for d in r.devices if d.numa is not None and d.healthy)
    after = available_by_zone(build_nrt("n1", topology, resources, {(r.name, held_dev.id)}, SETTINGS))
    zone = f"node-{held_dev.numa}"
    assert after[zone][r.name] == before[zone][r.name] - 1
    assert {z: v for z, v in after.items() if z != zone} == {z: v for z, v in before.items() if z != zone}


@pytest.mark.parametrize("name", builtin_names())
def test_costs_are_the_numa_distance_table(name):
    topology, resources = _node(name)
    zones = build_nrt("n1", topology, resources, frozenset(), SETTINGS)["zones"]
    for z in zones:
        a = int(z["name"].removeprefix("node-"))
        costs = {c["name"]: c["value"] for c in z["costs"]}
        assert costs[z["name"]] == topology.numa_distance(a, a) == 10
        assert costs == {o["name"]: topology.numa_distance(a, int(o["name"].removeprefix("node-"))) for o in zones}


@pytest.mark.parametrize("name", builtin_names())
def test_free_pairs_grow_with_a_looser_link_and_never_exceed_the_devices(name):
    topology, resources = _node(name)
    for z in build_nrt("n1", topology, resources, frozenset(), SETTINGS)["zones"]:
        pairs = [int(a["value"]) for level in PAIR_LEVELS for a in z.get("attributes", ())
                 if a["name"] == f"topo.dev/free-gpu-nic-pairs-{level.name}"]
        if not pairs:
            continue
        assert pairs == sorted(pairs)
        numa = int(z["name"].removeprefix("node-"))
        gpus = {d.device.name for r in resources if r.kind is DeviceKind.GPU for d in r.devices if d.numa == numa}
        nics = {d.device.name for r in resources if r.kind is DeviceKind.NIC for d in r.devices if d.numa == numa}
        assert pairs[-1] <= min(len(gpus), len(nics))


def test_dgx_h100_pairs_each_gpu_with_its_switch_nic_and_a_held_gpu_removes_its_pair():
    """DGX H100: every GPU shares a PCIe switch (PIX) with one NIC; holding a GPU leaves its NIC unpaired."""
    topology, resources = _node("dgx-h100")
    obj = build_nrt("n1", topology, resources, frozenset(), SETTINGS)
    pix = {z["name"]: int(next(a["value"] for a in z["attributes"] if a["name"].endswith("-PIX")))
           for z in obj["zones"] if "attributes" in z}
    gpus = next(r for r in resources if r.kind is DeviceKind.GPU)
    per_zone = {f"node-{n}": sum(1 for d in gpus.devices if d.numa == n) for n in topology.numa_nodes}
    assert pix == {z: n for z, n in per_zone.items() if n}
    one = gpus.devices[0]
    held = build_nrt("n1", topology, resources, {(gpus.name, one.id)}, SETTINGS)
    zone = next(z for z in held["zones"] if z["name"] == f"node-{one.numa}")
    assert int(next(a["value"] for a in zone["attributes"] if a["name"].endswith("-PIX"))) == pix[zone["name"]] - 1


def test_pairs_are_a_matching_not_a_count():
    """Two GPUs below one switch with one NIC make one pair."""
    devs = [Device("g0", DeviceKind.GPU, 0, numa=0), Device("g1", DeviceKind.GPU, 1, numa=0),
            Device("n0", DeviceKind.NIC, 0, numa=0)]
    t = NodeTopology.build(devs, [("g0", "n0", Link(level=LinkLevel.PIX)), ("g1", "n0", Link(level=LinkLevel.PIX))])
    assert free_pairs(t, devs[:2], devs[2:], LinkLevel.PIX) == 1


def test_policy_attributes_follow_the_kubelet_settings_and_are_left_out_when_unknown():
    topology, resources = _node("pcie-2socket-4gpu-2nic")
    known = {a["name"]: a["value"] for a in build_nrt("n1", topology, resources, (), SETTINGS)["attributes"]}
    assert known["topologyManagerPolicy"] == "single-numa-node" and known["topologyManagerScope"] == "container"
    unknown = {a["name"] for a in build_nrt("n1", topology, resources, (), TopologyManagerSettings())["attributes"]}
    assert not unknown & {"topologyManagerPolicy", "topologyManagerScope"}


def test_an_unhealthy_device_is_capacity_but_not_allocatable():
    topology = load_simulated("pcie-2socket-4gpu-2nic")
    gpu = topology.gpus[0]
    sick = topology.with_health({gpu.name: "Unhealthy"})
    resources = published_resources(build_resources(sick, ResourceOptions()))
    zone = next(z for z in build_nrt("n1", sick, resources, (), SETTINGS)["zones"] if z["name"] == f"node-{gpu.numa}")
    entry = next(e for e in zone["resources"] if e["name"] == "nvidia.com/gpu")
    assert int(entry["capacity"]) - int(entry["allocatable"]) == 1
    assert entry["available"] == entry["allocatable"]
