"""Dynamic MIG through the driver's kubelet side: instances made at prepare, destroyed at unprepare, never leaked.

Real gRPC on real unix sockets (the stand-in kubelet), claims from the stand-in API server, and the
MIG backend at the hardware boundary: the NVML double (`FakeNvml`, which models GPU and compute
instance creation with placements) behind `NvmlMigBackend`, or the simulated node's state file.
"""

from __future__ import annotations

import json
import os

import pytest

from kubelet_standin import register, registration_sockets
from plugin.dra import DraDriver, DraOptions, SliceOptions
from plugin.dra.kubelet.cdi import ClaimSpecs
from plugin.dra.mig.devices import DraMig
from plugin.dra.mig.prepare import BookEntry, MigBook
from plugin.dra.mig.instances import NvmlMigBackend, SimulatedMigBackend, default_state_path
from plugin.runtime.compose.dra import dra_driver
from plugin.sources.mig_profiles import H100_80GB
from plugin.sources.simulated import load_node_yaml
from topo_testkit.fake_nvml import R470_MISSING, FakeNvml
from topo_testkit.mig_node import mig_node_text

NODE = "node-a"
DRIVER = "topo.dev"


@pytest.fixture
def roots(short_tmp):
    # unix socket paths must stay short (tests/conftest.py)
    return os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi")


@pytest.fixture
def topology():
    return load_node_yaml(mig_node_text(), "h100-mig")


@pytest.fixture(params=["nvml", "simulated"])
def backend(request, roots, topology):
    """(backend factory for the driver, the backend the test inspects)."""
    if request.param == "nvml":
        fake = FakeNvml(topology)  # not initialised: discovery shuts its NVML down, the backend takes its own
        b = NvmlMigBackend(fake)
        b.fake = fake
        return (lambda _dir: b), b
    b = SimulatedMigBackend(default_state_path(os.path.join(roots[0], "plugins", DRIVER)))
    return (lambda plugin_dir: SimulatedMigBackend(default_state_path(plugin_dir))), b


@pytest.fixture
async def start_driver(roots, kube_api, topology, backend):
    started: list[DraDriver] = []
    make, inspect = backend

    async def start(instance: str = "pod-1", cdi=None) -> DraDriver:
        mig = DraMig("dynamic", frozenset({0, 1}), placements=inspect.placements)
        opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER, mig=mig), kubelet_root=roots[0],
                          cdi_root=roots[1], instance_id=instance, resync_s=3600, mig_backend=make)
        drv = dra_driver(opts, kube_api, cdi=cdi)
        await drv.start(topology)
        started.append(drv)
        return drv

    yield start
    for d in started:
        await d.stop()


def gpu(topology, i: int):
    return next(d for d in topology.gpus if d.index == i)


def made(backend, topology, i: int = 0) -> list[tuple[str, int]]:
    return sorted((x.profile, x.start) for x in backend[1].instances(gpu(topology, i)))


def claim(device: str) -> list[dict]:
    return [{"request": "mig", "driver": DRIVER, "pool": NODE, "device": device}]


