"""GPU–NIC pairing on a Grace / ConnectX-8 Data Direct node, through the daemon over real gRPC.

The simulated GB300 tray (`gb300-cx8-dd`) has no `PIX` pair at all: the PCIe path from a GPU to
both NICs of its socket reads `NODE`, and only the GPU–NIC complex (the ConnectX-8's DMA function
below the GPU's switch, tied to its NIC by board serial) says which NIC is the GPU's. The kubelet
stand-in's device-manager walk makes the kubelet's calls; every preferred answer is checked
against the spec read literally (`topo_testkit.pairing_oracle`, which applies the complex rule
from the spec text), and the devices each container ends up with against the complexes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

from daemon_testlib import GPU, NIC
from topo_testkit.pairing_oracle import LoggedCall, oracle_for, spec_partners

from plugin.runtime.daemon import Daemon, DaemonOptions
from topo_testkit.device_manager import StandinDeviceManager, pod
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated
from plugin.sources.simulated.source import SimulatedSource

NODE = "gb300-cx8-dd"
#: Groups end by the spec's other rule (a call for a resource already in the group), never by time.
LONG_WINDOW_S = 600.0


@contextlib.asynccontextmanager
async def node(plugin_dir: str, window_s: float) -> AsyncIterator[KubeletStandin]:
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    daemon = Daemon(SimulatedSource(NODE), DaemonOptions(plugin_dir=plugin_dir),
                    ResourceOptions(device_id_strategy="index", pairing_window_s=window_s), clock=lambda: 1000.0)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        await kubelet.wait_for(lambda: all(kubelet.devices(r) for r in (GPU, NIC)), timeout=20)
        yield kubelet
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0
        await kubelet.stop()


def complex_nic() -> dict[str, str]:
    """GPU ID (index) -> the NIC ID of its complex, from the node file."""
    t = load_simulated(NODE)
    return {str(g.index): n.name for g in t.gpus for n in t.nics if g.complex == n.complex}


def own_nics(got: dict[str, tuple[str, ...]]) -> int:
    """How many of a container's GPUs have their complex's NIC in it."""
    mine = complex_nic()
    return sum(mine[g] in got.get(NIC, ()) for g in got.get(GPU, ()))


def check_calls(dm: StandinDeviceManager, window_s: float | None) -> list[dict]:
    t = load_simulated(NODE)
    oracle = oracle_for(t, build_resources(t, ResourceOptions(device_id_strategy="index")))
    partners = spec_partners([LoggedCall(c.method, c.resource, c.ids) for c in dm.calls], window_s)
    prefs = [c for c in dm.calls if c.method == "GetPreferredAllocation"]
    assert len(prefs) == len(partners)
    for call, p in zip(prefs, partners):
        problem = oracle.check(call.resource, call.available, call.must_include, call.size, p, call.ids)
        assert problem is None, f"{call.pod}/{call.container}: {problem}"
    return partners


def test_the_node_pairs_only_by_complex():
    """Guard: the scenario below is not won by the PCIe path (no GPU has a PIX/PXB NIC) nor by names."""
    t = load_simulated(NODE)
    assert all(t.link(g.name, n.name).label in ("NODE", "SYS") for g in t.gpus for n in t.nics)
    assert any(nic != f"mlx5_{gpu}" for gpu, nic in complex_nic().items())


async def test_random_pods_with_churn_every_answer_optimal_and_every_gpu_gets_its_complex_nic(plugin_dir):
    rng = random.Random(5)
    async with node(plugin_dir, LONG_WINDOW_S) as kubelet:
        dm = StandinDeviceManager(kubelet, random.Random(105))
        running: list[str] = []
        for n in range(24):
            g = rng.randint(1, 4)
            init = {GPU: 1, NIC: 1} if rng.random() < 0.3 else None
            while running and (dm.free(GPU) < g or dm.free(NIC) < g or rng.random() < 0.3):
                dm.release(running.pop(rng.randrange(len(running))))
            got = await dm.admit(pod(f"pod{n}", {GPU: g, NIC: g}, init=init))
            running.append(f"pod{n}")
            assert own_nics(got["main"]) == g, (f"pod{n}", got)
    partners = check_calls(dm, None)
    assert sum(bool(p) for p in partners) >= 12  # the paired path was taken, not only blind answers


async def test_a_gpu_first_container_gets_its_complex_nic_and_not_without_pairing(plugin_dir):
    """GPU first, then one NIC: with pairing the NIC request has the GPU as partner and gets the GPU's
    complex NIC; with pairing off (window 0) the same walk chooses blind, by NUMA node alone."""
    results = {}
    for window in (LONG_WINDOW_S, 0.0):
        async with node(plugin_dir, window) as kubelet:
            dm = StandinDeviceManager(kubelet, random.Random(1), shuffle_resources=False)
            results[window] = (await dm.admit(pod("p", {GPU: 1, NIC: 1}, names=("c",))))["c"]
        check_calls(dm, None if window else 0)
    paired, blind = results[LONG_WINDOW_S], results[0.0]
    assert own_nics(paired) == 1, paired
    assert paired[GPU] == blind[GPU] and own_nics(blind) == 0, blind
