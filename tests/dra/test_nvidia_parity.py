"""What NVIDIA's DRA side has that a claim written for it relies on (issue 34), in our slices.

- Multus (multus-cni PR #1492): NICs carry `k8s.cni.cncf.io/resourceName` (the NIC's pool resource
  name, as a NetworkAttachmentDefinition names it in device-plugin mode) and `k8s.cni.cncf.io/deviceID`
  (its PCI address); Multus skips a device lacking either, so neither goes out alone.
- Shares by count (NVIDIA's `--consumable-shares <count>`): capacity `shares` beside `memory`.
- NVSwitch partitions: `gpuModuleID` from NVML (optional call), `partition1/2/4/8` as a simulated node
  states them.
- Host-managed IMEX channels: slice devices with the node's clique, the major from /proc/devices, the
  channel node in the claim's CDI spec at prepare (through the driver over real gRPC).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pathlib
from dataclasses import replace

import pytest

from allocator.topology import DeviceKind, FabricInfo, NodeTopology
from plugin.dra.slices import imex_channels
from plugin.dra.slices.imex_channels import ImexChannelsError, channel_devices, channels_of, read_major
from plugin.dra.slices.build import (ATTR_MULTUS_DEVICE_ID, ATTR_MULTUS_RESOURCE_NAME, SliceOptions,
                               build_resource_slices, device_table)
from plugin.sources.nvml_gpus import discover_gpus
from plugin.sources.simulated import load_node_yaml, load_simulated
from topo_testkit.fake_nvml import FakeNvml

CLUSTER = "8a3e5c71-2d4f-4b96-a0e8-5f7c1b9d2e43"


def devices(topology: NodeTopology, opts: SliceOptions) -> dict[str, dict]:
    table = device_table(topology, opts)
    return {table[d["name"]].name: d for s in build_resource_slices(topology, opts)
            for d in s["spec"].get("devices", ())}


def with_nic_addresses(t: NodeTopology) -> NodeTopology:
    devs = [replace(d, pci_bus_id=f"0000:{0x1a + 0x10 * d.index:02x}:00.0") if d.kind == DeviceKind.NIC else d
            for d in t.devices]
    return NodeTopology.build(devs, t.links, source=t.source, numa_nodes=t.numa_nodes,
                              numa_distances=t.numa_distances)


def value(d: dict, name: str):
    v = d["attributes"].get(name)
    return None if v is None else next(iter(v.values()))


# ---- Multus ------------------------------------------------------------------------------------


def test_nics_carry_multus_resource_name_and_pci_device_id():
    t = with_nic_addresses(load_simulated("dgx-h100"))
    opts = SliceOptions(node_name="node-a", nic_resource_name=lambda d: "topo.dev/nic")
    got = devices(t, opts)
    for d in t.nics:
        entry = got[d.name]
        assert value(entry, ATTR_MULTUS_RESOURCE_NAME) == "topo.dev/nic"
        assert value(entry, ATTR_MULTUS_DEVICE_ID) == d.pci_bus_id  # what host-device gets as pciBusID
    assert not [n for n, e in got.items() if n.startswith("GPU") and ATTR_MULTUS_RESOURCE_NAME in e["attributes"]]


def test_each_nic_names_its_own_pool_and_a_nic_of_no_pool_names_none():
    t = with_nic_addresses(load_simulated("dgx-h100"))
    pools = {"mlx5_0": "example.com/rail-a", "mlx5_1": "example.com/rail-b"}
    got = devices(t, SliceOptions(node_name="node-a", nic_resource_name=lambda d: pools.get(d.name)))
    assert value(got["mlx5_0"], ATTR_MULTUS_RESOURCE_NAME) == "example.com/rail-a"
    assert value(got["mlx5_1"], ATTR_MULTUS_RESOURCE_NAME) == "example.com/rail-b"
    assert ATTR_MULTUS_RESOURCE_NAME not in got["mlx5_2"]["attributes"]
    assert ATTR_MULTUS_DEVICE_ID not in got["mlx5_2"]["attributes"]


def test_a_nic_without_a_pci_address_gets_neither_attribute():
    """Multus would hand host-device no usable ID: publishing the name alone would only make it fail later."""
    t = load_simulated("dgx-h100")  # simulated NICs without pciBusId
    got = devices(t, SliceOptions(node_name="node-a", nic_resource_name=lambda d: "topo.dev/nic"))
    assert not [n for n, e in got.items() if {ATTR_MULTUS_RESOURCE_NAME, ATTR_MULTUS_DEVICE_ID} & set(e["attributes"])]


def test_serve_names_nics_by_their_pool_as_the_device_plugin_side_does(tmp_path):
    from types import SimpleNamespace

    from plugin.model.nic_pools import parse_pools
    from plugin.runtime.compose.dra import nic_resource_names

    raw = [{"resourceName": "rail_a", "selectors": {"vendors": ["15b3"]}}]
    pools = parse_pools(raw, "config.yaml")
    settings = SimpleNamespace(nic_pools=pools, nic_resource_name="topo.dev/nic")  # the two DraSettings fields read
    name = nic_resource_names(settings)  # type: ignore[arg-type]  # a stand-in with the two fields it reads
    t = with_nic_addresses(load_simulated("dgx-h100"))
    nics = {d.name: d for d in t.nics}
    nics["mlx5_0"] = replace(nics["mlx5_0"], attributes={"vendor": "15b3"})  # the one Mellanox function
    assert name(nics["mlx5_0"]) == pools[0].resource_name
    assert name(nics["mlx5_1"]) is None  # in no pool: the device-plugin side serves it under no name either

    no_pools = SimpleNamespace(nic_pools=(), nic_resource_name="topo.dev/nic")
    assert nic_resource_names(no_pools)(nics["mlx5_1"]) == "topo.dev/nic"  # type: ignore[arg-type]  # as above


# ---- shares by count ---------------------------------------------------------------------------


def test_shares_by_count_publish_nvidias_capacity_and_policies():
    t = load_simulated("dgx-h100")
    got = devices(t, SliceOptions(node_name="node-a", gpu_shares=4))
    for g in t.gpus:
        e = got[g.name]
        assert e["allowMultipleAllocations"] is True
        assert e["capacity"]["shares"] == {"value": "4", "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}
        # Memory defaults to nothing, so four claims that name no memory fit on one GPU.
        mem = e["capacity"]["memory"]
        assert mem["value"] == f"{g.memory_mib}Mi"
        assert mem["requestPolicy"] == {"default": "0", "validRange": {"min": "0", "max": mem["value"], "step": "1Mi"}}
    assert not [n for n, e in got.items() if not n.startswith("GPU") and "allowMultipleAllocations" in e]


def test_without_a_share_count_memory_shares_are_unchanged():
    got = devices(load_simulated("dgx-h100"), SliceOptions(node_name="node-a", shared_gpus=True))
    assert {tuple(e["capacity"]) for n, e in got.items() if n.startswith("GPU")} == {("memory",)}
    assert all("requestPolicy" not in e["capacity"]["memory"] for n, e in got.items() if n.startswith("GPU"))


@pytest.mark.parametrize("shares", [-1, 1025])
def test_a_share_count_out_of_range_is_refused(shares):
    with pytest.raises(ValueError, match="gpu_shares"):
        SliceOptions(node_name="node-a", gpu_shares=shares)


def test_a_fractional_share_count_is_refused_naming_the_option():
    from plugin.cli.typed import whole_count
    from plugin.errors import InputError

    def gpu_shares(settings):
        return whole_count(settings, "dra_gpu_shares", "shares")

    class _Settings:
        values = {"dra_gpu_shares": 2.5}
        sources: dict = {}
        config = type("C", (), {"flags": {"draGpuShares": 2.5}, "path": "config.yaml"})()

    with pytest.raises(InputError, match=r"config.yaml: field flags.draGpuShares: 2.5 is not a whole number"):
        gpu_shares(_Settings())  # type: ignore[arg-type]  # a stand-in with the fields it reads
    _Settings.values = {"dra_gpu_shares": 4.0}
    assert gpu_shares(_Settings()) == 4  # type: ignore[arg-type]  # as above


# ---- NVSwitch partitions -----------------------------------------------------------------------

PARTITIONED = """\
apiVersion: topo-device-plugin/v1
kind: SimulatedNode
metadata: {name: hgx}
gpus:
  - {numa: 0, moduleId: 1, partitions: {partition1: 7, partition2: 3, partition4: 1, partition8: 0}}
  - {numa: 0, moduleId: 2, partitions: {partition1: 8, partition2: 3, partition4: 1, partition8: 0}}
  - {numa: 0}
