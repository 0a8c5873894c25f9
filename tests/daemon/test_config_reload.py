"""The config file is watched: a valid change is applied live, an invalid one is logged and ignored."""

from __future__ import annotations

import os

import pytest
import yaml

from daemon_testlib import until
from topo_testkit.sysfs_fixture import write_demo

GPU = "nvidia.com/gpu"


@pytest.fixture
def node(tmp_path):
    return write_demo(str(tmp_path / "node"))


def rewrite(path: str, change) -> None:
    with open(path) as f:
        data = yaml.safe_load(f)
    change(data)
    with open(path + ".tmp", "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    os.replace(path + ".tmp", path)  # as a ConfigMap update or an editor does


async def test_pool_changes_apply_without_touching_other_streams(kubelet, start_daemon, plugin_dir, node):
    config = f"{node.root}/config.yaml"
    daemon = start_daemon("--config", config, "--device-plugin-path", plugin_dir, raw=True,
                          fake_nvml=f"{node.root}/node.yaml")
    await kubelet.wait_for(lambda: {GPU, "example.com/pf_other", "topo.dev/pf_mlx"} <= set(kubelet.clients)
                           and all(c.devices for c in kubelet.clients.values()), timeout=20)
    gpu_client = kubelet.client(GPU)
    gone = kubelet.client("example.com/pf_other")

    def rename(data):
        for pool in data["nics"]["resourceList"]:
            if pool["resourceName"] == "pf_other":
                pool["resourceName"] = "uplinks"

    rewrite(config, rename)
    await kubelet.wait_for(lambda: bool(kubelet.devices("example.com/uplinks")), timeout=5)
    await kubelet.wait_for(lambda: gone.devices == {}, timeout=5)  # the old pool said goodbye with an empty list
    assert len(kubelet.registrations_of(GPU)) == 1 and kubelet.client(GPU) is gpu_client
    assert not gpu_client.stopped

    # an invalid change: logged, ignored, everything keeps serving
    rewrite(config, lambda data: data["flags"].update({"deviceIdStrategy": "serial"}))
    await until(lambda: "config change ignored" in daemon.log(), 20, "the daemon to log the ignored change")
    line = next(x for x in daemon.log().splitlines() if "config change ignored" in x)
    assert "flags.deviceIdStrategy" in line and config in line
    assert daemon.proc.poll() is None
    assert kubelet.devices("example.com/uplinks") and len(kubelet.registrations_of(GPU)) == 1


async def test_a_reload_applies_live_options_and_names_those_that_need_a_restart(kubelet, start_daemon, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  gpuResourceName: example.com/gpu\n  logFormat: text\n")
    daemon = start_daemon("--config", str(config))
    await kubelet.wait_for(lambda: len(kubelet.devices("example.com/gpu")) == 8, timeout=20)
    tmp = tmp_path / "config.yaml.tmp"
    tmp.write_text("version: v1\nflags:\n  gpuResourceName: example.com/accel\n  logFormat: json\n"
                   "gpus:\n  health:\n    disabled: true\n")
    os.replace(tmp, config)
    await kubelet.wait_for(lambda: len(kubelet.devices("example.com/accel")) == 8, timeout=10)
    # the warning comes with the reload that renamed the resource: wait for it in the log
    await until(lambda: "needs a restart" in daemon.log(), 20, "the restart warning of the reload")
    line = next(x for x in daemon.log().splitlines() if "needs a restart" in x)
    assert "--log-format" in line and "gpus.health" in line and "gpu-resource-name" not in line
    assert daemon.proc.poll() is None


def fake_dev(root) -> str:
    """A device root with the nodes a GPU container gets (plain files: the answer only names what exists)."""
    root.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", *(f"nvidia{i}" for i in range(8))):
        (root / name).write_text("")
    return str(root)


async def test_a_reload_that_changes_dev_root_keeps_the_allocate_answers_on_the_running_root(
        kubelet, start_daemon, tmp_path):
    """--dev-root feeds discovery (restart): a reload must not send Allocate to a root discovery never saw."""
    old, new = fake_dev(tmp_path / "dev-old"), fake_dev(tmp_path / "dev-new")
    node = tmp_path / "node.yaml"  # GPUs with device minors, so Allocate names /dev/nvidia<minor>
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus:\n"
                    + "".join(f"  - {{numa: 0, minor: {i}}}\n" for i in range(8)))
    config = tmp_path / "config.yaml"
    config.write_text(f"version: v1\nflags:\n  gpuResourceName: example.com/gpu\n  devRoot: {old}\n")
    daemon = start_daemon("--config", str(config), simulate=str(node))
    await kubelet.wait_for(lambda: len(kubelet.devices("example.com/gpu")) == 8, timeout=20)
    before = await kubelet.allocate("example.com/gpu", ["0"])
    assert before.devices and all(d.host_path.startswith(old + "/") for d in before.devices), before.devices

    tmp = tmp_path / "config.yaml.tmp"  # the same edit renames the resource: a live option, so we see it applied
    tmp.write_text(f"version: v1\nflags:\n  gpuResourceName: example.com/accel\n  devRoot: {new}\n")
    os.replace(tmp, config)
    await kubelet.wait_for(lambda: len(kubelet.devices("example.com/accel")) == 8, timeout=10)
    after = await kubelet.allocate("example.com/accel", ["0"])
    assert sorted(d.container_path for d in after.devices) == sorted(d.container_path for d in before.devices)
    assert all(d.host_path.startswith(old + "/") for d in after.devices), after.devices
    await until(lambda: "needs a restart" in daemon.log(), 20, "the restart warning of the reload")
    line = next(x for x in daemon.log().splitlines() if "needs a restart" in x)
    assert "--dev-root" in line and "gpu-resource-name" not in line
    assert daemon.proc.poll() is None
