"""GPU time-slicing through claim config: GpuConfig parsing, one setting per GPU, applied and undone.

The kubelet side runs over real gRPC on real unix sockets (kubelet_standin.py) against the
stand-in API server, as in test_kubelet_side.py; claims carry their configs in
`status.allocation.devices.config`, as the scheduler writes them. The simulated GPU backend's
settings file and the CDI spec are read from disk; the nvidia-smi backend runs a real
executable standing in for nvidia-smi (the hardware boundary) that records its arguments.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace

import pytest
from topo_testkit.fake_nvml import FakeNvml
from topo_testkit.with_fake_nvml import installed

from kubelet_standin import register, registration_sockets
from plugin.dra import DraDriver, DraOptions, SliceOptions
from plugin.dra.kubelet.cdi import ClaimSpecs
from plugin.dra.claims.claim import parse_claim
from plugin.dra.claims.opaque import OpaqueConfig, configs_for
from plugin.dra.claims.gpu_config import API_VERSION, NVIDIA_API_VERSION, GpuConfigError, Interval, parse_gpu_config
from plugin.dra.claims.sharing import SIMULATED_STATE_FILE
from plugin.dra.slices.build import device_table
from plugin.runtime.compose.dra import dra_driver

NODE = "node-a"
DRIVER = "topo.dev"


def gpu_config(interval: str | None = "Short", api: str = API_VERSION, **extra) -> dict:
    sharing: dict = {"strategy": "TimeSlicing"}
    if interval is not None:
        sharing["timeSlicingConfig"] = {"interval": interval}
    return {"apiVersion": api, "kind": "GpuConfig", "sharing": sharing, **extra}


def entry(params, requests=(), source="FromClaim", driver=DRIVER) -> dict:
    return {"source": source, "requests": list(requests), "opaque": {"driver": driver, "parameters": params}}


def one(params) -> OpaqueConfig:
    return OpaqueConfig(source="FromClaim", requests=(), parameters=params, index=0)


# ---- parsing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", [API_VERSION, NVIDIA_API_VERSION])
@pytest.mark.parametrize("interval", ["Default", "Short", "Medium", "Long"])
def test_our_and_nvidias_gpu_config_mean_the_same(api, interval):
    got = parse_gpu_config(one(gpu_config(interval, api)))
    assert got is not None and got.timeslice is Interval(interval)


def test_time_slicing_without_an_interval_is_default_and_no_sharing_asks_nothing():
    assert parse_gpu_config(one(gpu_config(None))).timeslice is Interval.DEFAULT
    assert parse_gpu_config(one({"apiVersion": API_VERSION, "kind": "GpuConfig"})).timeslice is None


def test_other_kinds_are_left_to_their_own_parsers():
    assert parse_gpu_config(one({"apiVersion": "net.example/v1", "kind": "NicConfig", "mtu": 9000})) is None
    assert parse_gpu_config(one("not an object")) is None


@pytest.mark.parametrize("params, field, fix", [
    (gpu_config("Fast"), "sharing.timeSlicingConfig.interval", "one of Default, Short, Medium, Long"),
    (gpu_config("Short", api="gpu.topo-device-plugin.io/v2"), ".apiVersion", f"apiVersion: {API_VERSION}"),
    ({**gpu_config(), "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}},
     "sharing.mpsConfig.defaultActiveThreadPercentage", "an integer from 0 to 100"),
    ({**gpu_config(), "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}},
     "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit", "512Mi, 10Gi or 4G"),
    ({**gpu_config(), "sharing": {"strategy": "MPS", "mpsConfig": {"defaultThreads": 5}}},
     "sharing.mpsConfig: unknown field 'defaultThreads'", "use only defaultActiveThreadPercentage"),
    ({**gpu_config(), "sharing": {"strategy": "Timeslicing"}}, "sharing.strategy", "strategy: TimeSlicing"),
    ({**gpu_config(), "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}}}, "sharing.mpsConfig",
     "remove mpsConfig"),
    (gpu_config("Short", sharring={}), "opaque.parameters: unknown field 'sharring'", "use only apiVersion"),
    ({**gpu_config(), "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Short"}}},
     "sharing.timeSlicingConfig: unknown field 'intervall'", "use only interval"),
])
def test_a_bad_gpu_config_names_the_entry_the_field_and_the_fix(params, field, fix):
    with pytest.raises(GpuConfigError) as e:
        parse_gpu_config(OpaqueConfig(source="FromClaim", requests=("gpu",), parameters=params, index=2))
    msg = str(e.value)
    assert msg.startswith("status.allocation.devices.config[2] (FromClaim).opaque.parameters"), msg
    assert field in msg and fix in msg, msg


def test_only_our_drivers_configs_are_read_and_a_claims_config_overrides_its_class():
    claim = {"status": {"allocation": {"devices": {"config": [
        entry(gpu_config("Long"), source="FromClass"),
        entry(gpu_config("Medium"), driver="gpu.nvidia.com"),
        entry(gpu_config("Short"), requests=["gpu"]),
    ]}}}}
    configs = parse_claim(claim).opaque(DRIVER)
    assert [c.index for c in configs] == [0, 2]
    # A subrequest of a prioritized list matches its parent request.
    assert [c.index for c in configs_for(configs, "gpu/fast")] == [0, 2]
    assert [c.index for c in configs_for(configs, "other")] == [0]


# ---- the kubelet side -------------------------------------------------------------------------------


@pytest.fixture
def roots(short_tmp):
    # unix socket paths must stay short (tests/conftest.py)
    return os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi"), short_tmp


@pytest.fixture
async def driver(roots, kube_api, dgx_h100):
    started: list[DraDriver] = []

    async def start(real_gpus: bool = False, cdi=None):
        opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=roots[0],
                          cdi_root=roots[1], instance_id=f"pod-{len(started)}", resync_s=3600, real_gpus=real_gpus)
        drv = dra_driver(opts, kube_api, cdi=cdi)
        await drv.start(dgx_h100)
        started.append(drv)
        return await register(registration_sockets(roots[0])[-1])

    yield start
    for d in started:
        await d.stop()


def add_claim(apiserver, name: str, devices: dict[str, str], configs: list[dict]) -> str:
    """A claim with `devices` ({request: device}) allocated and `configs` in its allocation."""
    uid = apiserver.add_claim("team", name, [{"request": r, "driver": DRIVER, "pool": NODE, "device": d}
                                             for r, d in devices.items()])
    apiserver.claims[("team", name)]["status"]["allocation"]["devices"]["config"] = configs
    return uid


def settings(roots) -> dict:
    path = os.path.join(roots[0], "plugins", DRIVER, SIMULATED_STATE_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return {v["index"]: v["timeslice"] for v in json.load(f).values()}


def env_of(roots, uid: str) -> dict[str, str]:
    with open(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"), encoding="utf-8") as f:
        spec = json.load(f)
    return dict(e.split("=", 1) for d in spec["devices"] for e in d["containerEdits"].get("env", []))


def recorded(roots) -> dict[str, dict[str, str]]:
    if not os.path.exists(os.path.join(roots[0], "plugins", DRIVER, "checkpoint.json")):
        return {}  # nothing was ever recorded
    with open(os.path.join(roots[0], "plugins", DRIVER, "checkpoint.json"), encoding="utf-8") as f:
        claims = json.load(f)["claims"]
    return {uid: {d["device"]: d.get("timeslice", "") for d in c["devices"]} for uid, c in claims.items()}


async def test_a_time_sliced_claim_sets_its_gpu_shows_it_in_the_container_and_undoes_it(
        driver, roots, apiserver, dgx_h100):
    plugin = await driver()
    uid = add_claim(apiserver, "shared", {"gpu": "gpu-2", "nic": "nic-mlx5-2"},
                    [entry(gpu_config("Short", NVIDIA_API_VERSION))])  # every request; the NIC has nothing to set
    resp = await plugin.prepare(("team", uid, "shared"))
    assert resp.claims[uid].error == ""
    uuid = device_table(dgx_h100, SliceOptions(node_name=NODE))["gpu-2"].uuid
    env = env_of(roots, uid)
    assert env["TOPO_DEV_GPU_2"] == uuid and env["TOPO_DEV_GPU_2_TIMESLICE"] == "Short"
    assert not [k for k in env if k.startswith("TOPO_DEV_NIC") and k.endswith("_TIMESLICE")]
    assert settings(roots) == {2: "Short"}
    assert recorded(roots) == {uid: {"gpu-2": "Short", "nic-mlx5-2": ""}}

    assert (await plugin.unprepare(("team", uid, "shared"))).claims[uid].error == ""
    assert settings(roots) == {}, "the GPU goes back to Default with its last claim"


async def test_a_claim_without_sharing_config_writes_no_setting_and_no_extra_env(driver, roots, apiserver):
    plugin = await driver()
    uid = add_claim(apiserver, "plain", {"gpu": "gpu-0"}, [])
    assert (await plugin.prepare(("team", uid, "plain"))).claims[uid].error == ""
    assert list(env_of(roots, uid)) == ["TOPO_DEV_GPU_0"]
    assert settings(roots) == {} and recorded(roots) == {uid: {"gpu-0": ""}}


async def test_a_bad_config_fails_the_claim_alone_and_prepares_nothing(driver, roots, apiserver):
    plugin = await driver()
    bad = add_claim(apiserver, "bad", {"gpu": "gpu-0"}, [entry(gpu_config("Fast"), requests=["gpu"])])
    good = add_claim(apiserver, "good", {"gpu": "gpu-1"}, [entry(gpu_config("Long"), requests=["gpu"])])
    resp = await plugin.prepare(("team", bad, "bad"), ("team", good, "good"))
    err = resp.claims[bad].error
    assert err.startswith("ResourceClaim team/bad: status.allocation.devices.config[0] (FromClaim)"), err
    assert "timeSlicingConfig.interval: 'Fast' is not an interval (fix: one of Default, Short, Medium, Long)" in err
    assert resp.claims[good].error == ""
    assert list(recorded(roots)) == [good]
    assert not os.path.exists(os.path.join(roots[1], f"{DRIVER}-claim_{bad}.json"))
    assert settings(roots) == {1: "Long"}


async def test_a_subrequest_of_a_prioritized_list_gets_its_own_config(driver, roots, apiserver):
    """firstAvailable: the result says which subrequest was chosen; a config may name it alone."""
    plugin = await driver()
    uid = add_claim(apiserver, "either", {"gpu/h100": "gpu-6"},
                    [entry(gpu_config("Medium"), requests=["gpu/h100"]), entry(gpu_config("Long"), requests=["gpu/a100"])])
    resp = await plugin.prepare(("team", uid, "either"))
    assert [list(d.request_names) for d in resp.claims[uid].devices] == [["gpu"]]  # the parent, for the kubelet
    assert settings(roots) == {6: "Medium"}


async def test_a_config_naming_a_nic_request_is_refused(driver, roots, apiserver):
    plugin = await driver()
    uid = add_claim(apiserver, "nic", {"gpu": "gpu-0", "nic": "nic-mlx5-0"},
                    [entry(gpu_config("Short"), requests=["nic"])])
    err = (await plugin.prepare(("team", uid, "nic"))).claims[uid].error
    assert "GpuConfig applies to request 'nic', which got nic-mlx5-0 (nic), not a full GPU" in err, err
    assert "fix: list only GPU requests" in err
    assert settings(roots) == {}


async def test_a_gpu_has_one_setting_another_interval_is_refused_the_same_one_shares(driver, roots, apiserver):
    """Two claims holding one GPU (admin access, or shares of consumable capacity): one time-slice."""
    plugin = await driver()
    short = add_claim(apiserver, "short", {"gpu": "gpu-4"}, [entry(gpu_config("Short"))])
    long_ = add_claim(apiserver, "long", {"gpu": "gpu-4"}, [entry(gpu_config("Long"))])
    same = add_claim(apiserver, "same", {"gpu": "gpu-4"}, [entry(gpu_config("Short"))])
    assert (await plugin.prepare(("team", short, "short"))).claims[short].error == ""
    err = (await plugin.prepare(("team", long_, "long"))).claims[long_].error
    assert err == ("ResourceClaim team/long: gpu-4 (GPU4) is time-sliced with interval Short for claim team/short; "
                   "a GPU has one time-slice setting, this claim asks Long (fix: ask Short, or wait until "
                   "team/short is gone)")
    assert (await plugin.prepare(("team", same, "same"))).claims[same].error == ""
    assert settings(roots) == {4: "Short"}
    # The first holder goes: the other still holds the setting.
    await plugin.unprepare(("team", short, "short"))
    assert settings(roots) == {4: "Short"}
    err = (await plugin.prepare(("team", long_, "long"))).claims[long_].error
    assert "for claim team/same" in err
    await plugin.unprepare(("team", same, "same"))
    assert settings(roots) == {}
    # Nobody holds it now: Long is granted.
    assert (await plugin.prepare(("team", long_, "long"))).claims[long_].error == ""
    assert settings(roots) == {4: "Long"}


async def test_a_claim_whose_spec_cannot_be_written_leaves_its_gpu_at_default(driver, roots, apiserver):
    class FullDisk(ClaimSpecs):
        def write_claim_spec(self, claim_uid, devices, settings=None):
            raise OSError(28, "No space left on device")

    plugin = await driver(cdi=FullDisk(roots[1], DRIVER))
    uid = add_claim(apiserver, "full", {"gpu": "gpu-3"}, [entry(gpu_config("Long"))])
    assert "No space left on device" in (await plugin.prepare(("team", uid, "full"))).claims[uid].error
    assert settings(roots) == {} and recorded(roots) == {}


async def test_the_setting_and_its_holders_survive_a_driver_restart(driver, roots, apiserver):
    plugin = await driver()
    short = add_claim(apiserver, "short", {"gpu": "gpu-4"}, [entry(gpu_config("Short"))])
    await plugin.prepare(("team", short, "short"))
    plugin = await driver()  # a second instance, as after a restart or during a rolling update
    long_ = add_claim(apiserver, "long", {"gpu": "gpu-4"}, [entry(gpu_config("Long"))])
    assert "for claim team/short" in (await plugin.prepare(("team", long_, "long"))).claims[long_].error
    await plugin.unprepare(("team", short, "short"))
    assert settings(roots) == {}


def fake_nvidia_smi(directory: str, exit_code: int = 0) -> str:
    """An executable named nvidia-smi that appends its arguments to calls.log and exits with `exit_code`."""
    path = os.path.join(directory, "nvidia-smi")
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n"
                f'echo "$@" >> "{directory}/calls.log"\n'
                + (f'echo "Unable to set the timeslice: Not Supported" >&2\nexit {exit_code}\n' if exit_code else ""))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


async def test_real_gpus_are_set_with_nvidia_smi_compute_policy(driver, roots, apiserver, dgx_h100, monkeypatch):
    bin_dir = os.path.join(roots[2], "bin")
    os.makedirs(bin_dir)
    fake_nvidia_smi(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    plugin = await driver(real_gpus=True)
    uid = add_claim(apiserver, "real", {"gpu": "gpu-1"}, [entry(gpu_config("Medium"))])
    assert (await plugin.prepare(("team", uid, "real"))).claims[uid].error == ""
    await plugin.unprepare(("team", uid, "real"))
    uuid = device_table(dgx_h100, SliceOptions(node_name=NODE))["gpu-1"].uuid
    with open(os.path.join(bin_dir, "calls.log"), encoding="utf-8") as f:
        calls = f.read().splitlines()
    assert calls == [f"compute-policy -i {uuid} --set-timeslice=2", f"compute-policy -i {uuid} --set-timeslice=0"]
    assert settings(roots) == {}, "real GPUs keep no simulated file"


async def test_a_gpu_not_in_default_compute_mode_refuses_a_time_slice(driver, roots, apiserver, dgx_h100, monkeypatch):
    """NVML's part on real GPUs: the compute mode is read; EXCLUSIVE_PROCESS (an operator's choice) is kept
    and the claim is refused with the fix, instead of its second pod failing at its first CUDA call."""
    table = device_table(dgx_h100, SliceOptions(node_name=NODE))
    by_name = {d.name: d for d in table.values()}
    gpus = replace(dgx_h100, devices=tuple(by_name.get(d.name, d) for d in dgx_h100.devices))
    fake = FakeNvml(gpus.without(d.name for d in gpus.nics))
    fake.gpus[1].compute_mode = 3  # EXCLUSIVE_PROCESS
    bin_dir = os.path.join(roots[2], "bin")
    os.makedirs(bin_dir)
    fake_nvidia_smi(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with installed(fake):
        plugin = await driver(real_gpus=True)
    excl = add_claim(apiserver, "excl", {"gpu": "gpu-1"}, [entry(gpu_config("Short"))])
    err = (await plugin.prepare(("team", excl, "excl"))).claims[excl].error
    assert err == (f"ResourceClaim team/excl: GPU1 is in compute mode EXCLUSIVE_PROCESS, which lets one process at "
                   "a time use it: the claim's containers cannot take turns on it (fix: nvidia-smi -i "
                   f"{table['gpu-1'].uuid} -c DEFAULT on the node, or a GPU in DEFAULT mode)")
    ok = add_claim(apiserver, "ok", {"gpu": "gpu-2"}, [entry(gpu_config("Short"))])
    assert (await plugin.prepare(("team", ok, "ok"))).claims[ok].error == ""
    with open(os.path.join(bin_dir, "calls.log"), encoding="utf-8") as f:
        assert f.read().splitlines() == [f"compute-policy -i {table['gpu-2'].uuid} --set-timeslice=1"]
    assert fake.calls["nvmlDeviceGetComputeMode"] == 2 and fake.init_count == 0


async def test_a_failing_or_missing_nvidia_smi_fails_the_claim_with_the_reason(driver, roots, apiserver, monkeypatch):
    bin_dir = os.path.join(roots[2], "bin")
    os.makedirs(bin_dir)
    monkeypatch.setenv("PATH", bin_dir)  # no nvidia-smi anywhere
    plugin = await driver(real_gpus=True)
    uid = add_claim(apiserver, "real", {"gpu": "gpu-1"}, [entry(gpu_config("Short"))])
    err = (await plugin.prepare(("team", uid, "real"))).claims[uid].error
    assert "needs nvidia-smi, which is not in the DRA driver's PATH" in err and "fix: mount" in err, err
    fake_nvidia_smi(bin_dir, exit_code=3)
    err = (await plugin.prepare(("team", uid, "real"))).claims[uid].error
    assert "--set-timeslice=1 failed (exit 3): Unable to set the timeslice: Not Supported" in err, err
    assert recorded(roots) == {}
    assert not os.path.exists(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"))



# ---- consumable capacity: shares of one GPU ----------------------------------------------------------


async def test_shares_of_a_gpu_are_prepared_with_their_share_ids_and_one_cdi_device(driver, roots, apiserver):
    """Consumable capacity (KEP-5075): the scheduler gives each allocation of a GPU with
    allowMultipleAllocations a share ID, which the kubelet expects back with the device."""
    plugin = await driver()
    share_a, share_b = "0f6f3f0e-6a4d-4d8e-9d7c-1a2b3c4d5e6f", "7c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f"
    uid = apiserver.add_claim("team", "halves", [
        {"request": "a", "driver": DRIVER, "pool": NODE, "device": "gpu-5", "shareID": share_a,
         "consumedCapacity": {"memory": "40Gi"}},
        {"request": "b", "driver": DRIVER, "pool": NODE, "device": "gpu-5", "shareID": share_b,
         "consumedCapacity": {"memory": "40Gi"}}])
    other = apiserver.add_claim("team", "other", [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-5", "shareID": share_a.replace("0f", "1f")}])
    resp = await plugin.prepare(("team", uid, "halves"), ("team", other, "other"))
    assert resp.claims[uid].error == "" and resp.claims[other].error == ""
    got = [(d.device_name, list(d.request_names), d.share_id, list(d.cdi_device_ids)) for d in resp.claims[uid].devices]
    cdi = f"{DRIVER}/claim={uid}-gpu-5"
    assert got == [("gpu-5", ["a"], share_a, [cdi]), ("gpu-5", ["b"], share_b, [cdi])]
    with open(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"), encoding="utf-8") as f:
        assert [d["name"] for d in json.load(f)["devices"]] == [f"{uid}-gpu-5"]
    # Restart-safe: the answer comes back the same from the checkpoint.
    plugin = await driver()
    assert (await plugin.prepare(("team", uid, "halves"))).claims[uid] == resp.claims[uid]


async def test_a_whole_device_has_no_share_id_in_the_answer(driver, roots, apiserver):
    plugin = await driver()
    uid = add_claim(apiserver, "whole", {"gpu": "gpu-0"}, [])
    [dev] = (await plugin.prepare(("team", uid, "whole"))).claims[uid].devices
    assert not dev.HasField("share_id")


async def test_two_shares_of_one_gpu_in_one_claim_cannot_ask_two_intervals(driver, roots, apiserver):
    plugin = await driver()
    uid = apiserver.add_claim("team", "torn", [
        {"request": r, "driver": DRIVER, "pool": NODE, "device": "gpu-5", "shareID": share}
        for r, share in (("a", "0f6f3f0e-6a4d-4d8e-9d7c-1a2b3c4d5e6f"), ("b", "7c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f"))])
    apiserver.claims[("team", "torn")]["status"]["allocation"]["devices"]["config"] = [
        entry(gpu_config("Short"), requests=["a"]), entry(gpu_config("Long"), requests=["b"])]
    err = (await plugin.prepare(("team", uid, "torn"))).claims[uid].error
    assert "gpu-5 gets interval Long through request 'b' and Short through another request of the claim" in err, err
    assert "(fix: one interval per GPU)" in err and settings(roots) == {} and recorded(roots) == {}


async def test_a_claim_whose_second_gpu_cannot_be_set_puts_the_first_back(driver, roots, apiserver, dgx_h100,
                                                                           monkeypatch):
    table = device_table(dgx_h100, SliceOptions(node_name=NODE))
    u1, u2 = table["gpu-1"].uuid, table["gpu-2"].uuid
    bin_dir = os.path.join(roots[2], "bin")
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "nvidia-smi"), "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\necho "$@" >> "{bin_dir}/calls.log"\n'
                f'case "$*" in *{u2}*) echo "GPU is lost" >&2; exit 15;; esac\n')
    os.chmod(os.path.join(bin_dir, "nvidia-smi"), 0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    plugin = await driver(real_gpus=True)
    uid = add_claim(apiserver, "two", {"a": "gpu-1", "b": "gpu-2"}, [entry(gpu_config("Long"))])
    err = (await plugin.prepare(("team", uid, "two"))).claims[uid].error
    assert "failed (exit 15): GPU is lost" in err, err
    with open(os.path.join(bin_dir, "calls.log"), encoding="utf-8") as f:
        assert f.read().splitlines() == [f"compute-policy -i {u1} --set-timeslice=3",
                                         f"compute-policy -i {u2} --set-timeslice=3",
                                         f"compute-policy -i {u1} --set-timeslice=0"]
    assert recorded(roots) == {}