"""


def test_a_simulated_node_states_module_ids_and_partitions_and_slices_publish_them():
    t = load_node_yaml(PARTITIONED, "hgx.yaml")
    got = devices(t, SliceOptions(node_name="node-a"))
    assert {k: value(got["GPU0"], k) for k in ("gpuModuleID", "partition1", "partition2", "partition4", "partition8")} \
        == {"gpuModuleID": 1, "partition1": 7, "partition2": 3, "partition4": 1, "partition8": 0}
    assert value(got["GPU1"], "partition2") == value(got["GPU0"], "partition2")  # one 2-GPU partition
    assert value(got["GPU1"], "partition1") != value(got["GPU0"], "partition1")
    assert not {"gpuModuleID", "partition1"} & set(got["GPU2"]["attributes"])  # stated nothing: none published


def test_a_partition_size_that_is_no_fabric_manager_size_is_refused_with_the_field():
    from plugin.sources import TopologyError

    bad = PARTITIONED.replace("partition8: 0}", "partition3: 0}", 1)
    with pytest.raises(TopologyError, match="partition"):
        load_node_yaml(bad, "hgx.yaml")


def test_nvml_module_ids_become_gpu_module_id(tmp_path):
    t = load_node_yaml(PARTITIONED, "hgx.yaml")
    fake = FakeNvml(t)
    found, _ = discover_gpus(fake, fake.write_sysfs(str(tmp_path / "sys")))
    by_name = {d.name: d for d in found if d.kind == DeviceKind.GPU}
    assert by_name["GPU0"].attributes["module_id"] == "1" and by_name["GPU1"].attributes["module_id"] == "2"
    assert "module_id" not in by_name["GPU2"].attributes  # NOT_SUPPORTED
    assert fake.calls["nvmlDeviceGetModuleId"] == 3


def test_a_driver_without_the_module_id_call_publishes_none_and_says_so_once(tmp_path, caplog):
    from plugin.sources import nvml_gpus

    nvml_gpus._MODULE_ID_LOGGED.clear()
    fake = FakeNvml(load_node_yaml(PARTITIONED, "hgx.yaml"), missing_functions={"nvmlDeviceGetModuleId"})
    with caplog.at_level(logging.INFO, logger="plugin.sources.nvml_gpus"):
        found, _ = discover_gpus(fake, fake.write_sysfs(str(tmp_path / "sys")))
    assert found and all("module_id" not in d.attributes for d in found)
    said = [r for r in caplog.records if "module IDs" in r.getMessage()]
    assert len(said) == 1 and "FUNCTION_NOT_FOUND" in str(said[0].__dict__.get("reason", "")).upper().replace(" ", "_")


# ---- IMEX channels -----------------------------------------------------------------------------

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia
234 nvidia-caps-imex-channels
235 nvidia-caps

Block devices:
  8 sd
"""


