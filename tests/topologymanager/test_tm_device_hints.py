"""Device-manager hint cases ported from the kubelet's devicemanager/topology_hints_test.go
(getCommonTestCases, getPodScopeTestCases; expectations of 1.37, where masks only span
the NUMA nodes holding devices of the resource) plus the rules they rely on."""

from __future__ import annotations

import pytest

from allocator.topologymanager import (
    BitMask,
    Container,
    DeviceInfo,
    DeviceManagerModel,
    Pod,
    ResourceSpec,
    TopologyHint,
    generate_device_topology_hints,
    min_affinity_size,
    resource_hints,
)


def H(bits, preferred):
    return TopologyHint(None if bits is None else BitMask.of(*bits), preferred)


def D(dev_id, numa=None):
    """A device on one NUMA node; numa=None: no topology; numa=(): topology with no nodes."""
    if numa is None or numa == ():
        return DeviceInfo(dev_id, numa)
    return DeviceInfo(dev_id, (numa,))


def _key(h: TopologyHint):
    # The kubelet's test sorts both sides with LessThan before comparing.
    return (not h.preferred, h.affinity.count(), h.affinity.value)


def _sorted(hints):
    return None if hints is None else sorted(hints, key=_key)


def _model(devices, allocated):
    dm = DeviceManagerModel((0, 1), [ResourceSpec(r, tuple(ds)) for r, ds in devices.items()])
    for pod_uid, containers in allocated.items():
        for container, per_res in containers.items():
            for resource, ids in per_res.items():
                dm.mark_in_use(resource, ids, pod_uid, container)
    return dm


TWO_PER_NODE = [D("Dev1", 0), D("Dev2", 1), D("Dev3", 0), D("Dev4", 1)]
ALL = [H((0,), True), H((1,), True), H((0, 1), False)]

# (description, container limits, devices per resource, allocated {pod: {container: {res: ids}}}, expected)
COMMON = [
    ("Single Request, no alignment", {"testdevice": 1},
     {"testdevice": [D("Dev1"), D("Dev2"), D("Dev3", ()), D("Dev4", ())]}, {}, {"testdevice": None}),
    ("Single Request, only one with alignment", {"testdevice": 1},
     {"testdevice": [D("Dev1"), D("Dev2", 1)]}, {}, {"testdevice": [H((1,), True)]}),
    ("Single Request, one device per socket", {"testdevice": 1},
     {"testdevice": [D("Dev1", 0), D("Dev2", 1)]}, {}, {"testdevice": ALL}),
    ("Request for 2, one device per socket", {"testdevice": 2},
     {"testdevice": [D("Dev1", 0), D("Dev2", 1)]}, {}, {"testdevice": [H((0, 1), True)]}),
    ("Request for 2, 2 devices per socket", {"testdevice": 2}, {"testdevice": TWO_PER_NODE}, {},
     {"testdevice": ALL}),
    ("Request for 2, optimal on 1 NUMA node, forced cross-NUMA", {"testdevice": 2},
     {"testdevice": TWO_PER_NODE}, {"fakePod": {"fakeOtherContainer": {"testdevice": ["Dev1", "Dev2"]}}},
     {"testdevice": [H((0, 1), False)]}),
    ("2 device types, mixed configuration", {"testdevice1": 2, "testdevice2": 1},
     {"testdevice1": TWO_PER_NODE, "testdevice2": [D("Dev1", 0)]}, {},
     {"testdevice1": ALL, "testdevice2": [H((0,), True)]}),
    ("Single device type, more requested than available", {"testdevice": 6},
     {"testdevice": [D("Dev1", 0), D("Dev2", 0), D("Dev3", 1), D("Dev4", 1)]}, {}, {"testdevice": []}),
    ("Single device type, all already allocated to container", {"testdevice": 2},
     {"testdevice": [D("Dev1", 0), D("Dev2", 0)]},
     {"fakePod": {"fakeContainer": {"testdevice": ["Dev1", "Dev2"]}}},
     {"testdevice": [H((0,), True)]}),
    ("Single device type, less already allocated to container than requested", {"testdevice": 4},
     {"testdevice": [D("Dev1", 0), D("Dev2", 0), D("Dev3", 1), D("Dev4", 1)]},
     {"fakePod": {"fakeContainer": {"testdevice": ["Dev1", "Dev2"]}}}, {"testdevice": []}),
    ("Single device type, more already allocated to container than requested", {"testdevice": 2},
     {"testdevice": [D("Dev1", 0), D("Dev2", 0), D("Dev3", 1), D("Dev4", 1)]},
     {"fakePod": {"fakeContainer": {"testdevice": ["Dev1", "Dev2", "Dev3", "Dev4"]}}}, {"testdevice": []}),
]


@pytest.mark.parametrize("description, limits, devices, allocated, expected", COMMON, ids=[c[0] for c in COMMON])
def test_get_topology_hints(description, limits, devices, allocated, expected):
    dm = _model(devices, allocated)
    pod = Pod("fakePod", (Container("fakeContainer", limits),))
    hints = dm.get_topology_hints(pod, pod.containers[0])
    for resource, want in expected.items():
        assert _sorted(hints[resource]) == _sorted(want)


