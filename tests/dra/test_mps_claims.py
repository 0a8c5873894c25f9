"""MPS through claim config: `GpuConfig` `strategy: MPS`, one control daemon per GPU, the claim's CDI edits.

The kubelet side runs over real gRPC on real unix sockets against the stand-in API server (as
test_gpu_sharing.py); the MPS control program is the stand-in of tests/support/mps_standin, a
real executable that records what it was told. What a user would notice: the container's CDI
spec mounts the GPU's pipe directory and sets the claim's limits; two claims on one GPU share
one control daemon, which quits with the last of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import signal

import pytest

from allocator.topology import DeviceKind
from kubelet_standin import register, registration_sockets
from plugin.dra import DraOptions, SliceOptions
from plugin.runtime.compose.dra import dra_driver
from plugin.dra.claims.opaque import OpaqueConfig
from plugin.dra.claims.gpu_config import NVIDIA_API_VERSION, GpuConfigError, parse_gpu_config, parse_mig_config
from plugin.dra.mig.devices import DraMig
from plugin.dra.mig.instances import NvmlMigBackend
from plugin.dra.slices.build import device_table
from plugin.sources.simulated import load_node_yaml
from topo_testkit.fake_nvml import FakeNvml
from topo_testkit.mig_node import mig_node_text

NODE = "node-a"
DRIVER = "topo.dev"
STANDIN = str(pathlib.Path(__file__).resolve().parents[1] / "support" / "mps_standin" / "nvidia-cuda-mps-control")


def mps_config(**mps) -> dict:
    sharing: dict = {"strategy": "MPS"}
    if mps:
        sharing["mpsConfig"] = mps
    return {"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": sharing}


def entry(params, requests=()) -> dict:
    return {"source": "FromClaim", "requests": list(requests), "opaque": {"driver": DRIVER, "parameters": params}}


def test_nvidias_mps_config_reads_with_its_quantities():
    got = parse_gpu_config(OpaqueConfig(source="FromClaim", requests=(), index=0, parameters=mps_config(
        defaultActiveThreadPercentage=40, defaultPinnedDeviceMemoryLimit="10Gi",
        defaultPerDevicePinnedMemoryLimit={"0": "5G"})))
    assert got is not None and got.timeslice is None and got.mps is not None
    assert (got.mps.active_thread_percentage, got.mps.pinned_mib) == (40, 10240)
    assert dict(got.mps.per_device_pinned_mib) == {"0": 5 * 10**9 // (1 << 20)}


@pytest.fixture
def roots(short_tmp):
    return os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi"), os.path.join(short_tmp, "mps")


def options(roots) -> DraOptions:
    # Probed every 50 ms: a killed daemon is noticed at once (the restart's backoff is the product's own).
    return DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=roots[0],
                      cdi_root=roots[1], instance_id="pod-0", resync_s=3600, mps_root=roots[2],
                      mps_control_binary=STANDIN, mps_probe_interval_s=0.05)


def end_standins(roots) -> None:
    for pid_file in pathlib.Path(roots[2]).glob("*/pipe/nvidia-cuda-mps-control.pid"):
        try:  # a test that failed half-way: end the stand-in daemon it left
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass


@pytest.fixture
async def started(roots, kube_api, dgx_h100):
    """The driver and its registration as the kubelet made it."""
    drv = dra_driver(options(roots), kube_api)
    await drv.start(dgx_h100)
    try:
        yield drv, await register(registration_sockets(roots[0])[-1])
    finally:
        await drv.stop()
        end_standins(roots)


@pytest.fixture
def plugin(started):
    return started[1]


def add_claim(apiserver, name: str, devices: dict[str, str], configs: list[dict]) -> str:
    uid = apiserver.add_claim("team", name, [{"request": r, "driver": DRIVER, "pool": NODE, "device": d}
                                             for r, d in devices.items()])
    apiserver.claims[("team", name)]["status"]["allocation"]["devices"]["config"] = configs
    return uid


def edits_of(roots, uid: str) -> tuple[dict[str, str], list[dict]]:
    with open(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"), encoding="utf-8") as f:
        spec = json.load(f)
    env = dict(e.split("=", 1) for d in spec["devices"] for e in d["containerEdits"].get("env", []))
    return env, [m for d in spec["devices"] for m in d["containerEdits"].get("mounts", [])]


def told(roots, uuid: str) -> list[dict]:
    path = os.path.join(roots[2], f"dra-{uuid}", "log", "standin.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


async def test_two_claims_on_a_gpu_share_one_control_daemon_which_quits_with_the_last(
        plugin, roots, apiserver, dgx_h100):
    uuid = device_table(dgx_h100, SliceOptions(node_name=NODE))["gpu-3"].uuid
    first = add_claim(apiserver, "first", {"gpu": "gpu-3"}, [entry(mps_config(
        defaultActiveThreadPercentage=50, defaultPinnedDeviceMemoryLimit="8Gi"))])
    second = add_claim(apiserver, "second", {"gpu": "gpu-3"}, [entry(mps_config(defaultActiveThreadPercentage=25))])
    assert (await plugin.prepare(("team", first, "first"))).claims[first].error == ""
    env, mounts = edits_of(roots, first)
    inside = f"/mps/dra-{uuid}/pipe"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == inside
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert mounts == [{"hostPath": os.path.join(roots[2], f"dra-{uuid}", "pipe"), "containerPath": inside,
                       "options": ["rbind", "rw"]},
                      {"hostPath": os.path.join(roots[2], "shm"), "containerPath": "/dev/shm",
                       "options": ["rbind", "rw"]}]
    log = told(roots, uuid)
    assert log[0] == {"event": "start", "pid": log[0]["pid"], "CUDA_VISIBLE_DEVICES": uuid}
    assert [r["command"] for r in log if r["event"] == "command" and r["command"] != "get_server_list"] == [
        "set_default_device_pinned_mem_limit 0 8192M", "set_default_active_thread_percentage 50"]

    assert (await plugin.prepare(("team", second, "second"))).claims[second].error == ""
    env2, _ = edits_of(roots, second)
    assert env2["CUDA_MPS_PIPE_DIRECTORY"] == inside and env2["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env2
    assert len([r for r in told(roots, uuid) if r["event"] == "start"]) == 1, "the second claim joins the daemon"

    assert (await plugin.unprepare(("team", first, "first"))).claims[first].error == ""
    assert told(roots, uuid)[-1]["event"] != "quit", "another claim still holds the daemon"
    assert (await plugin.unprepare(("team", second, "second"))).claims[second].error == ""
    assert told(roots, uuid)[-1]["event"] == "quit"


async def test_an_mps_config_naming_a_nic_request_is_refused_and_starts_nothing(plugin, roots, apiserver):
    uid = add_claim(apiserver, "nic", {"gpu": "gpu-0", "nic": "nic-mlx5-0"}, [entry(mps_config(), requests=["nic"])])
    err = (await plugin.prepare(("team", uid, "nic"))).claims[uid].error
    assert "strategy MPS applies to request 'nic', which got nic-mlx5-0 (nic), not a full GPU" in err, err
    assert not os.path.exists(roots[2]) or not os.listdir(roots[2])


async def until(what: str, predicate, timeout: float = 90.0) -> None:
    """Wait for a condition, with a deadline generous enough for a loaded machine."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.05)