def test_the_channel_major_comes_from_the_character_devices_of_proc(tmp_path):
    (tmp_path / "devices").write_text(PROC_DEVICES)
    assert read_major(str(tmp_path)) == 234
    (tmp_path / "devices").write_text(PROC_DEVICES.replace("234 nvidia-caps-imex-channels\n", "")
                                      + "240 nvidia-caps-imex-channels\n")
    assert read_major(str(tmp_path)) is None  # a block device of that name is no channel device


def test_a_driver_without_channels_is_refused_naming_proc_devices(tmp_path):
    (tmp_path / "devices").write_text("Character devices:\n195 nvidia\n")
    with pytest.raises(ImexChannelsError, match=r"devices has no nvidia-caps-imex-channels"):
        channels_of(str(tmp_path), 1)
    assert channels_of(str(tmp_path), 0) is None


def tray(clique_ids: list[int]) -> NodeTopology:
    t = load_simulated("dgx-h100")
    gpus = iter(clique_ids)
    devs = [replace(d, fabric=FabricInfo(CLUSTER, next(gpus, clique_ids[-1]))) if d.kind == DeviceKind.GPU else d
            for d in t.devices]
    return NodeTopology.build(devs, t.links, source=t.source)


def test_channels_carry_the_clique_their_gpus_publish():
    t = tray([7])
    chans = channel_devices(t, 2)
    assert [c["name"] for c in chans] == ["imex-channel-0", "imex-channel-1"]
    gpu_clique = value(devices(t, SliceOptions(node_name="node-a"))["GPU0"], "clique")
    assert all(value(c, "clique") == gpu_clique == f"{CLUSTER}.7" for c in chans)
    assert [value(c, "id") for c in chans] == [0, 1] and {value(c, "type") for c in chans} == {"imex-channel"}


