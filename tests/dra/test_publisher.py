"""Publishing this node's ResourceSlices through the official client to a (stand-in) API server."""

from __future__ import annotations

import asyncio

import pytest

from allocator.topology import Device, DeviceKind, NodeTopology
from plugin.dra.slices.publisher import SlicePublisher
from plugin.dra.slices.build import SliceOptions

NODE = "node-a"
OPTS = SliceOptions(node_name=NODE)


async def eventually(predicate, timeout: float = 30.0):
    """Poll for a condition with a generous deadline (never a timing assertion)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def devices(apiserver) -> dict[str, dict]:
    return {d["name"]: d for s in apiserver.slices.values() for d in s["spec"].get("devices", ())}


async def test_first_publish_owns_the_slices_by_the_node_and_a_resync_writes_nothing(apiserver, kube_api, dgx_h100):
    pub = SlicePublisher(kube_api, OPTS)
    pub._topology = dgx_h100
    assert await pub.reconcile() is True
    [s] = apiserver.slices.values()
    assert s["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                 "uid": apiserver.node_uid(NODE), "controller": True}]
    assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert s["spec"]["driver"] == "topo.dev" and s["spec"]["nodeName"] == NODE
    assert len(s["spec"]["devices"]) == 16
    writes = list(apiserver.writes)
    # Nothing changed: no write, no generation bump (also for a new publisher: a restarted driver).
    assert await pub.reconcile() is False
    again = SlicePublisher(kube_api, OPTS)
    again._topology = dgx_h100
    assert await again.reconcile() is False and again.generation == 1
    assert apiserver.writes == writes


async def test_health_changes_bump_the_pool_generation_and_taint_the_device(apiserver, kube_api, dgx_h100):
    pub = SlicePublisher(kube_api, OPTS)
    pub._topology = dgx_h100
    await pub.reconcile()
    pub._topology = dgx_h100.with_health({"GPU6": "Unhealthy"})
    assert await pub.reconcile() is True
    assert pub.generation == 2
    taints = devices(apiserver)["gpu-6"]["taints"]
    assert [(t["key"], t["effect"]) for t in taints] == [("topo.dev/unhealthy", "NoSchedule")]
    assert "timeAdded" in taints[0]  # set by the server; still "unchanged" on the next pass
    assert await pub.reconcile() is False
    pub._topology = dgx_h100
    assert await pub.reconcile() is True and pub.generation == 3
    assert "taints" not in devices(apiserver)["gpu-6"]


async def test_a_server_that_drops_taints_gets_unhealthy_devices_removed(apiserver, kube_api, dgx_h100):
    apiserver.drop_taints = True  # what an API server with DRADeviceTaints off does
    pub = SlicePublisher(kube_api, OPTS)
    pub._topology = dgx_h100.with_health({"GPU1": "Unhealthy"})
    await pub.reconcile()
    assert pub.taints_supported is False
    assert "gpu-1" not in devices(apiserver) and len(devices(apiserver)) == 15


def _nics(n: int) -> NodeTopology:
    return NodeTopology.build([Device(f"eth{i}", DeviceKind.NIC, i, numa=0) for i in range(n)], {})


async def test_a_shrinking_pool_deletes_extra_slices_and_keeps_counts_consistent(apiserver, kube_api):
    pub = SlicePublisher(kube_api, OPTS)
    pub._topology = _nics(150)
    await pub.reconcile()
    assert sorted(apiserver.slices) == [f"{NODE}-topo.dev-{i}" for i in range(3)]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in apiserver.slices.values()} == {3}
    pub._topology = _nics(10)
    await pub.reconcile()
    assert list(apiserver.slices) == [f"{NODE}-topo.dev-0"]
    [s] = apiserver.slices.values()
    assert s["spec"]["pool"] == {"name": NODE, "generation": 2, "resourceSliceCount": 1}
    assert ("DELETE", f"{NODE}-topo.dev-2") in apiserver.writes


async def test_slices_wiped_by_the_kubelet_come_back(apiserver, kube_api, dgx_h100):
    pub = SlicePublisher(kube_api, OPTS, resync_s=3600)
    pub.start(dgx_h100)
    try:
        await eventually(lambda: len(devices(apiserver)) == 16)
        apiserver.slices.clear()  # the kubelet deletes its node's slices when it starts
        pub.trigger()  # ... and registers us again, which triggers a check
        await eventually(lambda: len(devices(apiserver)) == 16)
        # A topology change reaches the API without waiting for the resync.
        pub.update(dgx_h100.with_health({"GPU0": "Unhealthy"}))
        await eventually(lambda: "taints" in devices(apiserver).get("gpu-0", {}))
    finally:
        await pub.stop()


async def test_api_errors_are_retried_and_reported_never_raised(kube_api, dgx_h100, apiserver):
    await apiserver.stop()  # nobody answers
    pub = SlicePublisher(kube_api, OPTS, resync_s=3600, max_backoff_s=0.05)
    pub.start(dgx_h100)
    try:
        await eventually(lambda: pub.passes >= 2)
        assert pub.last_error is not None and pub.generation == 0
    finally:
        await pub.stop()


async def test_stop_with_delete_removes_the_node_slices(apiserver, kube_api, dgx_h100):
    pub = SlicePublisher(kube_api, OPTS)
    pub._topology = dgx_h100
    await pub.reconcile()
    other = dict(next(iter(apiserver.slices.values())), metadata={"name": "node-b-topo.dev-0", "resourceVersion": "1"})
    other["spec"] = dict(other["spec"], nodeName="node-b")
    apiserver.slices["node-b-topo.dev-0"] = other
    await pub.stop(delete=True)
    assert list(apiserver.slices) == ["node-b-topo.dev-0"]


async def test_a_concurrent_writer_causes_a_conflict_and_the_next_pass_converges(apiserver, kube_api, dgx_h100):
    pub = SlicePublisher(kube_api, OPTS)
    pub._topology = dgx_h100
    await pub.reconcile()

    class Racing:
        """The other instance of a rolling update writes between our list and our update."""

        def __getattr__(self, name):
            return getattr(kube_api, name)

        async def list_slices(self, node, driver):
            found = await kube_api.list_slices(node, driver)
            for s in apiserver.slices.values():
                s["metadata"]["resourceVersion"] += "0"
            return found

    racing = SlicePublisher(Racing(), OPTS)
    racing._topology = dgx_h100.with_health({"GPU2": "Unhealthy"})
    with pytest.raises(Exception) as e:
        await racing.reconcile()
    assert getattr(e.value, "status", None) == 409
    pub._topology = racing._topology
    assert await pub.reconcile() is True and "taints" in devices(apiserver)["gpu-2"]


async def test_health_says_why_until_published_while_failing_and_after_recovery(apiserver, kube_api, dgx_h100):
    """What the driver's readiness reports (issue 19: /readyz said ready while publishing kept failing)."""
    pub = SlicePublisher(kube_api, OPTS, resync_s=3600, max_backoff_s=0.05)
    assert pub.health() == (False, "ResourceSlices not published yet")
    apiserver.slice_failure = 503
    pub.start(dgx_h100)
    try:
        await eventually(lambda: pub.failures >= 1)
        ok, why = pub.health()
        assert not ok and "publishing ResourceSlices failed" in why and "503" in why, why
        assert apiserver.slices == {}
        apiserver.slice_failure = None
        await eventually(lambda: pub.health()[0])
        assert pub.health() == (True, "ResourceSlices published (pool generation 1)")
        assert len(apiserver.slices) == 1
    finally:
        await pub.stop()