def taints(apiserver, device: str) -> list[dict]:
    """The taints the scheduler sees on a device of our slices."""
    for s in apiserver.slices.values():
        for d in s["spec"].get("devices", ()):
            if d["name"] == device:
                return list(d.get("taints") or ())
    raise AssertionError(f"{device} is in no published slice")


def commands_since_last_start(roots, uuid: str) -> list[str]:
    log = told(roots, uuid)
    last = max(i for i, r in enumerate(log) if r["event"] == "start")
    return [r["command"] for r in log[last:] if r["event"] == "command" and r["command"] != "get_server_list"]


async def test_a_killed_daemon_is_reported_unhealthy_then_restarted_with_its_defaults(
        started, roots, apiserver, dgx_h100):
    drv, plugin = started
    uuid = device_table(dgx_h100, SliceOptions(node_name=NODE))["gpu-3"].uuid
    uid = add_claim(apiserver, "held", {"gpu": "gpu-3"}, [entry(mps_config(
        defaultActiveThreadPercentage=30, defaultPinnedDeviceMemoryLimit="4Gi"))])
    assert (await plugin.prepare(("team", uid, "held"))).claims[uid].error == ""
    await until("gpu-3 published untainted", lambda: any(
        d["name"] == "gpu-3" for s in apiserver.slices.values() for d in s["spec"].get("devices", ())))
    assert taints(apiserver, "gpu-3") == []
    first = told(roots, uuid)[0]["pid"]
    hold = pathlib.Path(roots[2], f"dra-{uuid}", "log", "refuse-start")
    hold.touch()  # the restart fails until the test lets it
    os.kill(first, signal.SIGKILL)

    await until("gpu-3 tainted while its daemon is down", lambda: taints(apiserver, "gpu-3"))
    [taint] = taints(apiserver, "gpu-3")
    assert (taint["key"], taint["value"], taint["effect"]) == (f"{DRIVER}/unhealthy", "mps-daemon-down", "NoSchedule")
    assert {t["key"] for n in ("gpu-2", "gpu-4") for t in taints(apiserver, n)} == set(), "only its GPU"
    [report] = [r for r in drv.health.reports() if r.device == "gpu-3"]
    assert report.health == "Unhealthy" and "MPS control daemon" in report.message
    # A new claim is kept off the GPU meanwhile, saying why.
    other = add_claim(apiserver, "late", {"gpu": "gpu-3"}, [entry(mps_config())])
    err = (await plugin.prepare(("team", other, "late"))).claims[other].error
    assert "gpu-3" in err and "Unhealthy" in err, err
    await until("the restart tried while held down", lambda: any(r["event"] == "refused"
                                                                 for r in told(roots, uuid)))

    hold.unlink()
    await until("restarted", lambda: len([r for r in told(roots, uuid) if r["event"] == "start"]) == 2)
    await until("defaults sent again", lambda: commands_since_last_start(roots, uuid) == [
        "set_default_device_pinned_mem_limit 0 4096M", "set_default_active_thread_percentage 30"])
    await until("gpu-3 untainted once its daemon is back", lambda: taints(apiserver, "gpu-3") == [])
    assert [r.health for r in drv.health.reports() if r.device == "gpu-3"] == ["Healthy"]
    restarted = [r for r in told(roots, uuid) if r["event"] == "start"][1]
    assert restarted["pid"] != first and restarted["CUDA_VISIBLE_DEVICES"] == uuid

    assert (await plugin.unprepare(("team", uid, "held"))).claims[uid].error == ""
    assert told(roots, uuid)[-1]["event"] == "quit"
    assert drv.mps.supervisor.specs == {}, "a daemon let go with its last claim is not restarted"