def test_a_node_split_over_two_cliques_or_with_none_gives_channels_no_clique():
    assert all("clique" not in c["attributes"] for c in channel_devices(tray([7, 7, 7, 7, 8]), 1))
    assert all("clique" not in c["attributes"] for c in channel_devices(load_simulated("dgx-h100"), 1))


def test_the_injected_node_is_the_channel_with_the_drivers_major(tmp_path):
    (tmp_path / "devices").write_text(PROC_DEVICES)
    chans = channels_of(str(tmp_path), 4)
    assert chans is not None
    node = chans.device_node(3).to_dict()
    assert node["path"] == "/dev/nvidia-caps-imex-channels/channel3"
    assert (node["type"], node["major"], node["minor"]) == ("c", 234, 3)
    with pytest.raises(ImexChannelsError, match="channel 4 is not published"):
        chans.device_node(4)


def test_a_channel_node_made_with_mknod_has_the_numbers_we_inject(tmp_path):
    """As NVIDIA's CI makes them (hack/ci/mock-nvml); where mknod is not permitted the test says so."""
    (tmp_path / "devices").write_text(PROC_DEVICES)
    chans = channels_of(str(tmp_path), 1)
    assert chans is not None
    want = chans.device_node(0)
    path = tmp_path / "channel0"
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(want.major or 0, want.minor or 0))
    except PermissionError:
        pytest.skip("mknod is not permitted here (no CAP_MKNOD)")
    st = os.stat(path)
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (234, 0)


def test_more_channels_than_the_driver_has_are_refused():
    with pytest.raises(ImexChannelsError, match="2048"):
        channel_devices(load_simulated("dgx-h100"), imex_channels.MAX_CHANNELS + 1)


# ---- IMEX channels through the driver: published, prepared over real gRPC ------------------------


async def _start_imex_driver(short_tmp, kube_api, **extra):
    """A driver serving a tray whose GPUs are in clique 7, with 4 channels (major 234), registered with the
    kubelet stand-in over real unix sockets: (driver, plugin client, CDI root). `extra`: more DraOptions."""
    from kubelet_standin import register, registration_sockets
    from plugin.dra import DraOptions
    from plugin.dra.slices.imex_channels import ImexChannels
    from plugin.runtime.compose.dra import dra_driver

    roots = os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi")
    opts = DraOptions(slices=SliceOptions(node_name="node-a", driver_name="topo.dev", imex=ImexChannels(234, 4)),
                      kubelet_root=roots[0], cdi_root=roots[1], resync_s=3600, instance_id="pod-0", **extra)
    drv = dra_driver(opts, kube_api)
    await drv.start(tray([7]))
    try:
        return drv, await register(registration_sockets(roots[0])[-1]), roots[1]
    except BaseException:
        await drv.stop()
        raise


