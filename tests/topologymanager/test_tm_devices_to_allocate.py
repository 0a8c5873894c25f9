"""devicesToAllocate cases ported from the kubelet's topology_hints_test.go
(TestTopologyAlignedAllocation, TestGetPreferredAllocationParameters) plus the
kubelet's error paths and the reuse pool."""

from __future__ import annotations

from collections import Counter

import pytest

from allocator.topologymanager import (
    BitMask,
    Container,
    DeviceAllocationError,
    DeviceInfo,
    DeviceManagerModel,
    Pod,
    ResourceSpec,
    TopologyHint,
    devices_to_allocate,
    filter_by_affinity,
)


def H(bits, preferred=True):
    return TopologyHint(None if bits is None else BitMask.of(*bits), preferred)


def D(dev_id, numa=None):
    return DeviceInfo(dev_id, None if numa is None else (numa,))


def many(spec):
    """spec: [(start, stop, numa)] -> devices Dev<start..stop-1> on that node."""
    return [D(f"Dev{i}", n) for a, b, n in spec for i in range(a, b)]


def fixed(answer):
    return lambda available, must_include, size: list(answer)


ALIGNED_CASES = [
    ("Single Request, no alignment", 1, [D("Dev1"), D("Dev2")], H((0, 1)), None, [], {}),
    ("Request for 1, partial alignment", 1, [D("Dev1"), D("Dev2", 1)], H((1,)), None, [], {1: 1}),
    ("Single Request, socket 0", 1, [D("Dev1", 0), D("Dev2", 1)], H((0,)), None, [], {0: 1}),
    ("Single Request, socket 1", 1, [D("Dev1", 0), D("Dev2", 1)], H((1,)), None, [], {1: 1}),
    ("Request for 2, socket 0", 2, [D("Dev1", 0), D("Dev2", 1), D("Dev3", 0), D("Dev4", 1)], H((0,)), None, [],
     {0: 2}),
    ("Request for 2, socket 1", 2, [D("Dev1", 0), D("Dev2", 1), D("Dev3", 0), D("Dev4", 1)], H((1,)), None, [],
     {1: 2}),
    ("Request for 4, unsatisfiable, prefer socket 0", 4,
     [D(f"Dev{i}", (i + 1) % 2) for i in range(1, 7)], H((0,)), None, [], {0: 3, 1: 1}),
    ("Request for 4, unsatisfiable, prefer socket 1", 4,
     [D(f"Dev{i}", (i + 1) % 2) for i in range(1, 7)], H((1,)), None, [], {0: 1, 1: 3}),
    ("Request for 4, multisocket", 4, [D(f"Dev{i}", (i - 1) % 4) for i in range(1, 9)], H((1, 3)), None, [],
     {1: 2, 3: 2}),
    ("Request for 5, socket 0, preferred aligned accepted", 5, many([(0, 100, 0), (100, 200, 1)]), H((0,)),
     ["Dev0", "Dev19", "Dev83", "Dev42", "Dev77"], ["Dev0", "Dev19", "Dev83", "Dev42", "Dev77"], {0: 5}),
    ("Request for 5, socket 0, preferred aligned accepted, unaligned ignored", 5,
     many([(0, 100, 0), (100, 200, 1)]), H((0,)),
     ["Dev0", "Dev19", "Dev83", "Dev150", "Dev186"], ["Dev0", "Dev19", "Dev83"], {0: 5}),
    ("Request for 5, socket 1, preferred aligned accepted, bogus ignored", 5, many([(0, 100, 1)]), H((1,)),
     ["Dev0", "Dev19", "Dev83", "bogus0", "bogus1"], ["Dev0", "Dev19", "Dev83"], {1: 5}),
    ("Request for 5, multisocket, preferred accepted", 5, many([(0, 3, 0), (3, 100, 1)]), H((0,)),
     ["Dev0", "Dev1", "Dev2", "Dev42", "Dev83"], ["Dev0", "Dev1", "Dev2", "Dev42", "Dev83"], {0: 3, 1: 2}),
    ("Request for 5, multisocket, preferred unaligned accepted, bogus ignored", 5,
     many([(0, 3, 0), (3, 100, 1)]), H((0,)),
     ["Dev0", "Dev1", "Dev2", "Dev42", "bogus0"], ["Dev0", "Dev1", "Dev2", "Dev42"], {0: 3, 1: 2}),
]


@pytest.mark.parametrize("description, request_, devices, hint, answer, must_have, alignment", ALIGNED_CASES,
                         ids=[c[0] for c in ALIGNED_CASES])
