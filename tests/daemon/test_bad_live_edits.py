"""Hostile live edits of the watched files: the daemon logs them, keeps serving the last good state,
stays under 128 MiB (two thirds of the chart's memory limit), and still applies the next good edit (no watcher dies).

Real daemon process, real files replaced the way editors and ConfigMaps do, real inotify.
"""

from __future__ import annotations

import asyncio
import os
import pathlib

from topo_testkit.hostile_yaml import (
    HOSTILE_INPUT_RSS_BOUND_KIB, billion_laughs, config_with, nested, node_with,
)

from plugin.sources.simulated import builtin_text

GPU = "nvidia.com/gpu"


def replace(path: pathlib.Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


async def wait_log(daemon, text: str, count: int = 1, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.1)):
        if daemon.log().count(text) >= count:
            return
        assert daemon.proc.poll() is None, f"daemon exited {daemon.proc.returncode}:\n{daemon.log()[-4000:]}"
        await asyncio.sleep(0.1)
    raise AssertionError(f"{text!r} not logged {count}x within {timeout}s:\n{daemon.log()[-4000:]}")


async def test_bad_node_file_edits_keep_the_last_good_topology(kubelet, start_daemon, tmp_path):
    node = tmp_path / "node.yaml"
    good = builtin_text("pcie-2socket-4gpu-2nic")
    node.write_text(good)
    daemon = start_daemon(simulate=str(node))
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 4, timeout=20)
    bad = {
        "nested": node_with("metadata", nested()),
        "alias bomb": node_with("gpus", billion_laughs()),
        "huge": good + "# " + "x" * (3 << 20) + "\n",
    }
    for n, (what, text) in enumerate(bad.items(), start=1):
        replace(node, text)
        await wait_log(daemon, "simulated node edit ignored", count=n)
        assert len(kubelet.devices(GPU)) == 4, what
        assert peak_rss_kib(daemon.pid) < HOSTILE_INPUT_RSS_BOUND_KIB, what
    log = daemon.log()
    assert str(node) in log and "nested deeper than" in log and "aliases" in log and "1 MiB" in log
    # the watcher is alive: a good edit still reaches the kubelet
    replace(node, good.replace("{name: GPU1, numa: 0,", "{name: GPU1, numa: 0, health: Unhealthy,"))
    await kubelet.wait_for(lambda: kubelet.devices(GPU)["1"].health == "Unhealthy", timeout=10)
    assert daemon.proc.poll() is None


async def test_bad_config_edits_keep_the_running_configuration(kubelet, start_daemon, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  gpuResourceName: example.com/gpu\n")
    daemon = start_daemon("--config", str(config))
    await kubelet.wait_for(lambda: len(kubelet.devices("example.com/gpu")) == 8, timeout=20)
    bad = {
        "nested": config_with(nested()),
        "alias bomb": config_with("{cdiVendor: " + billion_laughs() + "}"),
        "huge": "version: v1\n# " + "x" * (3 << 20) + "\n",
    }
    for n, (what, text) in enumerate(bad.items(), start=1):
        replace(config, text)
        await wait_log(daemon, "config change ignored", count=n)
        assert len(kubelet.devices("example.com/gpu")) == 8, what
        assert peak_rss_kib(daemon.pid) < HOSTILE_INPUT_RSS_BOUND_KIB, what
    log = daemon.log()
    assert str(config) in log and "nested deeper than" in log and "aliases" in log and "1 MiB" in log
    replace(config, "version: v1\nflags:\n  gpuResourceName: example.com/accel\n")
    await kubelet.wait_for(lambda: len(kubelet.devices("example.com/accel")) == 8, timeout=10)
    assert daemon.proc.poll() is None