@pytest.fixture
async def imex_driver(short_tmp, kube_api, apiserver):
    """`_start_imex_driver` without a readiness check; yields (plugin client, CDI root)."""
    drv, plugin, cdi_root = await _start_imex_driver(short_tmp, kube_api)
    try:
        yield plugin, cdi_root
    finally:
        await drv.stop()


async def test_published_channels_carry_the_clique_and_prepare_injects_the_channel_node(imex_driver, apiserver):
    import json

    plugin, cdi_root = imex_driver
    published = [d for s in apiserver.slices.values() for d in s["spec"].get("devices", [])]
    chans = [d for d in published if d["name"].startswith("imex-channel-")]
    assert [d["name"] for d in chans] == [f"imex-channel-{n}" for n in range(4)]
    assert {value(d, "clique") for d in chans} == {value(next(d for d in published if d["name"] == "gpu-0"), "clique")}

    results = [{"request": "gpu", "driver": "topo.dev", "pool": "node-a", "device": "gpu-0"},
               {"request": "channel", "driver": "topo.dev", "pool": "node-a", "device": "imex-channel-2"}]
    uid = apiserver.add_claim("team", "job-0", results)
    resp = await plugin.prepare(("team", uid, "job-0"))
    assert resp.claims[uid].error == ""
    got = {d.device_name: list(d.cdi_device_ids) for d in resp.claims[uid].devices}
    assert got["imex-channel-2"] == [f"topo.dev/claim={uid}-imex-channel-2"]
    with open(os.path.join(cdi_root, f"topo.dev-claim_{uid}.json"), encoding="utf-8") as f:
        spec = {d["name"]: d["containerEdits"] for d in json.load(f)["devices"]}
    [node] = spec[f"{uid}-imex-channel-2"]["deviceNodes"]
    assert (node["path"], node["type"], node["major"], node["minor"]) == (
        "/dev/nvidia-caps-imex-channels/channel2", "c", 234, 2)
    assert f"{uid}-gpu-0" in spec  # the GPU as before


async def test_a_claim_of_channels_alone_is_prepared_and_an_unpublished_channel_is_refused(imex_driver, apiserver):
    plugin, _ = imex_driver
    only = apiserver.add_claim("team", "chan", [{"request": "c", "driver": "topo.dev", "pool": "node-a",
                                                 "device": "imex-channel-0"}])
    beyond = apiserver.add_claim("team", "far", [{"request": "c", "driver": "topo.dev", "pool": "node-a",
                                                  "device": "imex-channel-4"}])
    resp = await plugin.prepare(("team", only, "chan"), ("team", beyond, "far"))
    assert resp.claims[only].error == ""
    assert "device imex-channel-4 is not on this node" in resp.claims[beyond].error
    done = await plugin.unprepare(("team", only, "chan"))
    assert done.claims[only].error == ""


def test_serve_refuses_channels_where_the_driver_has_none_naming_the_option_and_file(tmp_path):
    from plugin.cli.typed import imex_channels as serve_channels
    from plugin.errors import InputError

    (tmp_path / "devices").write_text("Character devices:\n195 nvidia\n")

    class _Settings:
        values = {"dra_imex_channels": 1.0, "proc_root": str(tmp_path)}
        sources: dict = {}
        config = type("C", (), {"flags": {"draImexChannels": 1}, "path": "config.yaml"})()

    with pytest.raises(InputError, match=r"config.yaml: field flags.draImexChannels: .*devices has no "
                                         r"nvidia-caps-imex-channels"):
        serve_channels(_Settings())  # type: ignore[arg-type]  # a stand-in with the fields it reads
    (tmp_path / "devices").write_text(PROC_DEVICES)
    got = serve_channels(_Settings())  # type: ignore[arg-type]  # as above
    assert got is not None and (got.major, got.count) == (234, 1)