def test_topology_aligned_allocation(description, request_, devices, hint, answer, must_have, alignment):
    all_devices = {d.id: d for d in devices}
    out = devices_to_allocate(
        resource="resource", required=request_, all_devices=all_devices, healthy=all_devices,
        in_use=(), hint=hint, preferred=None if answer is None else fixed(answer),
    )
    assert len(out.devices) == request_
    assert set(must_have) <= set(out.devices)
    got = Counter(all_devices[d].numa_nodes[0] for d in out.devices if all_devices[d].numa_nodes)
    assert dict(got) == alignment


def N0(n):
    return [D(f"Dev{i}", 0) for i in range(n)]


PARAM_CASES = [
    ("Request for 1, socket 0, 0 already allocated, 0 reusable", 1, N0(4), [], [], H((0,)),
     ["Dev0", "Dev1", "Dev2", "Dev3"], [], 1),
    ("Request for 4, socket 0, 2 already allocated, 2 reusable", 4, N0(8), ["Dev0", "Dev5"], ["Dev0", "Dev5"],
     H((0,)), [f"Dev{i}" for i in range(8)], ["Dev0", "Dev5"], 4),
    ("Request for 4, socket 0, 4 already allocated, 2 reusable", 4, N0(8), ["Dev0", "Dev5", "Dev4", "Dev1"],
     ["Dev0", "Dev5"], H((0,)), ["Dev0", "Dev2", "Dev3", "Dev5", "Dev6", "Dev7"], ["Dev0", "Dev5"], 4),
    ("Request for 6, multisocket, 2 already allocated, 2 reusable", 6,
     [D(f"Dev{i}", 0 if i < 4 else 1) for i in range(8)], ["Dev1", "Dev6"], ["Dev1", "Dev6"], H((0,)),
     [f"Dev{i}" for i in range(8)], ["Dev0", "Dev1", "Dev2", "Dev3", "Dev6"], 6),
    ("Request for 6, multisocket, 4 already allocated, 2 reusable", 6,
     [D(f"Dev{i}", 0 if i < 4 else 1) for i in range(8)], ["Dev0", "Dev1", "Dev6", "Dev7"], ["Dev1", "Dev6"],
     H((0,)), ["Dev1", "Dev2", "Dev3", "Dev4", "Dev5", "Dev6"], ["Dev1", "Dev2", "Dev3", "Dev6"], 6),
]


@pytest.mark.parametrize(
    "description, request_, devices, in_use, reusable, hint, exp_available, exp_must, exp_size", PARAM_CASES,
    ids=[c[0] for c in PARAM_CASES],
)
def test_get_preferred_allocation_parameters(
    description, request_, devices, in_use, reusable, hint, exp_available, exp_must, exp_size
):
    calls = []

    def spy(available, must_include, size):
        calls.append((available, must_include, size))
        return None  # no answer: the kubelet fills on its own

    all_devices = {d.id: d for d in devices}
    out = devices_to_allocate(
        resource="resource", required=request_, all_devices=all_devices, healthy=all_devices,
        in_use=in_use, hint=hint, reusable=reusable, preferred=spy,
    )
    assert len(calls) == 1
    available, must_include, size = calls[0]
    assert set(available) == set(exp_available)
    assert set(must_include) == set(exp_must)
    assert size == exp_size
    # The kubelet sends both lists sorted (sets.List).
    assert available == sorted(available) and must_include == sorted(must_include)
    assert len(out.devices) == request_


# -- which case, and when the plugin is asked ---------------------------------

EIGHT = {str(i): DeviceInfo(str(i), (0 if i < 4 else 1,)) for i in range(8)}


def _run(required, hint, in_use=(), reusable=(), answer=None, healthy=None):
    calls = []

    def pref(available, must_include, size):
        calls.append((available, must_include, size))
        return list(answer or [])

    out = devices_to_allocate(
        resource="gpu", required=required, all_devices=EIGHT, healthy=healthy if healthy is not None else EIGHT,
        in_use=in_use, hint=hint, reusable=reusable, preferred=pref,
    )
    return out, calls


def test_case_a_asks_among_aligned_and_keeps_only_aligned_answers():
    out, calls = _run(2, H((0,)), answer=["3", "4"])
    assert out.case == "A"
    assert calls == [(["0", "1", "2", "3"], [], 2)]
    assert out.preferred_call.accepted == ("3",)
    assert "3" in out.devices and "4" not in out.devices and out.arbitrary


