"""GPU–NIC pairing through the daemon, driven over real gRPC by the kubelet's call sequence.

The daemon runs in this process (so its pairing clock can be driven by hand)
and serves a simulated DGX H100 (each GPU has one NIC on its PCIe switch,
`PIX`) on real unix sockets; the kubelet stand-in's device-manager walk
(`topo_testkit.device_manager`) makes the kubelet's calls: per container its
resources one after another, GetPreferredAllocation only where the kubelet
has a choice, then Allocate, init-container devices reused. Every preferred
answer is checked against the spec read literally (`topo_testkit.pairing_oracle`:
the partners from the call log, every set ranked by the criteria with partners),
and the devices each container ends up with against the PIX pairs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import AsyncIterator

import grpc
import pytest
from daemon_testlib import GPU, NIC, allocate_request, preferred_request
from prometheus_client import generate_latest
from topo_testkit.pairing_oracle import LoggedCall, Oracle, oracle_for, spec_partners
from topo_testkit.pod_resources_standin import PodResourcesStandin

from plugin.api import api_pb2_grpc
from plugin.runtime.daemon import Daemon, DaemonOptions
from topo_testkit.device_manager import StandinDeviceManager, pod
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated
from plugin.sources.simulated.source import SimulatedSource

NODE = "dgx-h100"
#: Far above any gap between one container's calls, however loaded the machine: groups end by
#: the rule's other condition (a call for a resource already in the group), not by time.
LONG_WINDOW_S = 600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def node(plugin_dir: str, window_s: float = LONG_WINDOW_S, clock: Clock | None = None,
               **options: object) -> AsyncIterator[tuple[Daemon, KubeletStandin]]:
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    daemon = Daemon(SimulatedSource(NODE), DaemonOptions(plugin_dir=plugin_dir, **options),
                    ResourceOptions(device_id_strategy="index", pairing_window_s=window_s),
                    clock=clock or Clock())
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        await kubelet.wait_for(lambda: all(kubelet.devices(r) for r in (GPU, NIC)), timeout=20)
        yield daemon, kubelet
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
        await kubelet.stop()


def oracle() -> Oracle:
    topology = load_simulated(NODE)
    return oracle_for(topology, build_resources(topology, ResourceOptions(device_id_strategy="index")))


def check_calls(dm: StandinDeviceManager, window_s: float | None) -> list[dict]:
    """Every GetPreferredAllocation answer is the spec's optimum with the spec's partners; returns the partners."""
    calls = [LoggedCall(c.method, c.resource, c.ids) for c in dm.calls]
    partners = spec_partners(calls, window_s)
    o = oracle()
    prefs = [c for c in dm.calls if c.method == "GetPreferredAllocation"]
    assert len(prefs) == len(partners)
    for call, p in zip(prefs, partners):
        problem = o.check(call.resource, call.available, call.must_include, call.size, p, call.ids)
        assert problem is None, f"{call.pod}/{call.container}: {problem}"
    return partners


def pix_pairs(got: dict[str, tuple[str, ...]]) -> int:
    """How many of a container's GPUs have their own PIX NIC in it (DGX H100: GPU i ~ mlx5_i)."""
    return len({i for i in got.get(GPU, ())} & {n.removeprefix("mlx5_") for n in got.get(NIC, ())})


async def test_gpus_then_nics_and_nics_then_gpus_are_paired(plugin_dir):
    async with node(plugin_dir) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(1), shuffle_resources=False)
        # Asymmetric free sets first (a GPU-only and a NIC-only pod), so a blind choice would not pair.
        await dm.admit(pod("gpus", {GPU: 2}, names=("c",)))
        await dm.admit(pod("nics", {NIC: 1}, names=("c",)))
        first = await dm.admit(pod("gpu-first", {GPU: 1, NIC: 1}, names=("c",)))
        dm.release("gpus")  # GPUs 0 and 1 free again while mlx5_0 stays taken: still asymmetric
        second = await dm.admit(pod("nic-first", {NIC: 2, GPU: 2}, names=("c",)))
    partners = check_calls(dm, None)
    assert pix_pairs(first["c"]) == 1 and pix_pairs(second["c"]) == 2
    # The NIC request of the first pair and the GPU request of the second had the container's own devices.
    assert {GPU: first["c"][GPU]} in partners and {NIC: second["c"][NIC]} in partners


