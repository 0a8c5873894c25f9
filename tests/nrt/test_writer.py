"""The coalescing writer against the API server's NRT paths over real HTTP (plugin/nrt/writer.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from plugin.backoff import Backoff
from plugin.nrt.build import TopologyManagerSettings, build_nrt, published_resources
from plugin.nrt.writer import NrtWriter
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

NODE = "node-a"
DEADLINE_S = 30.0  # generous: a loaded machine is slow, never wrong


async def until(check, what: str) -> None:
    async def poll():
        while not check():
            await asyncio.sleep(0.02)
    try:
        await asyncio.wait_for(poll(), DEADLINE_S)
    except TimeoutError:
        raise AssertionError(f"not within {DEADLINE_S} s: {what}") from None


def states():
    """Objects for 0..n held GPUs of a DGX H100: each a distinct state."""
    topology = load_simulated("dgx-h100")
    resources = published_resources(build_resources(topology, ResourceOptions()))
    gpus = next(r for r in resources if r.name == "nvidia.com/gpu")
    settings = TopologyManagerSettings("single-numa-node", "container", "test")
    return [build_nrt(NODE, topology, resources, {(gpus.name, d.id) for d in gpus.devices[:k]}, settings)
            for k in range(len(gpus.devices) + 1)]


@contextlib.asynccontextmanager
async def running(writer: NrtWriter):
    task = asyncio.create_task(writer.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_creates_the_object_owned_by_the_node_and_deletes_it_at_stop(nrt_server, connect):
    writer = NrtWriter(NODE, connect)
    want = states()[0]
    writer.want(want)
    async with running(writer):
        await until(lambda: NODE in nrt_server.objects, "the object is created")
    obj = nrt_server.objects[NODE]
    assert obj["zones"] == want["zones"]
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node", "name": NODE,
                                                   "uid": nrt_server.nodes[NODE]["metadata"]["uid"]}]
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "topo-device-plugin"
    await writer.stop()
    assert NODE not in nrt_server.objects


async def test_a_burst_of_changes_is_coalesced_and_the_last_state_lands(nrt_server, connect):
    writer = NrtWriter(NODE, connect, min_interval_s=1.0)
    all_states = states()
    writer.want(all_states[0])
    async with running(writer):
        await until(lambda: NODE in nrt_server.objects, "the first write")
        for s in all_states[1:]:  # 8 changes in a burst, as a pod's admission and its neighbours make
            writer.want(s)
        await until(lambda: nrt_server.objects[NODE]["zones"] == all_states[-1]["zones"], "the last state lands")
    writes = [w for w in nrt_server.writes if w[0] in ("POST", "PUT")]
    assert len(writes) <= 3, writes  # the create, then the burst in one or two writes; never one per change
    await writer.stop()


async def test_a_restarted_daemon_adopts_its_own_object(nrt_server, connect):
    first = NrtWriter(NODE, connect)
    first.want(states()[0])
    async with running(first):
        await until(lambda: NODE in nrt_server.objects, "created")
    second = NrtWriter(NODE, connect)  # the old one killed: no stop, no delete
    second.want(states()[2])
    async with running(second):
        await until(lambda: nrt_server.objects[NODE]["zones"] == states()[2]["zones"], "adopted and updated")
    assert [w[0] for w in nrt_server.writes] == ["POST", "PUT"]
    await second.stop()
    assert NODE not in nrt_server.objects


async def test_an_object_nfd_manages_is_never_written_and_the_log_says_so(nrt_server, connect, caplog):
    caplog.set_level(logging.WARNING)
    nrt_server.put_foreign(NODE, "nfd-topology-updater")
    writer = NrtWriter(NODE, connect)
    writer.want(states()[0])
    async with running(writer) as task:
        await until(task.done, "the writer stays off")
    assert writer.off is not None and "NFD" in writer.off
    assert nrt_server.writes == []
    assert any("managed by someone else" in r.getMessage() and "docs/scheduling.md" in r.fix for r in caplog.records)
    await writer.stop()
    assert NODE in nrt_server.objects  # not ours: not deleted either


async def test_a_refusing_server_is_retried_until_the_state_lands(nrt_server, connect):
    nrt_server.refuse_writes = 3
    writer = NrtWriter(NODE, connect, backoff=Backoff(0.01, 0.05))
    writer.want(states()[1])
    async with running(writer):
        await until(lambda: NODE in nrt_server.objects, "created after the refusals")
    assert nrt_server.objects[NODE]["zones"] == states()[1]["zones"]
    await writer.stop()


async def test_someone_else_changed_it_meanwhile_a_conflict_is_read_again_and_written(nrt_server, connect):
    writer = NrtWriter(NODE, connect, min_interval_s=0.05, backoff=Backoff(0.01, 0.05))
    writer.want(states()[0])
    async with running(writer):
        await until(lambda: NODE in nrt_server.objects, "created")
        nrt_server.objects[NODE]["metadata"]["resourceVersion"] = "999"  # a write we did not make
        writer.want(states()[3])
        await until(lambda: nrt_server.objects[NODE]["zones"] == states()[3]["zones"], "written after a 409")
    await writer.stop()


async def test_the_uninstall_cleanup_deletes_our_objects_only(nrt_server, connect):
    from plugin.nrt.cleanup import delete_ours

    writer = NrtWriter(NODE, connect)
    writer.want(states()[0])
    async with running(writer):
        await until(lambda: NODE in nrt_server.objects, "created")
    nrt_server.put_foreign("nfd-node", "nfd-topology-updater")
    api = await connect()
    try:
        assert await delete_ours(api) == [NODE]
    finally:
        await api.close()
    assert set(nrt_server.objects) == {"nfd-node"}


#: What a real API server answers for a resource whose CRD is not installed.
NO_CRD = (404, "NotFound", "the server could not find the requested resource")


async def test_the_cleanup_on_a_cluster_without_the_crd_has_nothing_to_delete_and_other_refusals_fail_it(
        nrt_server, connect):
    from plugin.kube.errors import KubeForbidden
    from plugin.nrt.cleanup import delete_ours

    api = await connect()
    try:
        nrt_server.list_refused = NO_CRD
        assert await delete_ours(api) == []
        nrt_server.list_refused = (403, "Forbidden", "cannot list resource \"noderesourcetopologies\"")
        with pytest.raises(KubeForbidden, match="403 Forbidden: cannot list"):
            await delete_ours(api)
    finally:
        await api.close()