async def test_a_restarted_driver_takes_over_the_daemons_of_prepared_claims(roots, kube_api, apiserver, dgx_h100):
    table = device_table(dgx_h100, SliceOptions(node_name=NODE))
    kept, lost = table["gpu-1"].uuid, table["gpu-2"].uuid
    drv = dra_driver(options(roots), kube_api)
    await drv.start(dgx_h100)
    try:
        plugin = await register(registration_sockets(roots[0])[-1])
        uid = add_claim(apiserver, "both", {"a": "gpu-1", "b": "gpu-2"}, [entry(mps_config(
            defaultActiveThreadPercentage=60))])
        assert (await plugin.prepare(("team", uid, "both"))).claims[uid].error == ""
        await drv.stop()
        assert told(roots, kept)[-1]["event"] != "quit", "the claim's containers keep their daemons"
        os.kill(told(roots, lost)[0]["pid"], signal.SIGKILL)  # one dies while no driver runs

        drv = dra_driver(options(roots), kube_api)
        await drv.start(dgx_h100)
        plugin = await register(registration_sockets(roots[0])[-1])
        # The one that answers is kept (no second start) and given its defaults again; the dead one is started.
        await until("defaults sent again to the kept daemon", lambda: [
            r["command"] for r in told(roots, kept) if r["event"] == "command"].count(
            "set_default_active_thread_percentage 60") == 2)
        assert [r["event"] for r in told(roots, kept)].count("start") == 1
        await until("the lost daemon started again", lambda: [
            r["event"] for r in told(roots, lost)].count("start") == 2)
        await until("its defaults sent", lambda: commands_since_last_start(roots, lost) == [
            "set_default_active_thread_percentage 60"])
        # The prepared claim is answered from the checkpoint, and its unprepare still quits both daemons.
        assert (await plugin.prepare(("team", uid, "both"))).claims[uid].error == ""
        assert (await plugin.unprepare(("team", uid, "both"))).claims[uid].error == ""
        assert told(roots, kept)[-1]["event"] == "quit" and told(roots, lost)[-1]["event"] == "quit"
    finally:
        await drv.stop()
        end_standins(roots)