async def test_a_flapping_gpu_is_coalesced_to_about_one_write_a_second_and_the_last_state_wins(
        apiserver, kube_api, dgx_h100):
    """Issue 24: a GPU flapping every 100 ms for 5 s must not become 50 pool rewrites; the final state is
    published (by a trailing pass) after the burst, without waiting for the resync."""
    loop = asyncio.get_running_loop()
    pub = SlicePublisher(kube_api, OPTS, resync_s=3600, min_interval_s=1.0)
    pub.start(dgx_h100)
    try:
        await eventually(lambda: len(devices(apiserver)) == 16)
        before = len(apiserver.writes)
        began = loop.time()
        flaps = 0
        while loop.time() - began < 5.0:
            flaps += 1
            pub.update(dgx_h100.with_health({"GPU3": "Unhealthy"}) if flaps % 2 else dgx_h100)
            await asyncio.sleep(0.1)
        pub.update(dgx_h100.with_health({"GPU3": "Unhealthy", "GPU5": "Unhealthy"}))  # the state to end in
        burst_s = loop.time() - began
        await eventually(lambda: "taints" in devices(apiserver)["gpu-5"])
        assert "taints" in devices(apiserver)["gpu-3"]
        writes = apiserver.writes[before:]
        assert all(method == "PUT" for method, _ in writes), writes  # one slice: one update per pass
        # At most one pass per started second of the burst, plus the trailing one (a loaded machine only
        # stretches the burst, which the bound follows); without coalescing this would be ~50.
        assert 1 <= len(writes) <= burst_s / pub.min_interval_s + 2, (len(writes), flaps, burst_s)
        assert flaps >= 2 * len(writes)
    finally:
        await pub.stop()