def test_case_b_exactly_enough_aligned_skips_the_plugin():
    out, calls = _run(4, H((0, 1), False), in_use={"0", "1", "4", "5"})
    assert out.case == "B" and calls == []
    assert sorted(out.devices) == ["2", "3", "6", "7"]
    assert not out.arbitrary and "exactly enough" in out.preferred_skipped


def test_case_b_short_asks_with_all_free_plus_chosen():
    out, calls = _run(3, H((0,)), in_use={"0", "1"}, answer=["2", "3", "7"])
    assert out.case == "B"
    assert calls == [(["2", "3", "4", "5", "6", "7"], ["2", "3"], 3)]
    assert list(out.devices) == ["2", "3", "7"] and not out.arbitrary


# The kubelet's last resort in Case B (manager.go devicesToAllocate): after all aligned
# devices and the plugin's accepted answer, it fills from the UNALIGNED devices (on other
# NUMA nodes) and only then from the devices WITHOUT NUMA affinity.
# A* on node 0 (aligned with the hint {0}), U* on node 1 (unaligned), N* without topology.
FALLBACK_DEVICES = [D("A0", 0), D("U1", 1), D("U2", 1), D("N1"), D("N2")]

# (description, required, plugin answer (None: no GetPreferredAllocation), in use,
#  expected devices (exact) or None, expected count per bucket, arbitrary)
FALLBACK_CASES = [
    ("no preferred call: unaligned before no-affinity", 3, None, (),
     ["A0", "U1", "U2"], {"aligned": 1, "unaligned": 2}, False),
    ("empty answer: unaligned before no-affinity", 3, [], (),
     ["A0", "U1", "U2"], {"aligned": 1, "unaligned": 2}, False),
    ("answer too short: unaligned exhausted, then no-affinity", 4, ["A0"], (),
     None, {"aligned": 1, "unaligned": 2, "none": 1}, True),
    ("one unaligned left: it goes before either no-affinity device", 3, None, ("U2",),
     None, {"aligned": 1, "unaligned": 1, "none": 1}, True),
    ("more unaligned than needed: still none of the no-affinity ones", 2, None, (),
     None, {"aligned": 1, "unaligned": 1}, True),
    ("no unaligned device free: no-affinity fills", 2, None, ("U1", "U2"),
     None, {"aligned": 1, "none": 1}, True),
    ("the plugin's answer wins over the fallback order", 3, ["A0", "N1", "N2"], (),
     ["A0", "N1", "N2"], {"aligned": 1, "none": 2}, False),
]


@pytest.mark.parametrize("description, required, answer, in_use, devices, buckets, arbitrary", FALLBACK_CASES,
                         ids=[c[0] for c in FALLBACK_CASES])
def test_case_b_fallback_order(description, required, answer, in_use, devices, buckets, arbitrary):
    all_devices = {d.id: d for d in FALLBACK_DEVICES}
    out = devices_to_allocate(
        resource="res", required=required, all_devices=all_devices, healthy=all_devices, in_use=in_use,
        hint=H((0,)), preferred=None if answer is None else fixed(answer),
    )
    assert out.case == "B"

    def bucket(d):
        numa = all_devices[d].numa_nodes
        return "none" if not numa else "aligned" if numa == (0,) else "unaligned"

    assert dict(Counter(bucket(d) for d in out.devices)) == buckets
    if devices is not None:
        assert sorted(out.devices) == sorted(devices)
    assert out.arbitrary is arbitrary


def test_nil_affinity_puts_everything_in_no_affinity():
    out, calls = _run(2, H(None, False), answer=["6", "7"])
    assert out.aligned == () and len(out.no_affinity) == 8
    assert calls[0][0] == [str(i) for i in range(8)]
    assert list(out.devices) == ["6", "7"]


def test_reuse_covering_the_request_skips_everything():
    out, calls = _run(2, H((0,)), in_use={"4", "5"}, reusable={"4", "5"})
    assert out.case == "reuse" and calls == [] and sorted(out.devices) == ["4", "5"]


def test_plugin_without_get_preferred_allocation_is_not_called():
    out = devices_to_allocate(resource="gpu", required=1, all_devices=EIGHT, healthy=EIGHT, in_use=(),
                              hint=H((0,)), preferred=None)
    assert out.preferred_call is None and "does not offer" in out.preferred_skipped
    assert out.devices == ("0",) and out.arbitrary