# ---- MigDeviceConfig: MPS on MIG devices (static and dynamic MIG) ------------------------------------------


def mig_config(**sharing) -> dict:
    return {"apiVersion": NVIDIA_API_VERSION, "kind": "MigDeviceConfig", **({"sharing": sharing} if sharing else {})}


def one(params) -> OpaqueConfig:
    return OpaqueConfig(source="FromClaim", requests=(), index=0, parameters=params)


def test_nvidias_mig_device_config_reads_mps_and_takes_time_slicing_as_nothing():
    got = parse_mig_config(one(mig_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 20})))
    assert got is not None and got.kind == "MigDeviceConfig" and got.mps is not None
    assert got.mps.active_thread_percentage == 20
    plain = parse_mig_config(one(mig_config(strategy="TimeSlicing")))
    assert plain is not None and plain.mps is None and plain.timeslice is None
    assert parse_mig_config(one(mps_config())) is None, "a GpuConfig is not read as one"


@pytest.mark.parametrize("params, field, fix", [
    (mig_config(strategy="TimeSlicing", timeSlicingConfig={"interval": "Short"}), "sharing.timeSlicingConfig",
     "remove timeSlicingConfig"),
    (mig_config(strategy="Mps"), "sharing.strategy: 'Mps'", "strategy: MPS"),
    (mig_config(strategy="TimeSlicing", mpsConfig={}), "sharing.mpsConfig", "remove mpsConfig, or use strategy: MPS"),
    (mig_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": -1}),
     "sharing.mpsConfig.defaultActiveThreadPercentage", "an integer from 0 to 100"),
    (mig_config(strategy="MPS", replicas=2), "sharing: unknown field 'replicas'", "use only strategy, mpsConfig"),
    ({**mig_config(), "apiVersion": "resource.nvidia.com/v1"}, ".apiVersion", "apiVersion: gpu.topo-device-plugin.io/v1alpha1"),
])
def test_a_bad_mig_device_config_names_its_field_and_the_fix(params, field, fix):
    with pytest.raises(GpuConfigError) as e:
        parse_mig_config(one(params))
    assert field in str(e.value) and f"fix: {fix}" in str(e.value), str(e.value)