async def test_without_pairing_the_same_pods_are_not_paired(plugin_dir):
    """The control of the test above (window 0): the spec's objectives without partners, blind choices."""
    async with node(plugin_dir, window_s=0.0) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(1), shuffle_resources=False)
        await dm.admit(pod("gpus", {GPU: 2}, names=("c",)))
        await dm.admit(pod("nics", {NIC: 1}, names=("c",)))
        first = await dm.admit(pod("gpu-first", {GPU: 1, NIC: 1}, names=("c",)))
    assert all(p == {} for p in check_calls(dm, 0))
    assert pix_pairs(first["c"]) == 0


async def test_init_container_devices_are_reused_and_pairing_follows_the_container(plugin_dir):
    async with node(plugin_dir) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(2), shuffle_resources=False)
        await dm.admit(pod("busy", {GPU: 2, NIC: 1}, names=("c",)))
        got = await dm.admit(pod("pod", {GPU: 3, NIC: 3}, init={GPU: 1, NIC: 1}, names=("app",)))
        dm.release("busy")  # mlx5_1's GPU free again, so the next pod's NIC can have its PIX GPU
        same = await dm.admit(pod("same", {GPU: 1, NIC: 1}, init={NIC: 1, GPU: 1}, names=("app",)))
    check_calls(dm, None)
    init, app = got["init"], got["app"]
    assert set(init[GPU]) < set(app[GPU]) and set(init[NIC]) < set(app[NIC])  # reuse first
    assert pix_pairs(init) == 1 and pix_pairs(app) == 3
    # The app container's GPU request (reuse did not cover it) had no partners: GPUs were in the
    # init container's group; its NIC request had the app's own GPUs, the reused one included.
    app_prefs = [c for c in dm.calls if c.pod == "pod" and c.container == "app" and c.method != "Allocate"]
    assert [c.resource for c in app_prefs] == [GPU, NIC]
    assert app_prefs[1].must_include == init[NIC]
    # Reuse that covers the request: no GetPreferredAllocation, the same IDs allocated again.
    assert [c.method for c in dm.calls if c.pod == "same" and c.container == "app"] == ["Allocate", "Allocate"]
    assert same["app"] == {GPU: same["init"][GPU], NIC: same["init"][NIC]} and pix_pairs(same["app"]) == 1


async def test_two_containers_of_one_pod_each_get_their_own_pairs(plugin_dir):
    async with node(plugin_dir) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(3), shuffle_resources=False)
        await dm.admit(pod("gpus", {GPU: 1}, names=("c",)))
        got = await dm.admit(pod("pod", {GPU: 2, NIC: 2}, {NIC: 3, GPU: 3}, names=("a", "b")))
    partners = check_calls(dm, None)
    assert pix_pairs(got["a"]) == 2 and pix_pairs(got["b"]) == 3
    # Container b's first call (NICs) ended a's group: no partners from a.
    b_nic = [i for i, c in enumerate(c for c in dm.calls if c.method != "Allocate")
             if c.container == "b" and c.resource == NIC][0]
    assert partners[b_nic] == {}


@pytest.mark.parametrize("seed", range(2))
async def test_random_pods_with_churn_every_answer_optimal_and_every_gpu_paired(plugin_dir, seed):
    """Pods asking g GPUs and g NICs (g = 1..4), resources in random order, some with init containers,
    pods leaving at random: every answer is the spec's optimum and every GPU gets its PIX NIC."""
    rng = random.Random(seed)
    async with node(plugin_dir) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(seed + 100))
        running: list[str] = []
        orders = set()
        for n in range(24):
            g = rng.randint(1, 4)
            init = {GPU: 1, NIC: 1} if rng.random() < 0.3 else None
            while running and (dm.free(GPU) < g or dm.free(NIC) < g or rng.random() < 0.3):
                dm.release(running.pop(rng.randrange(len(running))))
            got = await dm.admit(pod(f"pod{n}", {GPU: g, NIC: g}, init=init))
            running.append(f"pod{n}")
            assert pix_pairs(got["main"]) == g, (f"pod{n}", got)
            orders.add(tuple(c.resource for c in dm.calls if c.pod == f"pod{n}" and c.container == "main")[:1])
    check_calls(dm, None)
    assert orders == {(GPU,), (NIC,)}  # both resource orders happened


async def test_the_window_ends_a_group(plugin_dir):
    """Driven clock: within the window the NIC request has the GPUs as partners; past it, none."""
    clock = Clock()
    async with node(plugin_dir, window_s=1.0, clock=clock) as (_, kubelet):
        await kubelet.allocate(GPU, ["5"])
        clock.now += 0.9
        paired = await kubelet.preferred(NIC, [f"mlx5_{i}" for i in range(8)], [], 1)
        await kubelet.allocate(NIC, paired)
        await kubelet.allocate(GPU, ["6"])
        clock.now += 1.1
        late = await kubelet.preferred(NIC, [f"mlx5_{i}" for i in range(8) if i != 5], [], 1)
    assert paired == ["mlx5_5"]  # GPU5's PIX NIC
    o = oracle()
    assert o.check(NIC, [f"mlx5_{i}" for i in range(8) if i != 5], [], 1, {}, late) is None
    assert late != ["mlx5_6"]  # the blind choice is another NIC: the test sees the window


