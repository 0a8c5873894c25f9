"""DRAResourceHealth over real gRPC on the driver's real DRA socket, as the kubelet opens it.

The stand-in kubelet (kubelet_standin.py) registers the driver, picks the health service version
a 1.37 kubelet picks (v1) or a 1.36 one (v1alpha1), and reads NodeWatchResources: the current
health first, then each change, and the same list again every heartbeat (the kubelet treats a
report older than its timeout as Unknown). The end-to-end test runs the daemon as a child process
serving a simulated node file and edits that file: the stream and the ResourceSlice taint follow.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import grpc
import pytest
import yaml

from apiserver_standin import write_kubeconfig
from kubelet_standin import register, registration_sockets
from plugin.dra import DraOptions, SliceOptions
from plugin.dra.kubelet.cdi import ClaimSpecs
from plugin.dra.kubelet.health_service import HEALTH_SERVICES
from plugin.runtime.compose.dra import dra_driver
from plugin.sources.simulated import builtin_text
from topo_testkit import pythonpath_env
from topo_testkit.child_wait import until_child as wait_until

NODE = "node-a"
DRIVER = "topo.dev"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUBELET_HEALTH = {"v1": ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"),
                  "v1alpha1": ("v1alpha1.DRAResourceHealth",)}
NAMES = {0: "UNKNOWN", 1: "HEALTHY", 2: "UNHEALTHY"}


@pytest.fixture
def roots(short_tmp):
    return short_tmp  # unix socket paths are short (tests/conftest.py)


def health(msg) -> dict[str, str]:
    """{device name: HEALTHY/UNHEALTHY/UNKNOWN} of one NodeWatchResources message (all in our pool)."""
    assert {d.device.pool_name for d in msg.devices} == {NODE}
    return {d.device.device_name: NAMES[d.health] for d in msg.devices}


async def next_where(stream, predicate, what: str, limit: int = 200):
    """The first message satisfying `predicate` (heartbeats in between are fine); fails after `limit`."""
    seen = []
    while (msg := await stream.read()) is not grpc.aio.EOF:
        if predicate(msg):
            return msg
        seen.append(health(msg))
        if len(seen) >= limit:
            break
    raise AssertionError(f"no health message with {what}; last seen: {seen[-1:] or 'none (stream ended)'}")


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_the_stream_sends_current_health_then_each_change_and_recovery(version, roots, kube_api, dgx_h100):
    opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=f"{roots}/k",
                      cdi_root=f"{roots}/cdi", instance_id="pod-1", resync_s=3600, health_heartbeat_s=3600)
    drv = dra_driver(opts, kube_api, cdi=ClaimSpecs(f"{roots}/cdi", DRIVER))
    await drv.start(dgx_h100)
    try:
        [sock] = registration_sockets(f"{roots}/k")
        plugin = await register(sock, kubelet_health=KUBELET_HEALTH[version])
        assert plugin.service == "v1.DRAPlugin"  # the health entries do not change the DRA service choice
        assert plugin.health_service == f"{version}.DRAResourceHealth"
        async with grpc.aio.insecure_channel(f"unix:{plugin.endpoint}") as ch:
            stream = plugin.watch_health(ch)
            first = await stream.read()
            # Every DRA device, Healthy, with the timeout the kubelet should use and a current stamp.
            assert health(first) == {f"gpu-{i}": "HEALTHY" for i in range(8)} | {
                n: "HEALTHY" for n in health(first) if n.startswith("nic-")}
            assert len(first.devices) == 16
            assert all(d.health_check_timeout_seconds == 3 * 3600 and d.last_updated_time > 0 and not d.message
                       for d in first.devices)

            gpu3 = next(d for d in dgx_h100.devices if d.kind.value == "gpu" and d.index == 3)
            drv.update(dgx_h100.with_health({gpu3.name: "Unhealthy"}))
            sick = await stream.read()
            assert {n for n, h in health(sick).items() if h != "HEALTHY"} == {"gpu-3"}
            assert health(sick)["gpu-3"] == "UNHEALTHY"
            [msg] = [d.message for d in sick.devices if d.device.device_name == "gpu-3"]
            assert gpu3.name in msg and "Unhealthy" in msg

            drv.update(dgx_h100)  # recovered
            well = await stream.read()
            assert set(health(well).values()) == {"HEALTHY"} and len(well.devices) == 16

            stop = asyncio.create_task(drv.stop())
            # Stopping ends the stream cleanly (the kubelet then clears the driver's health and retries).
            assert await stream.read() is grpc.aio.EOF
            await stop
            assert await stream.code() == grpc.StatusCode.OK
    finally:
        await drv.stop()


async def test_an_unchanged_list_is_repeated_every_heartbeat_so_the_kubelet_never_calls_it_stale(
        roots, kube_api, dgx_h100):
    opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=f"{roots}/k",
                      cdi_root=f"{roots}/cdi", instance_id="pod-1", resync_s=3600, health_heartbeat_s=0.2)
    drv = dra_driver(opts, kube_api, cdi=ClaimSpecs(f"{roots}/cdi", DRIVER))
    await drv.start(dgx_h100.with_health({next(d.name for d in dgx_h100.devices if d.index == 5
                                                 and d.kind.value == "gpu"): "Unhealthy"}))
    try:
        plugin = await register(registration_sockets(f"{roots}/k")[0])
        async with grpc.aio.insecure_channel(f"unix:{plugin.endpoint}") as ch:
            stream = plugin.watch_health(ch)
            msgs = [await stream.read() for _ in range(3)]  # no change in between: heartbeats
            assert [health(m) for m in msgs[1:]] == [health(msgs[0])] * 2
            assert health(msgs[0])["gpu-5"] == "UNHEALTHY"
            # A timeout the kubelet can keep: whole seconds, three heartbeats' worth, at least 1.
            assert {d.health_check_timeout_seconds for m in msgs for d in m.devices} == {1}
            stream.cancel()  # the kubelet going away must not disturb the driver
        # A new watcher gets the current list at once.
        async with grpc.aio.insecure_channel(f"unix:{plugin.endpoint}") as ch:
            again = await plugin.watch_health(ch).read()
        assert health(again) == health(msgs[0])
    finally:
        await drv.stop()


async def test_the_registration_lists_the_health_services_after_the_dra_versions(roots, kube_api, dgx_h100):
    """A kubelet without health support (ResourceHealthStatus off, or 1.34/1.35) still registers us."""
    opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=f"{roots}/k",
                      cdi_root=f"{roots}/cdi", instance_id="pod-1", resync_s=3600)
    drv = dra_driver(opts, kube_api, cdi=ClaimSpecs(f"{roots}/cdi", DRIVER))
    await drv.start(dgx_h100)
    try:
        assert drv.registration.services == ("v1.DRAPlugin", "v1beta1.DRAPlugin", *HEALTH_SERVICES)
        plugin = await register(registration_sockets(f"{roots}/k")[0], ("v1beta1.DRAPlugin",), kubelet_health=())
        assert (plugin.service, plugin.health_service) == ("v1beta1.DRAPlugin", None)
        assert drv.registration.status == (True, "")
    finally:
        await drv.stop()


def set_gpu_health(node_file: str, unhealthy: set[int]) -> None:
    """Edit the simulated node the daemon watches: these GPU indexes Unhealthy, the others healthy."""
    with open(node_file, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    for i, gpu in enumerate(data["gpus"]):
        if i in unhealthy:
            gpu["health"] = "Unhealthy"
        else:
            gpu.pop("health", None)
    tmp = node_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    os.replace(tmp, node_file)


def taints(apiserver) -> dict[str, list[str]]:
    return {d["name"]: [t["key"] for t in d["taints"]] for s in apiserver.slices.values()
            for d in s["spec"].get("devices", ()) if d.get("taints")}



async def test_a_simulated_node_edit_reaches_the_stream_and_the_slice_taint_both_ways(roots, apiserver, tmp_path):
    node_file = os.path.join(roots, "node.yaml")
    with open(node_file, "w", encoding="utf-8") as f:
        f.write(builtin_text("dgx-h100"))
    env = pythonpath_env(dict(os.environ, PYTHONUNBUFFERED="1", NODE_NAME=NODE, POD_UID="pod-1",
                              KUBECONFIG=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    kubelet_root = os.path.join(roots, "k")
    os.makedirs(os.path.join(kubelet_root, "device-plugins"))
    log = str(tmp_path / "daemon.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "plugin", "serve", "--simulate", node_file,
                                 "--kubelet-root-dir", kubelet_root, "--cdi-spec-dir", os.path.join(roots, "cdi"),
                                 "--dra-resources", "nvidia.com/gpu,topo.dev/nic", "--log-level", "debug"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        await wait_until(lambda: os.path.isdir(f"{kubelet_root}/plugins_registry") and registration_sockets(kubelet_root),
                         "the DRA registration socket", proc, log)
        plugin = await register(registration_sockets(kubelet_root)[0])
        await wait_until(lambda: apiserver.slices, "the ResourceSlices", proc, log)
        async with grpc.aio.insecure_channel(f"unix:{plugin.endpoint}") as ch:
            stream = plugin.watch_health(ch)
            first = await stream.read()
            assert set(health(first).values()) == {"HEALTHY"} and len(first.devices) == 16
            assert taints(apiserver) == {}

            set_gpu_health(node_file, {2})
            sick = await next_where(stream, lambda m: health(m)["gpu-2"] == "UNHEALTHY", "gpu-2 UNHEALTHY")
            assert {n for n, h in health(sick).items() if h != "HEALTHY"} == {"gpu-2"}
            await wait_until(lambda: taints(apiserver) == {"gpu-2": [f"{DRIVER}/unhealthy"]},
                             "the taint on gpu-2 in the slice", proc, log)

            set_gpu_health(node_file, set())  # recovered
            well = await next_where(stream, lambda m: health(m)["gpu-2"] == "HEALTHY", "gpu-2 HEALTHY again")
            assert set(health(well).values()) == {"HEALTHY"}
            await wait_until(lambda: taints(apiserver) == {}, "the taint removed from the slice", proc, log)

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
