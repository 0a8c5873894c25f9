"""A pod's NICs into its network namespace and back, driven by the sandbox events NRI delivers (issue 21).

Real parts: the claims come from the stand-in API server over HTTP and their status goes back to it as a
server-side apply; prepare and unprepare run the driver's ClaimPreparer on a real checkpoint and real CDI
directory; the NICs are veth pairs (tests/netattach/netattach_testlib.py) moved by the real NetAttacher into
real network namespaces, checked with `ip` and `nsenter`, never through the code under test. Only the NRI
connection is left out here (its events are the handler's methods); tests/dra/test_netdev_attach.py drives
the whole driver from a real NRI runtime.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import uuid

import pytest

from plugin.dra.kubelet.cdi import ClaimSpecs
from plugin.dra.kubelet.checkpoint import ClaimCheckpoint
from plugin.dra.claims.status import ClaimStatusWriter
from plugin.dra.network.nic_config import API_VERSION, KIND
from plugin.dra.network.pod_network import PodNetwork
from plugin.dra.claims.prepared import ClaimRef
from plugin.dra.kubelet.prepare import ClaimPreparer
from plugin.dra.slices.build import SliceOptions
from plugin.nri import PodSandbox as Sandbox

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "netattach"))

from claim_validation import api_server_accepts
from netattach_testlib import ip_json, link, net, node_with_netdevs  # noqa: F401 (net: the fixture)

DRIVER = "topo.dev"
NODE = "node-a"




@pytest.fixture
def dirs(short_tmp):
    return short_tmp  # unix socket paths are short (tests/conftest.py)


class Side:
    """The driver's NIC side on one node: preparer + pod network over one checkpoint and one ledger."""

    def __init__(self, dirs: str, kube_api, topology, *, connected: bool = True, nccl_env: bool = False):
        from plugin.netattach import NetAttacher, exists, max_mtu

        opts = SliceOptions(node_name=NODE, driver_name=DRIVER)
        self.checkpoint = ClaimCheckpoint(os.path.join(dirs, "checkpoint.json"), os.path.join(dirs, "lock"), DRIVER)
        self.status = ClaimStatusWriter(kube_api, DRIVER, retry_initial_s=0.05)
        self.attacher = NetAttacher(os.path.join(dirs, "netattach.json"), settle_s=0.5)
        self.network = PodNetwork(driver=DRIVER, pool=NODE, checkpoint=self.checkpoint, attacher=self.attacher,
                                  status=self.status, probe=lambda n: max_mtu(n) if exists(n) else None,
                                  connected=lambda: connected)
        self.cdi = ClaimSpecs(os.path.join(dirs, "cdi"), DRIVER, nccl_topology=(lambda: topology) if nccl_env else None)
        self.preparer = ClaimPreparer(options=opts, checkpoint=self.checkpoint, cdi=self.cdi,
            read_claim=kube_api.get_claim, topology=lambda: topology,
            network=self.network)
        self.status.start()

    async def close(self) -> None:
        await self.status.stop()