@pytest.fixture
async def mig_driver(roots, kube_api):
    """A node with GPU0/GPU1 partitionable (dynamic MIG through the NVML double) and GPU2's MIG devices static."""
    topology = load_node_yaml(mig_node_text(), "h100-mig")
    backend = NvmlMigBackend(FakeNvml(topology))
    opts = dataclasses.replace(options(roots), slices=SliceOptions(
        node_name=NODE, driver_name=DRIVER, mig=DraMig("dynamic", frozenset({0, 1}), placements=backend.placements)),
        mig_backend=lambda _dir: backend)
    drv = dra_driver(opts, kube_api)
    await drv.start(topology)
    try:
        yield drv, await register(registration_sockets(roots[0])[-1]), topology, backend
    finally:
        await drv.stop()
        end_standins(roots)


def static_mig(topology, slot_of_gpu: int = 2):
    gpu = next(d for d in topology.gpus if d.index == slot_of_gpu)
    m = next(d for d in topology.of_kind(DeviceKind.MIG) if d.parent == gpu.name)
    return f"gpu-{slot_of_gpu}-mig-{m.index}", m


async def test_a_static_mig_device_gets_its_own_daemon_and_a_claim_wide_config_of_each_kind_reaches_its_own(
        mig_driver, roots, apiserver):
    drv, plugin, topology, _ = mig_driver
    name, mig = static_mig(topology)
    uid = add_claim(apiserver, "mixed", {"gpu": "gpu-5", "mig": name}, [
        entry(mps_config(defaultActiveThreadPercentage=40)),
        entry(mig_config(strategy="MPS", mpsConfig={"defaultActiveThreadPercentage": 20,
                                                    "defaultPerDevicePinnedMemoryLimit": {mig.uuid: "2Gi"}}))])
    assert (await plugin.prepare(("team", uid, "mixed"))).claims[uid].error == ""
    gpu5 = device_table(topology, SliceOptions(node_name=NODE))["gpu-5"].uuid
    log = told(roots, mig.uuid)
    assert log[0]["event"] == "start" and log[0]["CUDA_VISIBLE_DEVICES"] == mig.uuid
    assert commands_since_last_start(roots, mig.uuid) == ["set_default_device_pinned_mem_limit 0 2048M",
                                                          "set_default_active_thread_percentage 20"]
    assert commands_since_last_start(roots, gpu5) == ["set_default_active_thread_percentage 40"]
    with open(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"), encoding="utf-8") as f:
        per_device = {d["name"]: dict(e.split("=", 1) for e in d["containerEdits"].get("env", []))
                      for d in json.load(f)["devices"]}
    [mig_env] = [e for e in per_device.values() if e.get("CUDA_MPS_PIPE_DIRECTORY") == f"/mps/dra-{mig.uuid}/pipe"]
    assert mig_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20" and mig_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    [gpu_env] = [e for e in per_device.values() if e.get("CUDA_MPS_PIPE_DIRECTORY") == f"/mps/dra-{gpu5}/pipe"]
    assert gpu_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"

    # Its daemon down: the MIG device alone is tainted (not its GPU's other MIG devices).
    hold = pathlib.Path(roots[2], f"dra-{mig.uuid}", "log", "refuse-start")
    hold.touch()
    os.kill(log[0]["pid"], signal.SIGKILL)
    await until(f"{name} tainted", lambda: taints(apiserver, name))
    assert taints(apiserver, name)[0]["value"] == "mps-daemon-down"
    others = [n for s in apiserver.slices.values() for d in s["spec"].get("devices", ())
              if (n := d["name"]).startswith("gpu-2-mig-") and n != name]
    assert others and all(taints(apiserver, n) == [] for n in others)
    hold.unlink()
    await until(f"{name} untainted", lambda: taints(apiserver, name) == [])

    assert (await plugin.unprepare(("team", uid, "mixed"))).claims[uid].error == ""
    assert told(roots, mig.uuid)[-1]["event"] == "quit" and told(roots, gpu5)[-1]["event"] == "quit"


async def test_a_dynamic_mig_device_gets_the_daemon_of_the_instance_made_for_it(mig_driver, roots, apiserver):
    drv, plugin, topology, backend = mig_driver
    uid = add_claim(apiserver, "small", {"mig": "gpu-0-mig-1g-10gb-3"}, [
        entry(mig_config(strategy="MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "5Gi"}), requests=["mig"])])
    assert (await plugin.prepare(("team", uid, "small"))).claims[uid].error == ""
    [inst] = backend.instances(next(d for d in topology.gpus if d.index == 0))
    assert inst.uuid.startswith("MIG-")
    log = told(roots, inst.uuid)
    assert log[0]["CUDA_VISIBLE_DEVICES"] == inst.uuid
    assert commands_since_last_start(roots, inst.uuid) == ["set_default_device_pinned_mem_limit 0 5120M"]
    env, _ = edits_of(roots, uid)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"/mps/dra-{inst.uuid}/pipe"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5120M"
    assert (await plugin.unprepare(("team", uid, "small"))).claims[uid].error == ""
    assert told(roots, inst.uuid)[-1]["event"] == "quit" and backend.instances(
        next(d for d in topology.gpus if d.index == 0)) == []


@pytest.mark.parametrize("configs, message", [
    ([entry(mig_config(strategy="MPS"), requests=["gpu"])],
     "MigDeviceConfig with strategy MPS applies to request 'gpu', which got gpu-5 (gpu), not a MIG device "
     "(fix: kind: GpuConfig for a full GPU"),
    ([entry(mps_config(), requests=["mig"])],
     "GpuConfig with strategy MPS applies to request 'mig', which got {mig} (mig), not a full GPU "
     "(fix: kind: MigDeviceConfig for a MIG device"),
])
async def test_a_config_naming_a_request_of_the_other_kind_is_refused_and_starts_nothing(
        mig_driver, roots, apiserver, configs, message):
    _, plugin, topology, _ = mig_driver
    name, _ = static_mig(topology)
    uid = add_claim(apiserver, "wrong", {"gpu": "gpu-5", "mig": name}, configs)
    err = (await plugin.prepare(("team", uid, "wrong"))).claims[uid].error
    assert message.format(mig=name) in err, err
    assert not os.path.exists(roots[2]) or not os.listdir(roots[2])


def test_multi_user_reads_as_nvidias_and_a_non_boolean_is_refused():
    got = parse_gpu_config(one(mps_config(multiUser=True)))
    assert got is not None and got.mps is not None and got.mps.multi_user
    with pytest.raises(GpuConfigError) as e:
        parse_gpu_config(one(mps_config(multiUser="yes")))
    assert "sharing.mpsConfig.multiUser: 'yes' is not a boolean (fix: multiUser: true or false)" in str(e.value)


async def test_a_multi_user_daemon_is_started_with_m_and_a_claim_asking_otherwise_is_refused(
        plugin, roots, apiserver, dgx_h100):
    uuid = device_table(dgx_h100, SliceOptions(node_name=NODE))["gpu-6"].uuid
    first = add_claim(apiserver, "multi", {"gpu": "gpu-6"}, [entry(mps_config(multiUser=True))])
    assert (await plugin.prepare(("team", first, "multi"))).claims[first].error == ""
    assert told(roots, uuid)[0]["multi_user"] is True
    single = add_claim(apiserver, "single", {"gpu": "gpu-6"}, [entry(mps_config())])
    err = (await plugin.prepare(("team", single, "single"))).claims[single].error
    assert "its MPS control daemon runs in multi-user mode for the claims holding it" in err, err
    assert "(fix: ask multiUser: true, or wait until those claims are gone)" in err, err
    same = add_claim(apiserver, "same", {"gpu": "gpu-6"}, [entry(mps_config(multiUser=True))])
    assert (await plugin.prepare(("team", same, "same"))).claims[same].error == ""
    assert [r["event"] for r in told(roots, uuid)].count("start") == 1
    for uid, name in ((first, "multi"), (same, "same")):
        assert (await plugin.unprepare(("team", uid, name))).claims[uid].error == ""
    assert told(roots, uuid)[-1]["event"] == "quit"
