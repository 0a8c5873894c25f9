"""Time-slicing at scale: the largest allowed config inside the chart's memory limit, counts past the bound
refused (at start-up and as a live edit), and the RPCs answered while a large rebuild runs.

The memory test runs the daemon in a memory cgroup whose limit is the chart's
(`resources.limits.memory` in values.yaml): cgroup v2 where its memory controller can be given to
a child group, else the v1 memory hierarchy (hybrid hosts mount it at /sys/fs/cgroup/memory). A
wrapper writes its own PID into the group, then execs the daemon, so every byte is charged from
the start. Pass: it registers all replicas, answers GetPreferredAllocation and Allocate, applies a
live edit, and the kernel reports no OOM kill. The peak it prints is the number behind the chart's
limit (docs/sharing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from daemon_testlib import until
from topo_testkit import pythonpath_env

from plugin.api import api_pb2
from plugin.config.sharing import MAX_REPLICAS, TimeSlicing, SharedResource
import plugin.runtime.daemon as daemon_module
from plugin.runtime.daemon import Daemon, DaemonOptions
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.model.resources import ResourceOptions
from plugin.sources.simulated import builtin_text
from plugin.sources.simulated.source import SimulatedSource

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"
GPUS = 8  # the simulated DGX A100 (and its 8 NICs, which the GPU-NIC pairing index crosses with every replica)
PER_GPU = MAX_REPLICAS // GPUS


def config_text(replicas: int) -> str:
    return f"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: {GPU}\n      replicas: {replicas}\n"


def chart_memory_limit() -> int:
    """`resources.limits.memory` of the chart, in bytes."""
    values = yaml.safe_load((ROOT / "charts" / "topo-device-plugin" / "values.yaml").read_text())
    text = str(values["resources"]["limits"]["memory"])
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", text)
    assert m, f"chart memory limit {text!r} is not a plain quantity"
    return int(m.group(1)) * {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, None: 1}[m.group(2)]


# -- a memory cgroup of our own ---------------------------------------------------------------------------
@dataclass
class MemoryCgroup:
    path: str
    version: int

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def limit(self, limit: int) -> None:
        if self.version == 2:
            self._write("memory.max", str(limit))
            if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                self._write("memory.swap.max", "0")  # no swapping our way out of the limit
        else:
            self._write("memory.limit_in_bytes", str(limit))
            if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
                self._write("memory.memsw.limit_in_bytes", str(limit))

    def oom_kills(self) -> int:
        """The kernel's count of OOM kills in the group (v2 memory.events, v1 memory.oom_control)."""
        text = self._read("memory.events" if self.version == 2 else "memory.oom_control")
        m = re.search(r"^oom_kill (\d+)$", text, re.M)
        assert m, f"no oom_kill counter in {self.path}: {text!r}"
        return int(m.group(1))

    def peak(self) -> int | None:
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return int(self._read(name)) if os.path.exists(os.path.join(self.path, name)) else None


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fstype, super options) of every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, options = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                out.append((left.split()[4], fstype, set(options.split(","))))
    return out


