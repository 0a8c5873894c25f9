"""The kubelet side of the DRA driver over real gRPC on real unix sockets in a temporary kubelet root.

A stand-in plugin watcher (kubelet_standin.py) finds the registration socket,
calls GetInfo and NotifyRegistrationStatus, then drives NodePrepareResources /
NodeUnprepareResources on the advertised endpoint, with the DRA service
version a 1.37 kubelet picks (v1) and the one an older kubelet picks (v1beta1).
The ResourceClaims come from the stand-in API server.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat

import grpc
import pytest

from kubelet_standin import KUBELET_137_SERVICES, register, registration_sockets
from plugin.dra import DraDriver, DraOptions, SliceOptions
from plugin.dra.kubelet.cdi import ClaimSpecs
from plugin.dra.kubelet.checkpoint import CheckpointError
from plugin.runtime.compose.dra import dra_driver

NODE = "node-a"
DRIVER = "topo.dev"
KUBELETS = {"v1": KUBELET_137_SERVICES, "v1beta1": ("v1beta1.DRAPlugin",)}


class CountingCdi(ClaimSpecs):
    def __init__(self, root: str):
        super().__init__(root, DRIVER)
        self.writes: list[str] = []

    def write_claim_spec(self, claim_uid, devices, settings=None):
        self.writes.append(claim_uid)
        return super().write_claim_spec(claim_uid, devices, settings)


@pytest.fixture
def roots(short_tmp):
    # Short paths: unix socket paths are limited to 107 bytes, pytest's tmp_path is long (tests/conftest.py).
    return os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi")


@pytest.fixture
async def start_driver(roots, kube_api, dgx_h100):
    started: list[DraDriver] = []

    async def start(instance: str = "pod-1", topology=None, cdi=None) -> DraDriver:
        opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=roots[0],
                          cdi_root=roots[1], instance_id=instance, resync_s=3600)
        drv = dra_driver(opts, kube_api, cdi=cdi or CountingCdi(roots[1]))
        await drv.start(topology or dgx_h100)
        started.append(drv)
        return drv

    yield start
    for d in started:
        await d.stop()


def result(device: str, request: str = "r", driver: str = DRIVER, pool: str = NODE) -> dict:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


PAIR = [result("gpu-0", "gpus"), result("gpu-1", "gpus"), result("nic-mlx5-0", "nics"),
        result("nic-mlx5-1", "nics")]


def cdi_spec(cdi_root: str, uid: str) -> dict:
    with open(os.path.join(cdi_root, f"{DRIVER}-claim_{uid}.json"), encoding="utf-8") as f:
        return json.load(f)


def checkpoint(kubelet_root: str) -> dict:
    with open(os.path.join(kubelet_root, "plugins", DRIVER, "checkpoint.json"), encoding="utf-8") as f:
        return json.load(f)["claims"]


# ---- registration ---------------------------------------------------------------------------


async def test_registers_as_a_dra_plugin_with_both_service_versions(start_driver, roots):
    drv = await start_driver("3f6c2b1e-pod-uid")
    [sock] = registration_sockets(roots[0])
    assert os.path.basename(sock) == "topo.dev-3f6c2b1e-pod-uid-reg.sock"
    plugin = await register(sock)
    assert (plugin.name, plugin.service) == (DRIVER, "v1.DRAPlugin")
    assert plugin.endpoint == os.path.join(roots[0], "plugins", DRIVER, "dra-3f6c2b1e-pod-uid.sock")
    for path in (sock, plugin.endpoint):
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert drv.registration.status == (True, "")


async def test_a_refused_registration_is_recorded(start_driver, roots):
    drv = await start_driver()
    # A kubelet that knows no DRA service version we serve refuses us and says why.
    with pytest.raises(AssertionError, match="none of services"):
        await register(registration_sockets(roots[0])[0], kubelet_services=("v1alpha4.DRAPlugin",))
    registered, error = drv.registration.status
    assert not registered and "none of services" in error


# ---- prepare / unprepare ------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_prepare_then_unprepare(version, start_driver, roots, apiserver):
    await start_driver()
    plugin = await register(registration_sockets(roots[0])[0], KUBELETS[version])
    assert plugin.version == version
    uid = apiserver.add_claim("team", "pair", PAIR)

    resp = await plugin.prepare(("team", uid, "pair"))
    entry = resp.claims[uid]
    assert entry.error == ""
    got = [(d.pool_name, d.device_name, list(d.request_names), list(d.cdi_device_ids)) for d in entry.devices]
    assert got == [(NODE, r["device"], [r["request"]], [f"{DRIVER}/claim={uid}-{r['device']}"]) for r in PAIR]
    spec = cdi_spec(roots[1], uid)
    assert spec["kind"] == f"{DRIVER}/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-{r['device']}" for r in PAIR]
    assert checkpoint(roots[0])[uid]["namespace"] == "team"

    resp = await plugin.unprepare(("team", uid, "pair"))
    assert resp.claims[uid].error == ""
    assert not os.path.exists(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"))
    assert uid not in checkpoint(roots[0])


async def test_prepare_is_idempotent_per_claim_uid(start_driver, roots, apiserver):
    cdi = CountingCdi(roots[1])
    await start_driver(cdi=cdi)
    plugin = await register(registration_sockets(roots[0])[0])
    uid = apiserver.add_claim("team", "pair", PAIR)
    first = await plugin.prepare(("team", uid, "pair"))
    # The claim changes in the API meanwhile: a prepared claim keeps its answer until unprepared.
    apiserver.claims[("team", "pair")]["status"]["allocation"]["devices"]["results"] = [result("gpu-7")]
    second = await plugin.prepare(("team", uid, "pair"))
    assert second == first
    assert cdi.writes == [uid]


async def test_concurrent_prepares_of_one_claim_prepare_it_once(start_driver, roots, apiserver):
    cdi = CountingCdi(roots[1])
    await start_driver(cdi=cdi)
    plugin = await register(registration_sockets(roots[0])[0])
    uid = apiserver.add_claim("team", "pair", PAIR)
    answers = await asyncio.gather(*(plugin.prepare(("team", uid, "pair")) for _ in range(8)))
    assert all(a == answers[0] and a.claims[uid].error == "" for a in answers)
    assert cdi.writes == [uid]


async def test_unprepare_of_an_unknown_claim_succeeds(start_driver, roots):
    await start_driver()
    plugin = await register(registration_sockets(roots[0])[0])
    resp = await plugin.unprepare(("team", "never-prepared-uid", "ghost"))
    assert list(resp.claims) == ["never-prepared-uid"] and resp.claims["never-prepared-uid"].error == ""


async def test_each_bad_claim_fails_alone(start_driver, roots, apiserver, dgx_h100):
    await start_driver(topology=dgx_h100.with_health({"GPU5": "Unhealthy"}))
    plugin = await register(registration_sockets(roots[0])[0])
    good = apiserver.add_claim("team", "good", [result("gpu-2")])
    unallocated = apiserver.add_claim("team", "pending", None)
    foreign = apiserver.add_claim("team", "foreign", [result("gpu-0", driver="gpu.nvidia.com")])
    other_pool = apiserver.add_claim("team", "elsewhere", [result("gpu-0", pool="node-b")])
    gone = apiserver.add_claim("team", "gone", [result("gpu-9")])
    sick = apiserver.add_claim("team", "sick", [result("gpu-5")])
    stale = apiserver.add_claim("team", "stale", [result("gpu-3")])
    resp = await plugin.prepare(("team", good, "good"), ("team", unallocated, "pending"),
                                ("team", foreign, "foreign"), ("team", other_pool, "elsewhere"),
                                ("team", gone, "gone"), ("team", sick, "sick"), ("team", "old-uid", "stale"),
                                ("team", "missing-uid", "missing"))
    errors = {uid: e.error for uid, e in resp.claims.items()}
    assert errors[good] == ""
    assert "no devices allocated from driver topo.dev" in errors[unallocated]
    assert "no devices allocated from driver topo.dev" in errors[foreign]
    assert "from pool node-b" in errors[other_pool]
    assert "gpu-9 is not on this node" in errors[gone]
    assert "gpu-5 (GPU5) is Unhealthy" in errors[sick]
    assert f"has UID {stale}, the kubelet asked for old-uid" in errors["old-uid"]
    assert "team/missing not found" in errors["missing-uid"]
    assert set(checkpoint(roots[0])) == {good}


async def test_a_claim_listed_twice_is_an_invalid_request(start_driver, roots, apiserver):
    await start_driver()
    plugin = await register(registration_sockets(roots[0])[0])
    uid = apiserver.add_claim("team", "pair", PAIR)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await plugin.prepare(("team", uid, "pair"), ("team", uid, "pair"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "listed twice" in e.value.details()


# ---- restarts and rolling updates ------------------------------------------------------------


async def test_restart_keeps_prepared_claims_and_never_prepares_twice(start_driver, roots, apiserver):
    cdi = CountingCdi(roots[1])
    first = await start_driver("pod-1", cdi=cdi)
    plugin = await register(registration_sockets(roots[0])[0])
    a = apiserver.add_claim("team", "a", PAIR)
    b = apiserver.add_claim("team", "b", [result("gpu-4")])
    before = await plugin.prepare(("team", a, "a"))
    await first.stop()
    assert registration_sockets(roots[0]) == []  # the kubelet deregisters the stopped instance

    cdi2 = CountingCdi(roots[1])
    await start_driver("pod-2", cdi=cdi2)
    plugin = await register(registration_sockets(roots[0])[0])
    # The kubelet repeats the prepare after the restart: answered from the checkpoint,
    # even though the claim is gone from the API by now.
    del apiserver.claims[("team", "a")]
    after = await plugin.prepare(("team", a, "a"))
    assert after == before and cdi2.writes == []
    assert (await plugin.prepare(("team", b, "b"))).claims[b].error == ""
    assert (await plugin.unprepare(("team", a, "a"))).claims[a].error == ""
    assert set(checkpoint(roots[0])) == {b}
    assert cdi.writes + cdi2.writes == [a, b]


async def test_two_instances_serve_side_by_side_during_a_rolling_update(start_driver, roots, apiserver):
    old = await start_driver("old-pod")
    new = await start_driver("new-pod")
    socks = registration_sockets(roots[0])
    assert [os.path.basename(s) for s in socks] == ["topo.dev-new-pod-reg.sock", "topo.dev-old-pod-reg.sock"]
    plugins = {os.path.basename(s): await register(s) for s in socks}
    via_old, via_new = plugins["topo.dev-old-pod-reg.sock"], plugins["topo.dev-new-pod-reg.sock"]
    assert via_old.endpoint != via_new.endpoint
    uid = apiserver.add_claim("team", "pair", PAIR)
    # Prepared through one instance, unprepared through the other: they share the checkpoint.
    assert (await via_old.prepare(("team", uid, "pair"))).claims[uid].error == ""
    assert (await via_new.prepare(("team", uid, "pair"))) == (await via_old.prepare(("team", uid, "pair")))
    await old.stop()
    assert registration_sockets(roots[0]) == [via_new.socket]  # the old pod removed only its own sockets
    assert (await via_new.unprepare(("team", uid, "pair"))).claims[uid].error == ""
    assert checkpoint(roots[0]) == {}
    assert new.registration.status == (True, "")


async def test_sockets_left_by_a_killed_instance_are_removed_live_ones_kept(start_driver, roots):
    reg_dir = os.path.join(roots[0], "plugins_registry")
    plugin_dir = os.path.join(roots[0], "plugins", DRIVER)
    os.makedirs(reg_dir)
    os.makedirs(plugin_dir)

    def bound(path: str, listen: bool) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        if listen:
            s.listen(1)
        return s

    dead = [bound(os.path.join(reg_dir, "topo.dev-killed-reg.sock"), False),
            bound(os.path.join(plugin_dir, "dra-killed.sock"), False)]
    live = bound(os.path.join(reg_dir, "topo.dev-running-reg.sock"), True)
    other = bound(os.path.join(reg_dir, "gpu.nvidia.com-reg.sock"), False)  # not ours: never touched
    try:
        await start_driver("pod-1")
        names = sorted(os.listdir(reg_dir))
        assert names == ["gpu.nvidia.com-reg.sock", "topo.dev-pod-1-reg.sock", "topo.dev-running-reg.sock"]
        assert os.listdir(plugin_dir).count("dra-killed.sock") == 0
    finally:
        for s in (*dead, live, other):
            s.close()


async def test_a_corrupt_checkpoint_stops_start_up_and_is_kept(start_driver, roots):
    path = os.path.join(roots[0], "plugins", DRIVER, "checkpoint.json")
    os.makedirs(os.path.dirname(path))
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"version": 1, "claims": {"x": {"uid": "x"}}, "checksum": "0"}')
    with pytest.raises(CheckpointError, match=f"checkpoint {path}: checksum mismatch"):
        await start_driver()
    assert os.path.exists(path)


async def test_subrequests_of_a_prioritized_list_report_their_parent_request(start_driver, roots, apiserver):
    """firstAvailable: the allocation names `<request>/<subrequest>`; the kubelet matches containers by `<request>`."""
    await start_driver()
    plugin = await register(registration_sockets(roots[0])[0])
    uid = apiserver.add_claim("team", "either", [result("gpu-0", "gpu/h100"), result("nic-mlx5-0", "gpu/h100")])
    [a, b] = (await plugin.prepare(("team", uid, "either"))).claims[uid].devices
    assert list(a.request_names) == list(b.request_names) == ["gpu"]


# ---- identity: what the container is told is what the claim selected on (issue 18) ---------------


@pytest.mark.parametrize("node", ["dgx-h100", "14-hgx-h100-8gpu-nv18-6nic-empty-cpu-affinity.txt"])
async def test_a_simulated_gpu_without_a_uuid_is_named_in_the_container_by_its_published_uuid(
        node, start_driver, roots, apiserver, shared_topologies):
    from plugin.model.resources import gpu_id
    from plugin.sources import load_topology

    path = next((p for p in shared_topologies if p.name == node), None)
    topology = load_topology(str(path) if path else node)
    assert topology.gpus and all(g.uuid is None for g in topology.gpus)  # the case: no uuid in the node file
    await start_driver(topology=topology)
    deadline = asyncio.get_running_loop().time() + 30
    while not any(d["name"] == "gpu-3" for s in apiserver.slices.values() for d in s["spec"].get("devices", ())):
        assert asyncio.get_running_loop().time() < deadline, "the driver published no slice with gpu-3"
        await asyncio.sleep(0.02)
    [published] = [d for s in apiserver.slices.values() for d in s["spec"]["devices"] if d["name"] == "gpu-3"]
    uuid = published["attributes"]["uuid"]["string"]
    assert uuid.startswith("GPU-")

    plugin = await register(registration_sockets(roots[0])[0])
    uid = apiserver.add_claim("team", "by-uuid", [result("gpu-3", "gpu")])
    assert (await plugin.prepare(("team", uid, "by-uuid"))).claims[uid].error == ""
    [device] = cdi_spec(roots[1], uid)["devices"]
    assert f"TOPO_DEV_GPU_3={uuid}" in device["containerEdits"]["env"]
    # and the device-plugin side serves the same GPU under the same ID
    assert gpu_id(topology, topology.device("GPU3"), "uuid") == uuid


# ---- many claims in one call (issue 19) --------------------------------------------------------------


async def test_a_many_claim_call_writes_the_checkpoint_once_per_batch(start_driver, roots, apiserver):
    drv = await start_driver()
    plugin = await register(registration_sockets(roots[0])[0])
    batch = drv.options.prepare_limits.batch
    n = 2 * batch + 3
    claims = [("team", apiserver.add_claim("team", f"c{i}", [result(f"gpu-{i % 8}")]), f"c{i}") for i in range(n)]
    before = drv.checkpoint.writes
    resp = await plugin.prepare(*claims)
    assert all(resp.claims[u].error == "" for _, u, _ in claims)
    assert drv.checkpoint.writes - before == 3  # ceil(n / batch), not n
    assert set(checkpoint(roots[0])) == {u for _, u, _ in claims}

    # Asked again: answered from the checkpoint, nothing written.
    before = drv.checkpoint.writes
    assert await plugin.prepare(*claims) == resp
    assert drv.checkpoint.writes == before

    resp = await plugin.unprepare(*claims)
    assert all(resp.claims[u].error == "" for _, u, _ in claims)
    assert drv.checkpoint.writes - before == 3
    assert checkpoint(roots[0]) == {} and os.listdir(roots[1]) == []


async def test_a_claim_whose_spec_cannot_be_written_fails_alone_and_leaves_no_record(start_driver, roots, apiserver):
    class FailingForOne(CountingCdi):
        def write_claim_spec(self, claim_uid, devices, settings=None):
            if claim_uid == bad:
                raise OSError(28, "No space left on device")
            return super().write_claim_spec(claim_uid, devices, settings)

    await start_driver(cdi=FailingForOne(roots[1]))
    plugin = await register(registration_sockets(roots[0])[0])
    good = apiserver.add_claim("team", "good", [result("gpu-0")])
    bad = apiserver.add_claim("team", "bad", [result("gpu-1")])
    resp = await plugin.prepare(("team", good, "good"), ("team", bad, "bad"))
    assert resp.claims[good].error == ""
    assert "No space left on device" in resp.claims[bad].error
    assert set(checkpoint(roots[0])) == {good}