def test_filter_by_affinity_buckets():
    devices = {
        "a": DeviceInfo("a", (0,)),
        "b": DeviceInfo("b", (1,)),
        "c": DeviceInfo("c", (1, 0)),  # any node in the mask makes it aligned
        "d": DeviceInfo("d", None),
        "e": DeviceInfo("e", ()),
        "f": DeviceInfo("f", (-1,)),
    }
    aligned, unaligned, none = filter_by_affinity(devices, devices, H((0,)))
    assert (aligned, unaligned, none) == ({"a", "c"}, {"b"}, {"d", "e", "f"})
    # A resource without topology: everything is "no affinity".
    flat = {"d": DeviceInfo("d"), "e": DeviceInfo("e", ())}
    assert filter_by_affinity(flat, flat, H((0,))) == (set(), set(), {"d", "e"})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(registered=False), "cannot allocate unregistered device gpu"),
        (dict(healthy=()), "no healthy devices present; cannot allocate unhealthy devices gpu"),
        (dict(in_use={str(i) for i in range(7)}),
         "requested number of devices unavailable for gpu. Requested: 2, Available: 1"),
        (dict(already_allocated={"0"}), 'pod "p" container "c" changed request for resource "gpu" from 1 to 2'),
        (dict(already_allocated={"0", "1"}, healthy={"0", "2"}),
         "previously allocated devices are no longer healthy; cannot allocate unhealthy devices gpu"),
    ],
)
def test_kubelet_error_messages(kwargs, message):
    args = dict(resource="gpu", required=2, all_devices=EIGHT, healthy=EIGHT, in_use=(), hint=H((0,)),
                pod_uid="p", container_name="c")
    args.update(kwargs)
    with pytest.raises(DeviceAllocationError) as err:
        devices_to_allocate(**args)
    assert str(err.value) == message


def test_plugin_error_fails_with_the_kubelet_wording():
    def broken(available, must_include, size):
        raise RuntimeError("connection refused")

    with pytest.raises(DeviceAllocationError, match="^device plugin GetPreferredAllocation rpc failed with err: "
                                                    "connection refused$"):
        devices_to_allocate(resource="gpu", required=1, all_devices=EIGHT, healthy=EIGHT, in_use=(),
                            hint=H((0,)), preferred=broken)


def test_already_allocated_needs_no_rpc():
    out = devices_to_allocate(resource="gpu", required=2, all_devices=EIGHT, healthy=EIGHT, in_use={"0", "1"},
                              hint=H((0,)), already_allocated={"0", "1"})
    assert out.case == "already-allocated" and out.devices == () and not out.allocate_rpc


# -- the reuse pool across containers -----------------------------------------

def _dm(answer="lowest"):
    def lowest(available, must_include, size):
        rest = [d for d in available if d not in must_include]
        return list(must_include) + rest[: size - len(must_include)]

    return DeviceManagerModel((0, 1), [ResourceSpec("gpu", tuple(EIGHT.values()), lowest)])


def test_init_container_devices_are_reused_by_the_next_container():
    dm = _dm()
    pod = Pod("p", (Container("app", {"gpu": 2}),), (Container("init", {"gpu": 2}),))
    dm.allocate(pod, pod.init_containers[0])
    assert dm.devices_to_reuse["p"]["gpu"] == {"0", "1"}
    dm.allocate(pod, pod.containers[0])
    assert dm.container_devices("p", "app", "gpu") == {"0", "1"}
    assert dm.allocation_log[-1].outcome.case == "reuse"
    assert dm.devices_to_reuse["p"]["gpu"] == set()


def test_sidecar_devices_are_not_reused():
    dm = _dm()
    pod = Pod("p", (Container("app", {"gpu": 2}),), (Container("sidecar", {"gpu": 2}, restartable=True),))
    dm.allocate(pod, pod.init_containers[0])
    assert dm.devices_to_reuse["p"].get("gpu", set()) == set()
    dm.allocate(pod, pod.containers[0])
    assert dm.container_devices("p", "app", "gpu") == {"2", "3"}


def test_reuse_pool_is_dropped_for_another_pod():
    dm = _dm()
    p1 = Pod("p1", (Container("a", {"gpu": 1}),), (Container("i", {"gpu": 1}),))
    dm.allocate(p1, p1.init_containers[0])
    p2 = Pod("p2", (Container("a", {"gpu": 1}),))
    dm.allocate(p2, p2.containers[0])
    assert list(dm.devices_to_reuse) == ["p2"]