def test_a_simulated_node_states_the_channels_major_and_serve_takes_it(tmp_path):
    from plugin.cli.typed import imex_channels as serve_channels
    from plugin.errors import InputError
    from plugin.sources.simulated import stated_imex_major

    node = tmp_path / "node.yaml"
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\nimexChannelsMajor: 234\n"
                    "gpus:\n  - {numa: 0}\n")
    assert stated_imex_major(str(node)) == 234 and stated_imex_major("dgx-h100") is None
    assert len(load_node_yaml(node.read_text(), str(node)).gpus) == 1  # the schema accepts the field

    class _Settings:
        values = {"dra_imex_channels": 2.0, "simulate": str(node), "proc_root": "/proc"}
        sources: dict = {}
        config = type("C", (), {"flags": {"draImexChannels": 2}, "path": "config.yaml"})()

    got = serve_channels(_Settings())  # type: ignore[arg-type]  # a stand-in with the fields it reads
    assert got is not None and (got.major, got.count) == (234, 2)
    _Settings.values = {**_Settings.values, "simulate": "dgx-h100"}
    with pytest.raises(InputError, match="simulated node dgx-h100 states no imexChannelsMajor"):
        serve_channels(_Settings())  # type: ignore[arg-type]  # as above


# ---- the host IMEX daemon's readiness, asked before a channel is handed out (host-managed IMEX) -------

IMEX_CTL = str(pathlib.Path(__file__).resolve().parents[1] / "support" / "imex_standin" / "nvidia-imex-ctl")