def spec(roots, uid: str) -> dict:
    with open(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"), encoding="utf-8") as f:
        return json.load(f)


def book(roots) -> list[BookEntry]:
    return MigBook(os.path.join(roots[0], "plugins", DRIVER, "mig-instances.json")).load()


async def plugin_for(roots):
    return await register(registration_sockets(roots[0])[0])


async def test_prepare_creates_the_instance_and_unprepare_destroys_it(start_driver, roots, apiserver, backend,
                                                                     topology):
    await start_driver()
    plugin = await plugin_for(roots)
    uid = apiserver.add_claim("team", "small", claim("gpu-0-mig-1g-10gb-3"))
    resp = await plugin.prepare(("team", uid, "small"))
    assert resp.claims[uid].error == ""
    assert made(backend, topology) == [("1g.10gb", 3)]
    [inst] = backend[1].instances(gpu(topology, 0))
    assert inst.uuid.startswith("MIG-")
    dev = spec(roots, uid)["devices"][0]
    assert f"TOPO_DEV_GPU_0_MIG_1G_10GB_3={inst.uuid}" in dev["containerEdits"]["env"]
    assert "/dev/nvidia0" in [n["path"] for n in dev["containerEdits"]["deviceNodes"]]
    assert [(e.claim, e.state, e.gi) for e in book(roots)] == [(uid, "created", inst.gi)]
    # The kubelet repeats the prepare: same answer, no second instance.
    assert (await plugin.prepare(("team", uid, "small"))) == resp
    assert made(backend, topology) == [("1g.10gb", 3)]

    assert (await plugin.unprepare(("team", uid, "small"))).claims[uid].error == ""
    assert made(backend, topology) == [] and book(roots) == []


async def test_a_second_claim_fits_beside_the_first_and_an_overlapping_one_fails_alone(start_driver, roots,
                                                                                        apiserver, backend, topology):
    await start_driver()
    plugin = await plugin_for(roots)
    a = apiserver.add_claim("team", "a", claim("gpu-0-mig-3g-40gb-4"))
    b = apiserver.add_claim("team", "b", claim("gpu-0-mig-4g-40gb-0"))
    c = apiserver.add_claim("team", "c", claim("gpu-0-mig-1g-10gb-5"))  # a stale allocation: overlaps a
    resp = await plugin.prepare(("team", a, "a"), ("team", b, "b"), ("team", c, "c"))
    assert resp.claims[a].error == "" and resp.claims[b].error == ""
    assert "insufficient resources" in resp.claims[c].error.lower() or "overlaps" in resp.claims[c].error
    assert made(backend, topology) == [("3g.40gb", 4), ("4g.40gb", 0)]
    assert sorted(e.claim for e in book(roots)) == sorted([a, b])


async def test_the_whole_partitionable_gpu_is_prepared_as_its_full_size_instance(start_driver, roots, apiserver,
                                                                                backend, topology):
    await start_driver()
    plugin = await plugin_for(roots)
    uid = apiserver.add_claim("team", "whole", claim("gpu-1"))
    assert (await plugin.prepare(("team", uid, "whole"))).claims[uid].error == ""
    assert made(backend, topology, 1) == [("7g.80gb", 0)]


async def test_a_static_mig_device_is_prepared_without_touching_mig(start_driver, roots, apiserver, backend,
                                                                   topology):
    await start_driver()
    plugin = await plugin_for(roots)
    uid = apiserver.add_claim("team", "static", claim("gpu-2-mig-1"))
    assert (await plugin.prepare(("team", uid, "static"))).claims[uid].error == ""
    mig = next(m for m in topology.devices if m.parent == gpu(topology, 2).name and m.index == 1)
    dev = spec(roots, uid)["devices"][0]
    assert f"TOPO_DEV_GPU_2_MIG_1={mig.uuid}" in dev["containerEdits"]["env"]
    assert "/dev/nvidia2" in [n["path"] for n in dev["containerEdits"]["deviceNodes"]]
    assert book(roots) == []
    if hasattr(backend[1], "fake"):
        assert backend[1].fake.calls["nvmlDeviceCreateGpuInstanceWithPlacement"] == 0
    else:
        assert made(backend, topology, 2) == []


async def test_a_restart_between_prepare_and_unprepare_leaks_nothing(start_driver, roots, apiserver, backend,
                                                                    topology):
    first = await start_driver("pod-1")
    plugin = await plugin_for(roots)
    uid = apiserver.add_claim("team", "small", claim("gpu-0-mig-2g-20gb-2"))
    before = await plugin.prepare(("team", uid, "small"))
    await first.stop()
    await start_driver("pod-2")
    plugin = await plugin_for(roots)
    assert await plugin.prepare(("team", uid, "small")) == before
    assert made(backend, topology) == [("2g.20gb", 2)]
    assert (await plugin.unprepare(("team", uid, "small"))).claims[uid].error == ""
    assert made(backend, topology) == [] and book(roots) == []


@pytest.mark.parametrize("created", [True, False], ids=["instance-made", "create-never-ran"])
async def test_a_crash_between_create_and_record_is_settled_at_restart(created, start_driver, roots, apiserver,
                                                                      backend, topology):
    """The process died after writing its intent: with the instance made (adopted at restart, then used by the
    kubelet's repeated prepare, never made twice) or before NVML was called (the intent is dropped)."""
    uid = apiserver.add_claim("team", "small", claim("gpu-0-mig-1g-10gb-6"))
    plugin_dir = os.path.join(roots[0], "plugins", DRIVER)
    os.makedirs(plugin_dir, exist_ok=True)
    MigBook(os.path.join(plugin_dir, "mig-instances.json")).save(
        [BookEntry(claim=uid, device="gpu-0-mig-1g-10gb-6", gpu="GPU0", profile="1g.10gb", start=6, state="creating")])
    if created:
        inst = backend[1].create(gpu(topology, 0), next(p for p in H100_80GB.placements()
                                                          if p.profile.name == "1g.10gb" and p.start == 6))
    await start_driver()
    entries = book(roots)
    if created:
        assert [(e.state, e.gi, e.uuid) for e in entries] == [("created", inst.gi, inst.uuid)]
    else:
        assert entries == []
    plugin = await plugin_for(roots)
    assert (await plugin.prepare(("team", uid, "small"))).claims[uid].error == ""
    assert made(backend, topology) == [("1g.10gb", 6)]
    if created:
        assert f"={inst.uuid}" in " ".join(spec(roots, uid)["devices"][0]["containerEdits"]["env"])
    assert (await plugin.unprepare(("team", uid, "small"))).claims[uid].error == ""
    assert made(backend, topology) == [] and book(roots) == []


async def test_a_claim_whose_spec_cannot_be_written_gives_its_instance_back(start_driver, roots, apiserver, backend,
                                                                           topology):
    class FullDisk(ClaimSpecs):
        def write_claim_spec(self, claim_uid, devices, settings=None):
            raise OSError(28, "No space left on device")

    await start_driver(cdi=FullDisk(roots[1], DRIVER))
    plugin = await plugin_for(roots)
    uid = apiserver.add_claim("team", "small", claim("gpu-0-mig-1g-10gb-2"))
    assert "No space left" in (await plugin.prepare(("team", uid, "small"))).claims[uid].error
    assert made(backend, topology) == [] and book(roots) == []


@pytest.mark.parametrize("backend", ["nvml"], indirect=True)  # NVML's two-step create; simulated makes both at once
async def test_a_failed_compute_instance_leaves_no_gpu_instance(start_driver, roots, apiserver, backend, topology):
    fake = backend[1].fake
    await start_driver()
    plugin = await plugin_for(roots)
    uid = apiserver.add_claim("team", "small", claim("gpu-0-mig-1g-10gb-0"))
    fake.fail_next("nvmlGpuInstanceCreateComputeInstance", 2)
    err = (await plugin.prepare(("team", uid, "small"))).claims[uid].error
    assert "compute instance" in err and "GPU0" in err
    assert fake.mig_instances("GPU0") == [] and book(roots) == []
    assert not os.path.exists(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"))


def test_nvml_placements_match_the_profile_table_and_a_refused_profile_is_left_out(topology):
    fake = FakeNvml(topology)
    backend = NvmlMigBackend(fake)
    assert backend.placements(gpu(topology, 0)) == H100_80GB.placements()
    assert fake.calls["nvmlDeviceGetGpuInstancePossiblePlacements"] == len(H100_80GB.profiles)
    assert fake.init_count == 1
    fake.fail_next("nvmlDeviceGetGpuInstancePossiblePlacements", 3)  # the first profile, 1g.10gb, refused
    assert backend.placements(gpu(topology, 0)) == [p for p in H100_80GB.placements() if p.profile.name != "1g.10gb"]
    # A GPU not in MIG mode offers none (NVML: not supported).
    assert backend.placements(gpu(topology, 5)) == []


def test_an_r470_driver_without_the_versioned_profile_calls_still_creates_and_destroys(topology):
    fake = FakeNvml(topology, missing_functions=R470_MISSING)
    backend = NvmlMigBackend(fake)
    assert backend.placements(gpu(topology, 1)) == H100_80GB.placements()
    p = next(p for p in H100_80GB.placements() if p.profile.name == "2g.20gb" and p.start == 4)
    inst = backend.create(gpu(topology, 1), p)
    assert fake.mig_instances("GPU1") == [("2g.20gb", 4, inst.gi, 0)]
    assert [(i.profile, i.start, i.uuid) for i in backend.instances(gpu(topology, 1))] == [("2g.20gb", 4, inst.uuid)]
    backend.destroy(gpu(topology, 1), inst.gi, inst.ci)
    backend.destroy(gpu(topology, 1), inst.gi, inst.ci)  # again: already gone is not an error
    assert fake.mig_instances("GPU1") == []
    assert fake.calls["nvmlDeviceGetGpuInstanceProfileInfo"] > 0 and fake.calls["nvmlDeviceGetGpuInstanceProfileInfoV"] == 1