def _own_groups() -> dict[str, str]:
    """Our cgroup path per hierarchy: '' for v2, else the controller list (`memory`, ...)."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            out[controllers] = path
    return out


def _v2_group(name: str) -> MemoryCgroup | str:
    own = _own_groups().get("")
    mounts = [m for m, fstype, _ in _mounts() if fstype == "cgroup2"]
    if own is None or not mounts:
        return "no cgroup v2 hierarchy"
    parent = os.path.join(mounts[0], own.lstrip("/"))
    with open(os.path.join(parent, "cgroup.controllers")) as f:
        if "memory" not in f.read().split():
            return f"cgroup v2 at {mounts[0]} has no memory controller (it is bound to v1 here)"
    try:
        with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")
        os.mkdir(os.path.join(parent, name))
    except OSError as e:  # EBUSY: our group holds processes, so it cannot hand controllers down
        return f"cannot make a v2 memory group under {parent}: {e}"
    return MemoryCgroup(os.path.join(parent, name), 2)


def _v1_group(name: str) -> MemoryCgroup | str:
    own = next((p for c, p in _own_groups().items() if "memory" in c.split(",")), None)
    mounts = [m for m, fstype, opts in _mounts() if fstype == "cgroup" and "memory" in opts]
    if own is None or not mounts:
        return "no cgroup v1 memory hierarchy"
    path = os.path.join(mounts[0], own.lstrip("/"), name)
    try:
        os.mkdir(path)
    except OSError as e:
        return f"cannot make a v1 memory group at {path}: {e}"
    return MemoryCgroup(path, 1)


@pytest.fixture
def memory_cgroup() -> Iterator[MemoryCgroup]:
    name = f"tdp-replicas-{os.getpid()}"
    reasons = []
    for make in (_v2_group, _v1_group):
        got = make(name)
        if isinstance(got, MemoryCgroup):
            break
        reasons.append(got)
    else:
        pytest.skip("no memory cgroup can be made here: " + "; ".join(reasons))
    try:
        yield got
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(got.path)  # empty once the daemon has exited


# -- the tests ------------------------------------------------------------------------------------------------
async def test_the_largest_config_runs_within_the_charts_memory_limit(kubelet, plugin_dir, tmp_path, memory_cgroup):
    limit = chart_memory_limit()
    memory_cgroup.limit(limit)
    config = tmp_path / "config.yaml"
    config.write_text(config_text(PER_GPU))
    log = open(tmp_path / "daemon.log", "wb")
    argv = [sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-a100", "--device-id-strategy", "uuid",
            "--device-plugin-path", plugin_dir, "--config", str(config)]
    # The wrapper joins the group, then becomes the daemon: charged from its first byte.
    proc = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', memory_cgroup.procs, *argv],
                            cwd=ROOT, env=pythonpath_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == MAX_REPLICAS or proc.poll() is not None,
                               timeout=180)
        assert proc.poll() is None, f"the daemon exited ({proc.returncode}): {(tmp_path / 'daemon.log').read_text()}"
        ids = list(kubelet.devices(GPU))
        chosen = await kubelet.preferred(GPU, ids, [], GPUS)
        # one NUMA node (span first), then as many of its GPUs as it has: the 4 of one node, 2 replicas each
        assert len(chosen) == GPUS and len({i.rpartition("::")[0] for i in chosen}) == GPUS // 2
        # The largest request the kubelet can send: every replica available and must-include.
        assert sorted(await kubelet.preferred(GPU, ids, ids, len(ids))) == sorted(ids)
        one_gpu = [i for i in ids if i.startswith(chosen[0].rpartition("::")[0] + "::")][:2]
        resp = await kubelet.allocate(GPU, one_gpu)
        assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == one_gpu[0].rpartition("::")[0]  # the GPU, once

        # A live edit at the bound: old and new resources are alive together for a moment.
        config.write_text(config_text(PER_GPU - 1))
        await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == GPUS * (PER_GPU - 1) or proc.poll() is not None,
                               timeout=180)
        assert proc.poll() is None, f"the daemon exited ({proc.returncode}): {(tmp_path / 'daemon.log').read_text()}"
        assert await kubelet.preferred(GPU, list(kubelet.devices(GPU)), [], 1)
        assert memory_cgroup.oom_kills() == 0
        peak = memory_cgroup.peak()
        print(f"\n{MAX_REPLICAS} replicas in a cgroup v{memory_cgroup.version} memory group of {limit >> 20} MiB: "
              f"peak {peak / 2**20 if peak else float('nan'):.1f} MiB")
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(30)
        log.close()
    assert memory_cgroup.oom_kills() == 0


async def test_a_count_past_the_bound_stops_start_up_with_exit_2_naming_the_field(start_daemon, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(config_text(10**9))
    daemon = start_daemon("--config", str(config))
    assert await daemon.wait(30) == 2
    out = daemon.log()
    assert f"{config}:6: field sharing.timeSlicing.resources[0].replicas: 1000000000 is more than the " \
           f"{MAX_REPLICAS} replicas one resource may advertise" in out, out
    assert "Traceback" not in out and "MemoryError" not in out


async def test_a_live_edit_past_the_bound_is_ignored_and_the_daemon_keeps_serving(kubelet, start_daemon, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(config_text(10))
    daemon = start_daemon("--config", str(config))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 80, timeout=30)
    config.write_text(config_text(10**6))
    await until(lambda: "config change ignored" in daemon.log(), 30, "the edit to be refused")
    out = daemon.log()
    assert "sharing.timeSlicing.resources[0].replicas: 1000000 is more than the " \
           f"{MAX_REPLICAS} replicas one resource may advertise" in out, out
    assert daemon.proc.poll() is None and len(kubelet.devices(GPU)) == 80
    assert await kubelet.preferred(GPU, list(kubelet.devices(GPU)), [], 2)
    # the bound for this node, from the node's own GPUs: refused too, with the count that fits
    config.write_text(config_text(PER_GPU + 1))
    await until(lambda: daemon.log().count("config change ignored") == 2, 30, "the second edit to be refused")
    assert f"replicas: {PER_GPU} or fewer here" in daemon.log()
    assert daemon.proc.poll() is None and len(kubelet.devices(GPU)) == 80


@pytest.mark.parametrize("cause", ["config change", "topology change"])
async def test_rpcs_are_answered_while_a_large_rebuild_runs(plugin_dir, tmp_path, monkeypatch, cause):
    """The rebuild after a live edit (of the config, or of the node) runs off the event loop: while it is held
    in the middle, GetDevicePluginOptions is still answered. The build is held until an answer arrives, so the
    order is certain whatever the machine's load: a build on the loop would block the very answer that
    releases it, and the test would fail at the gate's bound instead."""
    config = tmp_path / "config.yaml"
    config.write_text(config_text(PER_GPU))
    node = tmp_path / "node.yaml"  # a simulated node in a file is watched: edits are topology changes
    node.write_text(builtin_text("dgx-a100"))
    armed, started, release = threading.Event(), threading.Event(), threading.Event()
    answered_while_held: list[bool] = []
    real_build = daemon_module._build

    def held_build(topology, options, *rest):
        if armed.is_set():
            started.set()
            answered_while_held.append(release.wait(60))  # released only by an RPC answered meanwhile
        return real_build(topology, options, *rest)  # the rest: the daemon's subset tables

    monkeypatch.setattr(daemon_module, "_build", held_build)

    def options(replicas: int) -> ResourceOptions:
        return ResourceOptions(device_id_strategy="uuid",
                               time_slicing=TimeSlicing(resources=(SharedResource(GPU, replicas),)))

    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    daemon = Daemon(SimulatedSource(str(node)), DaemonOptions(plugin_dir=plugin_dir, config_path=str(config)),
                    options(PER_GPU), reload_resources=lambda: options(PER_GPU - 1))
    stop, polling = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(daemon.run(stop, install_signals=False))
    try:
        await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == MAX_REPLICAS, timeout=120)
        stub = kubelet.client(GPU).stub

        async def poll() -> None:
            while not polling.is_set():
                await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=60)
                if started.is_set():
                    release.set()
                await asyncio.sleep(0.01)

        poller = asyncio.create_task(poll())
        armed.set()
        if cause == "config change":
            config.write_text(config_text(PER_GPU - 1))  # what the file says is what `reload_resources` returns
            await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == GPUS * (PER_GPU - 1), timeout=180)
        else:
            node.write_text(builtin_text("dgx-a100").replace("{name: GPU3, numa: 0,",
                                                             "{name: GPU3, numa: 0, health: Unhealthy,"))
            await kubelet.wait_for(lambda: sum(d.health == "Unhealthy" for d in kubelet.devices(GPU).values())
                                   == PER_GPU, timeout=180)
        polling.set()
        await poller
    finally:
        release.set()
        stop.set()
        assert await asyncio.wait_for(task, 60) == 0
        await kubelet.stop()
    assert answered_while_held and all(answered_while_held), \
        "the rebuild was held, but no RPC was answered until the hold ran out: the build blocks the loop"