class HostImexDaemon:
    """The host's IMEX daemon as the stand-in `nvidia-imex-ctl` meets it: a real unix socket answering `state`."""

    def __init__(self, path: str):
        self.path = path
        self.state = "READY"
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(f"{self.state}\n".encode())
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_unix_server(answer, path=self.path)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def calls(self) -> list[list[str]]:
        try:
            with open(self.path + ".calls", encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []


@pytest.fixture
async def host_imex(short_tmp):
    daemon = HostImexDaemon(os.path.join(short_tmp, "imex.sock"))
    await daemon.start()
    yield daemon
    await daemon.stop()


@pytest.fixture
async def checked_driver(short_tmp, kube_api, apiserver, host_imex):
    """A driver that asks the stand-in `nvidia-imex-ctl` (over `host_imex`'s socket) before handing channels out."""
    drv, plugin, _ = await _start_imex_driver(short_tmp, kube_api, imex_control_binary=IMEX_CTL,
                                              imex_control_socket=host_imex.path)
    try:
        yield plugin
    finally:
        await drv.stop()


def channel_claim(apiserver, name: str, *devices: str) -> str:
    return apiserver.add_claim("team", name, [{"request": f"r{i}", "driver": "topo.dev", "pool": "node-a",
                                               "device": d} for i, d in enumerate(devices)])


async def test_a_channel_is_handed_out_once_the_host_imex_daemon_answers_ready(checked_driver, apiserver, host_imex):
    uid = channel_claim(apiserver, "job", "gpu-0", "imex-channel-0")
    resp = await checked_driver.prepare(("team", uid, "job"))
    assert resp.claims[uid].error == ""
    assert {d.device_name for d in resp.claims[uid].devices} == {"gpu-0", "imex-channel-0"}
    assert host_imex.calls() == [["-q", f"--u={host_imex.path}"]]  # NVIDIA's query, on the configured socket


async def test_a_daemon_not_ready_fails_the_prepare_with_its_state_and_the_retry_succeeds_once_ready(
        checked_driver, apiserver, host_imex):
    host_imex.state = "NOT READY"  # contains READY: only the whole answer counts
    uid = channel_claim(apiserver, "job", "imex-channel-1")
    resp = await checked_driver.prepare(("team", uid, "job"))
    error = resp.claims[uid].error
    assert "ResourceClaim team/job: IMEX channel imex-channel-1 not handed out: the host's IMEX daemon is not " \
           "ready" in error, error
    assert "answered 'NOT READY', not READY" in error and "systemctl status nvidia-imex" in error
    assert "IMEX_CMD_UNIX_DOMAIN_PATH=" + host_imex.path in error and "kubelet retries" in error
    host_imex.state = "READY"  # the kubelet's retry of the same claim, nothing recorded by the failure
    again = await checked_driver.prepare(("team", uid, "job"))
    assert again.claims[uid].error == "" and [d.device_name for d in again.claims[uid].devices] == ["imex-channel-1"]


async def test_a_daemon_not_listening_and_a_missing_program_each_say_what_to_fix(
        short_tmp, kube_api, apiserver, host_imex, checked_driver):
    await host_imex.stop()  # the host's nvidia-imex is down: nothing on its socket
    uid = channel_claim(apiserver, "down", "imex-channel-0")
    error = (await checked_driver.prepare(("team", uid, "down"))).claims[uid].error
    assert "is not ready" in error and "exited with status 1" in error and "Failed to connect" in error, error

    missing = os.path.join(short_tmp, "no-imex-ctl")
    drv, plugin, _ = await _start_imex_driver(os.path.join(short_tmp, "b"), kube_api, imex_control_binary=missing)
    try:
        uid = channel_claim(apiserver, "nobin", "imex-channel-0")
        error = (await plugin.prepare(("team", uid, "nobin"))).claims[uid].error
    finally:
        await drv.stop()
    assert f"cannot be asked: {missing} was not found" in error and "--imex-control-binary" in error, error


async def test_claims_without_a_channel_never_ask_the_imex_daemon(checked_driver, apiserver, host_imex):
    host_imex.state = "NOT READY"
    uid = channel_claim(apiserver, "gpus", "gpu-0", "gpu-1")
    resp = await checked_driver.prepare(("team", uid, "gpus"))
    assert resp.claims[uid].error == "" and host_imex.calls() == []


def test_the_readiness_check_is_on_by_default_and_on_a_simulated_node_only_when_named():
    from click.core import ParameterSource

    from plugin.cli.options import Settings
    from plugin.cli.typed import imex_control_binary
    from plugin.config import Config

    def settings(values: dict, given: bool, flags: dict | None = None) -> Settings:
        source = ParameterSource.COMMANDLINE if given else ParameterSource.DEFAULT
        return Settings(values={"imex_control_binary": "nvidia-imex-ctl", **values},
                        config=Config(path="config.yaml", flags=flags or {}), command="serve",
                        sources={"imex_control_binary": source})

    assert imex_control_binary(settings({}, given=False)) == "nvidia-imex-ctl"  # real nodes: asked by default
    assert imex_control_binary(settings({"simulate": "dgx-h100"}, given=False)) == ""  # no host daemon to ask
    named = {"simulate": "dgx-h100", "imex_control_binary": IMEX_CTL}
    assert imex_control_binary(settings(named, given=True)) == IMEX_CTL
    assert imex_control_binary(settings(named, given=False, flags={"imexControlBinary": IMEX_CTL})) == IMEX_CTL


async def test_a_daemon_that_never_answers_is_cut_off_at_the_bound_with_the_fix(short_tmp):
    """A hung host daemon must not hang prepare: the program is stopped at the bound and the claim told why."""
    from plugin.dra.kubelet.imex_ready import ImexReadiness

    path = os.path.join(short_tmp, "hung.sock")

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # says nothing; returns once the stopped program's end of the socket is gone
        writer.close()

    server = await asyncio.start_unix_server(never_answer, path=path)
    try:
        problem = await ImexReadiness(IMEX_CTL, path, timeout_s=0.5).problem()
    finally:
        server.close()
        await server.wait_closed()
    assert problem is not None and "did not answer" in problem and "within 0.5 s" in problem, problem
    assert "systemctl status nvidia-imex" in problem