TD = [D("Dev1", 0), D("Dev2", 0), D("Dev3", 1), D("Dev4", 1)]
POD_SCOPE = [
    ("2 device types, user container only",
     [], [Container("c1", {"testdevice1": 2}), Container("c2", {"testdevice2": 2}),
          Container("c3", {"notRegistered": 2})],
     {}, {"testdevice1": ALL, "testdevice2": ALL}),
    ("2 device types, request resources for init containers and user container",
     [Container("i1", {"testdevice1": 1, "testdevice2": 1}), Container("i2", {"testdevice1": 1, "testdevice2": 2})],
     [Container("c1", {"testdevice1": 1, "testdevice2": 1}), Container("c2", {"testdevice1": 1, "testdevice2": 1}),
      Container("c3", {"notRegistered": 1})],
     {}, {"testdevice1": ALL, "testdevice2": ALL}),
    ("2 device types, user container only, optimal on 1 NUMA node, forced cross-NUMA",
     [], [Container("c1", {"testdevice1": 1, "testdevice2": 1}), Container("c2", {"testdevice1": 1, "testdevice2": 1}),
          Container("c3", {"notRegistered": 1})],
     {"fakeOtherPod": {"fakeOtherContainer": {"testdevice1": ["Dev1", "Dev3"], "testdevice2": ["Dev1", "Dev3"]}}},
     {"testdevice1": [H((0, 1), False)], "testdevice2": [H((0, 1), False)]}),
]


@pytest.mark.parametrize("description, limits, devices, allocated, expected", COMMON, ids=[c[0] for c in COMMON])
def test_get_pod_topology_hints_common(description, limits, devices, allocated, expected):
    dm = _model(devices, allocated)
    pod = Pod("fakePod", (Container("fakeContainer", limits),))
    hints = dm.get_pod_topology_hints(pod)
    for resource, want in expected.items():
        assert _sorted(hints[resource]) == _sorted(want)


@pytest.mark.parametrize("description, init, app, allocated, expected", POD_SCOPE, ids=[c[0] for c in POD_SCOPE])
def test_get_pod_topology_hints(description, init, app, allocated, expected):
    dm = _model({"testdevice1": TD, "testdevice2": TD}, allocated)
    pod = Pod("fakePod", tuple(app), tuple(init))
    hints = dm.get_pod_topology_hints(pod)
    assert set(hints) == set(expected)
    for resource, want in expected.items():
        assert _sorted(hints[resource]) == _sorted(want)


# -- the rules behind the cases ------------------------------------------------

EIGHT = {str(i): DeviceInfo(str(i), (0 if i < 4 else 1,)) for i in range(8)}


def test_preferred_depends_on_installed_not_free_devices():
    rh = resource_hints(
        resource="gpu", request=4, numa_nodes=(0, 1), all_devices=EIGHT,
        healthy=EIGHT, in_use={"0", "1", "4", "5"},
    )
    assert rh.min_affinity_size == 1
    assert list(rh.hints) == [H((0, 1), False)]
    assert rh.available == ("2", "3", "6", "7")


def test_unhealthy_devices_count_for_min_affinity_but_are_not_available():
    devices = dict(EIGHT)
    devices["0"] = DeviceInfo("0", (0,), healthy=False)
    devices["1"] = DeviceInfo("1", (0,), healthy=False)
    healthy = [d for d, info in devices.items() if info.healthy]
    hints = generate_device_topology_hints((0, 1), devices, healthy, (), 4)
    assert hints == [H((1,), True), H((0, 1), False)]
    assert min_affinity_size((0, 1), devices, 4) == 1


def test_min_affinity_defaults_to_all_nodes_when_nothing_fits():
    assert min_affinity_size((0, 1), EIGHT, 9) == 2


def test_reusable_device_with_topology_must_be_inside_the_mask():
    hints = generate_device_topology_hints((0, 1), EIGHT, ["2", "3"], ["4"], 2)
    # {0} is skipped because reusable GPU 4 is on node 1; {1}: 4 + nothing free on 1 -> 1 < 2.
    assert hints == [H((0, 1), False)]


def test_reusable_device_without_topology_neither_counts_nor_excludes():
    devices = dict(EIGHT, x=DeviceInfo("x", None))
    hints = generate_device_topology_hints((0, 1), devices, ["0"], ["x"], 1)
    assert hints == [H((0,), True), H((0, 1), False)]


def test_reusable_device_with_empty_topology_excludes_every_mask():
    devices = dict(EIGHT, x=DeviceInfo("x", ()))
    assert generate_device_topology_hints((0, 1), devices, ["0", "1"], ["x"], 1) == []


def test_device_on_a_non_machine_node_never_counts():
    devices = {"a": DeviceInfo("a", (5,)), "b": DeviceInfo("b", (-1,)), "c": DeviceInfo("c", (1,))}
    # Nodes 5 and -1 are not the machine's: masks span node 1 only.
    assert generate_device_topology_hints((0, 1), devices, ["a", "b", "c"], (), 1) == [H((1,), True)]


def test_masks_span_only_nodes_holding_devices():
    """1.37: a node without devices of the resource never appears in its hints (1.34 and
    older also offered the wider masks {0,1}, {1,2} and {0,1,2} here)."""
    devices = {"a": DeviceInfo("a", (1,)), "b": DeviceInfo("b", (1,))}
    assert generate_device_topology_hints((0, 1, 2), devices, ["a", "b"], (), 2) == [H((1,), True)]
    # No device has a machine node: every machine node is iterated, as the kubelet falls back.
    flat = {"a": DeviceInfo("a", (7,))}
    assert min_affinity_size((0, 1), flat, 1) == 2


def test_resource_hints_notes():
    base = dict(resource="gpu", numa_nodes=(0, 1), all_devices=EIGHT, healthy=EIGHT, in_use=())
    assert resource_hints(request=9, **base).hints == ()
    assert "unavailable" in resource_hints(request=9, **base).note
    assert resource_hints(request=1, already_allocated=["0"], **base).note.startswith("Regenerating")
    assert resource_hints(request=2, already_allocated=["0"], **base).hints == ()
    none = resource_hints(resource="x", request=1, numa_nodes=(0,), all_devices={"a": DeviceInfo("a")},
                          healthy=["a"], in_use=())
    assert none.hints is None and none.note == "Resource does not have a topology preference"