async def test_a_rejected_allocate_neither_joins_nor_ends_a_group(plugin_dir):
    async with node(plugin_dir) as (_, kubelet):
        await kubelet.allocate(GPU, ["3"])
        for resource, ids in ((GPU, ["no-such-gpu"]), (NIC, ["mlx5_1", "mlx5_1"])):
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await kubelet.allocate(resource, ids)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        nic = await kubelet.preferred(NIC, [f"mlx5_{i}" for i in range(8)], [], 1)
    # Had the GPU one counted, it would have started a group of unknown GPUs; had the NIC one, the
    # NIC request would have ended the group: either way a blind choice (mlx5_0), not GPU3's NIC.
    assert nic == ["mlx5_3"]


async def test_several_container_requests_in_one_call_share_the_calls_partners(plugin_dir):
    async with node(plugin_dir) as (_, kubelet):
        await kubelet.allocate(GPU, ["2", "7"])
        nics = [f"mlx5_{i}" for i in range(8)]
        async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{kubelet.registrations_of(NIC)[0].endpoint}") as ch:
            resp = await api_pb2_grpc.DevicePluginStub(ch).GetPreferredAllocation(
                preferred_request((nics, [], 2), (nics, ["mlx5_0"], 2)))
    a, b = (list(r.deviceIDs) for r in resp.container_responses)
    o = oracle()
    assert o.check(NIC, nics, [], 2, {GPU: ("2", "7")}, a) is None and set(a) == {"mlx5_2", "mlx5_7"}
    assert o.check(NIC, nics, ["mlx5_0"], 2, {GPU: ("2", "7")}, b) is None


async def test_pairs_and_their_links_are_counted(plugin_dir):
    async with node(plugin_dir) as (daemon, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(4), shuffle_resources=False)
        await dm.admit(pod("a", {GPU: 2, NIC: 2}, names=("c",)))
        await dm.admit(pod("b", {NIC: 1, GPU: 1}, names=("c",)))
        # A container the plugin cannot help: its NIC is across the sockets from its GPU (SYS).
        async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{kubelet.registrations_of(GPU)[0].endpoint}") as ch:
            await api_pb2_grpc.DevicePluginStub(ch).Allocate(allocate_request(["7"]))
        await kubelet.allocate(NIC, ["mlx5_3"])
        text = generate_latest(daemon.metrics.registry).decode()
    assert f'topo_dp_pairs_total{{resource="{NIC}"}} 3.0' in text  # a's NICs paired its GPUs; and "7~mlx5_3"
    assert f'topo_dp_pairs_total{{resource="{GPU}"}} 1.0' in text  # b's GPU paired its NIC
    assert 'topo_dp_pair_links_total{link="PIX"} 3.0' in text
    assert 'topo_dp_pair_links_total{link="SYS"} 1.0' in text


async def test_pairs_are_counted_with_pairing_off_too(plugin_dir):
    """Window 0: no partners (blind choices), but the pairs containers got are still counted."""
    async with node(plugin_dir, window_s=0.0) as (daemon, kubelet):
        await kubelet.allocate(GPU, ["4"])
        await kubelet.allocate(NIC, ["mlx5_4"])
        text = generate_latest(daemon.metrics.registry).decode()
    assert 'topo_dp_pair_links_total{link="PIX"} 1.0' in text


async def test_a_config_reload_turns_pairing_off_and_on(kubelet, start_daemon, plugin_dir, tmp_path):
    """`pairingWindowMs` is live: the real daemon process, its config file edited while it serves."""
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  pairingWindowMs: 0\n")
    daemon = start_daemon("--config", str(config), simulate=NODE)
    await kubelet.wait_for(lambda: all(kubelet.devices(r) for r in (GPU, NIC)), timeout=20)
    nics = [f"mlx5_{i}" for i in range(8)]
    await kubelet.allocate(GPU, ["6"])
    blind = await kubelet.preferred(NIC, nics, [], 1)
    config.write_text("version: v1\nflags:\n  pairingWindowMs: 60000\n")
    for _ in range(400):
        if "pairing window changed" in daemon.log():
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the daemon did not apply the new window:\n" + daemon.log())
    await kubelet.allocate(GPU, ["6"])
    paired = await kubelet.preferred(NIC, nics, [], 1)
    assert blind != ["mlx5_6"] and paired == ["mlx5_6"]