@pytest.fixture
async def side(dirs, kube_api):
    made: list[Side] = []

    def make(topology, **kw) -> Side:
        s = Side(dirs, kube_api, topology, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        await s.close()


def nic_config(requests, **params) -> dict:
    return {"requests": requests, "opaque": {"driver": DRIVER, "parameters": {"apiVersion": API_VERSION,
                                                                             "kind": KIND, **params}}}


def results(*devices: tuple[str, str]) -> list[dict]:
    return [{"request": r, "driver": DRIVER, "pool": NODE, "device": d} for d, r in devices]


def addresses(netns: str, ifname: str) -> list[str]:
    [entry] = ip_json(netns, "addr", "show", "dev", ifname)
    return sorted(f"{a['local']}/{a['prefixlen']}" for a in entry["addr_info"] if a.get("scope") != "link")


async def test_a_pod_gets_its_nics_configured_and_the_claim_says_so_then_gives_them_back(net, side, apiserver,
                                                                                          claim_validator):
    a, b = net.veth(mtu=1500), net.veth(mtu=1500)
    s = side(node_with_netdevs(a.name, b.name))
    pod = Sandbox(str(uuid.uuid4()), "team", "trainer", net.netns())
    uid = apiserver.add_claim("team", "pair", results(("gpu-0", "gpus"), ("nic-nic0", "nic0"), ("nic-nic1", "nic1")),
                              config=[nic_config(["nic0"], interfaceName="net1", addresses=["192.0.2.10/24"],
                                                 routes=[{"destination": "198.51.100.0/24",
                                                          "gateway": "192.0.2.1"}], mtu=9000),
                                      nic_config(["nic1"], interfaceName="net2", addresses=["192.0.2.11/24"])],
                              pods=[pod.uid])
    prepared = await s.preparer.prepare(ClaimRef("team", uid, "pair"))
    assert prepared.pods == (pod.uid,)
    assert {d.device: (d.network.host_name, d.network.pod_name) for d in prepared.devices if d.network} == {
        "nic-nic0": (a.name, "net1"), "nic-nic1": (b.name, "net2")}
    assert link(None, a.name) is not None  # prepare moves nothing: the pod's namespace does not exist yet

    await s.network.run_pod_sandbox(pod)
    assert link(None, a.name) is None and link(None, b.name) is None
    net1, net2 = link(pod.netns, "net1"), link(pod.netns, "net2")
    assert (net1["address"], net1["mtu"], "UP" in net1["flags"]) == (a.mac, 9000, True)
    assert (net2["address"], net2["mtu"]) == (b.mac, 1500)
    assert addresses(pod.netns, "net1") == ["192.0.2.10/24"] and addresses(pod.netns, "net2") == ["192.0.2.11/24"]
    routes = {r["dst"]: r for r in ip_json(pod.netns, "route", "show")}
    assert routes["198.51.100.0/24"]["gateway"] == "192.0.2.1" and routes["198.51.100.0/24"]["dev"] == "net1"

    await s.status.flush()
    status = {d["device"]: d for d in apiserver.claim_devices("team", "pair")}
    assert set(status) == {"nic-nic0", "nic-nic1"}  # GPUs get no entry
    assert status["nic-nic0"]["networkData"] == {"interfaceName": "net1", "ips": ["192.0.2.10/24"],
                                                 "hardwareAddress": a.mac}
    assert status["nic-nic1"]["networkData"]["interfaceName"] == "net2"
    assert [(c["type"], c["status"], c["reason"]) for c in status["nic-nic0"]["conditions"]] == [
        ("Ready", "True", "InterfaceAttached")]
    (ns, name, manager, force, _) = apiserver.status_applies[-1]
    assert (ns, name, manager, force) == ("team", "pair", DRIVER, True)
    # What we wrote is what a 1.37 API server takes, and the permission it asks for is the chart's RBAC rule.
    asked = api_server_accepts(claim_validator, apiserver.claims[("team", "pair")])
    assert f"associated-node:patch resourceclaims/driver {DRIVER}" in asked

    await s.network.stop_pod_sandbox(pod)
    for v in (a, b):
        back = link(None, v.name)
        assert back is not None and back["address"] == v.mac and back["mtu"] == 1500
    assert link(pod.netns, "net1") is None
    await s.network.remove_pod_sandbox(pod)  # after stop: nothing left to do, nothing fails
    await s.status.flush()
    assert apiserver.claim_devices("team", "pair") == []
    await s.preparer.unprepare(ClaimRef("team", uid, "pair"))
    assert await s.checkpoint.read() == {}


async def test_the_container_is_told_the_interface_names_it_will_have_in_the_pod(net, side, apiserver):
    a, b = net.veth(), net.veth()
    s = side(node_with_netdevs(a.name, b.name), nccl_env=True)
    uid = apiserver.add_claim("team", "named", results(("gpu-0", "gpus"), ("nic-nic0", "nic0"), ("nic-nic1", "nic1")),
                              config=[nic_config(["nic0"], interfaceName="fabric0")], pods=[str(uuid.uuid4())])
    await s.preparer.prepare(ClaimRef("team", uid, "named"))
    with open(s.cdi.spec_path(uid)) as f:
        spec = json.load(f)
    env = [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
    env += spec.get("containerEdits", {}).get("env", [])
    netdevs = sorted(e.split("=", 1)[1] for e in env if e.startswith("TOPO_DEV_") and "_NETDEV=" in e)
    # nic0 is renamed by its NicConfig, nic1 keeps its host name in the pod.
    assert netdevs == sorted(["fabric0", b.name])
    [hint] = [e for e in env if e.startswith("NCCL_SOCKET_IFNAME=")]
    assert set(hint.split("==", 1)[1].split(",")) == {"fabric0", b.name}


async def test_a_bad_config_fails_prepare_moves_nothing_and_says_why_on_the_claim(net, side, apiserver,
                                                                                  claim_validator):
    a = net.veth()
    s = side(node_with_netdevs(a.name))
    good = apiserver.add_claim("team", "good", results(("gpu-0", "gpus")))
    await s.preparer.prepare(ClaimRef("team", good, "good"))
    before = open(s.checkpoint.path, encoding="utf-8").read()
    uid = apiserver.add_claim("team", "bad", results(("nic-nic0", "nic")),
                              config=[nic_config(["nic"], interfaceName="net1", mtu=70000)], pods=["p1"])
    out = await s.preparer.prepare_many([ClaimRef("team", uid, "bad")])
    error = str(out[uid])
    assert "spec.devices.config[0].opaque.parameters.mtu: 70000 is above" in error and "fix: give at most" in error
    assert open(s.checkpoint.path, encoding="utf-8").read() == before
    assert link(None, a.name) is not None
    await s.status.flush()
    [entry] = apiserver.claim_devices("team", "bad")
    [cond] = entry["conditions"]
    assert (entry["device"], cond["status"], cond["reason"]) == ("nic-nic0", "False", "InvalidNicConfig")
    assert "70000 is above" in cond["message"]
    api_server_accepts(claim_validator, apiserver.claims[("team", "bad")])


async def test_without_nri_a_config_is_refused_saying_how_to_turn_it_on(net, side, apiserver):
    a = net.veth()
    s = side(node_with_netdevs(a.name), connected=False)
    uid = apiserver.add_claim("team", "c", results(("nic-nic0", "nic")), config=[nic_config(["nic"], mtu=1500)])
    with pytest.raises(Exception, match=r"not connected to the container runtime's NRI socket .*fix: turn NRI on"):
        await s.preparer.prepare(ClaimRef("team", uid, "c"))
    plain = apiserver.add_claim("team", "plain", results(("nic-nic0", "nic")))
    prepared = await s.preparer.prepare(ClaimRef("team", plain, "plain"))
    assert [d.network for d in prepared.devices] == [None]  # served as before: the NIC stays in the node


async def test_unprepare_gives_the_nics_back_before_the_claim_is_forgotten(net, side, apiserver):
    a = net.veth()
    s = side(node_with_netdevs(a.name))
    pod = Sandbox(str(uuid.uuid4()), "team", "p", net.netns())
    uid = apiserver.add_claim("team", "c", results(("nic-nic0", "nic")), pods=[pod.uid])
    await s.preparer.prepare(ClaimRef("team", uid, "c"))
    await s.network.run_pod_sandbox(pod)
    assert link(pod.netns, a.name) is not None  # no NicConfig: the NIC keeps its name in the pod
    await s.preparer.unprepare(ClaimRef("team", uid, "c"))  # e.g. the sandbox events were missed
    assert link(None, a.name)["address"] == a.mac
    assert await s.checkpoint.read() == {}


async def test_a_restarted_driver_returns_nics_of_pods_that_went_and_attaches_pods_it_missed(net, side, apiserver):
    a, b = net.veth(), net.veth()
    topo = node_with_netdevs(a.name, b.name)
    s = side(topo)
    gone = Sandbox(str(uuid.uuid4()), "team", "gone", net.netns())
    missed = Sandbox(str(uuid.uuid4()), "team", "missed", net.netns())
    c1 = apiserver.add_claim("team", "c1", results(("nic-nic0", "nic")), pods=[gone.uid])
    c2 = apiserver.add_claim("team", "c2", results(("nic-nic1", "nic")),
                             config=[nic_config(["nic"], interfaceName="net1")], pods=[missed.uid])
    await s.preparer.prepare(ClaimRef("team", c1, "c1"))
    await s.preparer.prepare(ClaimRef("team", c2, "c2"))
    await s.network.run_pod_sandbox(gone)
    assert link(gone.netns, a.name) is not None
    await s.close()

    # A new instance (same checkpoint and ledger): the first pod went while it was down, the second started.
    again = side(topo)
    await again.network.synchronize([missed])
    assert link(None, a.name)["address"] == a.mac
    assert link(missed.netns, "net1")["address"] == b.mac
    await again.status.flush()
    assert apiserver.claim_devices("team", "c1") == []
    assert [d["networkData"]["interfaceName"] for d in apiserver.claim_devices("team", "c2")] == ["net1"]
    await again.network.synchronize([missed])  # nothing moves twice
    assert link(missed.netns, "net1")["address"] == b.mac


async def test_pods_without_our_nics_are_left_alone(net, side, apiserver):
    s = side(node_with_netdevs(net.veth().name))
    uid = apiserver.add_claim("team", "gpu", results(("gpu-0", "gpus")), pods=["p-gpu"])
    await s.preparer.prepare(ClaimRef("team", uid, "gpu"))
    netns = net.netns()
    await s.network.run_pod_sandbox(Sandbox("p-gpu", "team", "gpu-pod", netns))
    await s.network.run_pod_sandbox(Sandbox("p-other", "team", "other", netns))
    assert [x["ifname"] for x in ip_json(netns, "link", "show")] == ["lo"]
    await s.status.flush()
    assert apiserver.status_applies == []


async def test_a_claim_prepared_by_the_other_instance_is_attached_at_the_next_sandbox_start(net, side, apiserver):
    """During a rolling update two instances share the checkpoint; the sandbox side keeps the parsed file
    between pod starts, and must still see what the other instance prepared."""
    a = net.veth()
    topo = node_with_netdevs(a.name)
    ours, other = side(topo), side(topo)
    netns = net.netns()
    await ours.network.run_pod_sandbox(Sandbox("p-plain", "team", "plain", netns))  # the file is read and kept
    pod = Sandbox(str(uuid.uuid4()), "team", "late", net.netns())
    uid = apiserver.add_claim("team", "late", results(("nic-nic0", "nic")), pods=[pod.uid])
    await other.preparer.prepare(ClaimRef("team", uid, "late"))
    await ours.network.run_pod_sandbox(pod)
    assert link(pod.netns, a.name)["address"] == a.mac
    await ours.network.stop_pod_sandbox(pod)
    assert link(None, a.name)["address"] == a.mac


async def test_two_claims_of_one_pod_asking_one_interface_name_the_second_is_refused_before_the_sandbox(
        net, side, apiserver):
    """The kubelet prepares a pod's claims of one driver in one call; the clash is found there, not when the
    sandbox starts (where a failure came after the sandbox existed, issue 35)."""
    a, b = net.veth(), net.veth()
    s = side(node_with_netdevs(a.name, b.name))
    pod = Sandbox(str(uuid.uuid4()), "team", "two", net.netns())
    first = apiserver.add_claim("team", "first", results(("nic-nic0", "nic")),
                                config=[nic_config(["nic"], interfaceName="net1")], pods=[pod.uid])
    second = apiserver.add_claim("team", "second", results(("nic-nic1", "nic")),
                                 config=[nic_config(["nic"], interfaceName="net1")], pods=[pod.uid])
    out = await s.preparer.prepare_many([ClaimRef("team", first, "first"), ClaimRef("team", second, "second")])
    assert out[first].pods == (pod.uid,)
    error = str(out[second])
    assert error.startswith("ResourceClaim team/second: device nic-nic1: interface name net1 is already given to "
                            "device nic-nic0 of ResourceClaim team/first, prepared for the same pod"), error
    assert "fix: set interfaceName" in error
    assert set(await s.checkpoint.read()) == {first}
    await s.status.flush()
    [entry] = apiserver.claim_devices("team", "second")
    assert (entry["conditions"][0]["reason"], entry["conditions"][0]["status"]) == ("InvalidNicConfig", "False")
    # Another pod may use the same name: each pod has its own namespace.
    other = apiserver.add_claim("team", "other", results(("nic-nic1", "nic")),
                                config=[nic_config(["nic"], interfaceName="net1")], pods=[str(uuid.uuid4())])
    assert (await s.preparer.prepare(ClaimRef("team", other, "other"))).networks[0][1].pod_name == "net1"


async def test_an_address_another_prepared_claim_holds_is_refused_naming_it_until_that_claim_goes(net, side, apiserver):
    a, b = net.veth(), net.veth()
    s = side(node_with_netdevs(a.name, b.name))
    holder = apiserver.add_claim("team", "holder", results(("nic-nic0", "nic")),
                                 config=[nic_config(["nic"], interfaceName="net1", addresses=["192.168.80.41/24"])],
                                 pods=[str(uuid.uuid4())])
    await s.preparer.prepare(ClaimRef("team", holder, "holder"))
    late = apiserver.add_claim("team", "late", results(("nic-nic1", "nic")),
                               config=[nic_config(["nic"], interfaceName="net1",
                                                  addresses=["192.168.80.7/24", "192.168.80.41/24"])],
                               pods=[str(uuid.uuid4())])
    with pytest.raises(Exception) as e:
        await s.preparer.prepare(ClaimRef("team", late, "late"))
    assert str(e.value).startswith("ResourceClaim team/late: device nic-nic1: address 192.168.80.41/24 is already "
                                   "held by device nic-nic0 of ResourceClaim team/holder"), str(e.value)
    assert link(None, b.name) is not None  # nothing moved
    await s.preparer.unprepare(ClaimRef("team", holder, "holder"))
    prepared = await s.preparer.prepare(ClaimRef("team", late, "late"))  # the kubelet's retry, once it is free
    assert prepared.networks[0][1].addresses == ("192.168.80.7/24", "192.168.80.41/24")


async def test_a_claim_with_nics_reserved_for_two_pods_is_refused(net, side, apiserver):
    a = net.veth()
    s = side(node_with_netdevs(a.name))
    shared = apiserver.add_claim("team", "shared", results(("gpu-0", "gpus"), ("nic-nic0", "nic")),
                                 pods=["pod-a", "pod-b"])
    with pytest.raises(Exception, match=r"reserved for 2 pods \(pod-a, pod-b\); a network interface can be in one "
                                        r"pod only \(fix: give each pod its own claim"):
        await s.preparer.prepare(ClaimRef("team", shared, "shared"))
    gpus = apiserver.add_claim("team", "gpus", results(("gpu-0", "gpus")), pods=["pod-a", "pod-b"])
    assert (await s.preparer.prepare(ClaimRef("team", gpus, "gpus"))).pods == ("pod-a", "pod-b")  # GPUs only: fine


async def test_a_pod_stopped_while_the_driver_was_away_is_said_so_once_and_nothing_is_attached(
        net, side, apiserver, caplog):
    """After a driver restart during a teardown, NRI's synchronize still lists the stopped sandbox with
    the path of its network namespace, which is gone: the pod is not attached to (that used to log
    `attaching a running pod's NICs failed ... No such file or directory` at every reconnection)."""
    a = net.veth()
    s = side(node_with_netdevs(a.name))
    stopped = Sandbox(str(uuid.uuid4()), "team", "stopped", f"/var/run/netns/gone-{uuid.uuid4().hex[:8]}")
    uid = apiserver.add_claim("team", "c", results(("nic-nic0", "nic")), pods=[stopped.uid])
    await s.preparer.prepare(ClaimRef("team", uid, "c"))
    caplog.set_level("INFO", logger="plugin.dra.network.pod_network")
    await s.network.synchronize([stopped])
    await s.network.synchronize([stopped])  # the runtime reconnects: not said again
    said = [r.getMessage() for r in caplog.records if r.name == "plugin.dra.network.pod_network"]
    assert said.count("pod is stopped (its network namespace is gone): its NICs stay in the node") == 1, said
    assert not [m for m in said if "failed" in m], said
    assert link(None, a.name)["address"] == a.mac