# -- pod-resources ---------------------------------------------------------------------------------

async def test_with_pod_resources_the_spec_rule_still_holds(plugin_dir, caplog):
    """Init containers (not in List), reuse, random orders: List is read, and no real partner is dropped
    (every answer is still the spec's optimum with the partners the call sequence gives)."""
    caplog.set_level(logging.INFO, logger="plugin.allocation.pod_resources")
    socket = os.path.join(plugin_dir, "pr", "kubelet.sock")  # unix socket paths: 108 bytes at most
    async with node(plugin_dir, pod_resources_socket=socket) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(5))
        lister = PodResourcesStandin(dm)
        await lister.start(socket)
        try:
            # Held for the whole test, so blind choices and paired ones differ.
            await dm.admit(pod("gpus", {GPU: 1}, names=("c",)))
            await dm.admit(pod("nics", {NIC: 2}, names=("c",)))
            rng = random.Random(6)
            running: list[str] = []
            for n in range(12):
                g = rng.randint(1, 2)
                while running and (dm.free(GPU) < g or dm.free(NIC) < g or rng.random() < 0.3):
                    dm.release(running.pop(0))
                await dm.admit(pod(f"pod{n}", {GPU: g, NIC: g}, init={GPU: 1, NIC: 1}))
                running.append(f"pod{n}")
        finally:
            await lister.stop()
    check_calls(dm, None)
    assert lister.list_calls >= 12
    assert "reading pod-resources to check pairing partners" in caplog.text


async def test_pod_resources_drops_partners_of_a_container_that_already_holds_the_resource(plugin_dir):
    """A slow container: its NIC Allocate, the window passes, then its GPU Allocate; the next pod's NIC
    request then gets that GPU as partner by the rule, but List shows its container already holds a NIC."""
    socket = os.path.join(plugin_dir, "pr", "kubelet.sock")
    clock = Clock()
    async with node(plugin_dir, window_s=1.0, clock=clock, pod_resources_socket=socket) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(7), shuffle_resources=False)
        lister = PodResourcesStandin(dm)
        await lister.start(socket)
        try:
            dm.specs["slow"] = pod("slow", {NIC: 1, GPU: 1}, names=("c",))
            dm.pods["slow"] = {"c": {NIC: ("mlx5_0",)}}
            await kubelet.allocate(NIC, ["mlx5_0"])
            clock.now += 5
            dm.pods["slow"]["c"][GPU] = ("4",)
            await kubelet.allocate(GPU, ["4"])
            nic = await kubelet.preferred(NIC, [f"mlx5_{i}" for i in range(1, 8)], [], 1)
        finally:
            await lister.stop()
    assert nic != ["mlx5_4"]  # GPU4 was not taken as a partner
    assert oracle().check(NIC, [f"mlx5_{i}" for i in range(1, 8)], [], 1, {}, nic) is None


async def test_a_missing_pod_resources_socket_is_one_info_line_and_pairing_goes_on(plugin_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="plugin.allocation.pod_resources")
    socket = str(tmp_path / "nowhere" / "kubelet.sock")
    async with node(plugin_dir, pod_resources_socket=socket) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(8), shuffle_resources=False)
        for n in range(3):
            got = await dm.admit(pod(f"p{n}", {GPU: 1, NIC: 1}, names=("c",)))
            assert pix_pairs(got["c"]) == 1
    lines = [r for r in caplog.records if r.name == "plugin.allocation.pod_resources"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "not found" in lines[0].getMessage()
    assert not os.path.exists(socket)


async def test_a_pod_resources_socket_that_does_not_answer_leaves_pairing_as_it_is(plugin_dir, caplog):
    """Something at the socket path that is no pod-resources server (here a plain file): one INFO
    line, the requests are answered with the call sequence's partners."""
    caplog.set_level(logging.INFO, logger="plugin.allocation.pod_resources")
    socket = os.path.join(plugin_dir, "pr", "kubelet.sock")
    os.makedirs(os.path.dirname(socket))
    with open(socket, "w") as f:
        f.write("not a socket")
    async with node(plugin_dir, pod_resources_socket=socket) as (_, kubelet):
        dm = StandinDeviceManager(kubelet, random.Random(9), shuffle_resources=False)
        for n in range(2):
            got = await dm.admit(pod(f"p{n}", {GPU: 2, NIC: 2}))
            assert pix_pairs(got["main"]) == 2
    check_calls(dm, None)
    lines = [r for r in caplog.records if r.name == "plugin.allocation.pod_resources"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO, [r.getMessage() for r in lines]
    assert "cannot read pod-resources" in lines[0].getMessage()
