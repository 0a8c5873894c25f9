"""The real-hardware path end to end: `serve --config` on a generated sysfs node with NVML answered
from the same node description (`topo_testkit.with_fake_nvml`), registered with the kubelet stand-in."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from plugin.cli import cli
from topo_testkit.sysfs_fixture import write_demo
from topo_testkit.with_fake_nvml import fake_for, installed

GPU = "nvidia.com/gpu"


@pytest.fixture
def node(tmp_path):
    return write_demo(str(tmp_path / "node"))


async def test_serve_config_registers_gpus_and_nic_pools(kubelet, start_daemon, plugin_dir, node):
    start_daemon("--config", f"{node.root}/config.yaml", "--device-plugin-path", plugin_dir, raw=True,
                 fake_nvml=f"{node.root}/node.yaml")
    expected = {GPU, "topo.dev/sriov_vfio", "topo.dev/rdma_ib", "topo.dev/sriov_a", "topo.dev/sriov_b",
                "topo.dev/pf_mlx", "example.com/pf_other"}
    await kubelet.wait_for(lambda: expected <= {r for r, c in kubelet.clients.items() if c.devices}, timeout=20)
    topo = node.topology
    gpus = kubelet.devices(GPU)
    assert {g.uuid: (g.numa,) for g in topo.gpus} == {i: d.numa for i, d in gpus.items()}
    # the vfio VF: its IOMMU group's device node and the vfio container, under the node's dev root
    (vf,) = kubelet.devices("topo.dev/sriov_vfio")
    resp = await kubelet.allocate("topo.dev/sriov_vfio", [vf])
    group = topo.device(vf).attributes["iommu_group"]
    assert sorted(d.container_path for d in resp.devices) == sorted([f"/dev/vfio/{group}", "/dev/vfio/vfio"])
    assert resp.envs["PCIDEVICE_TOPO_DEV_SRIOV_VFIO"] == vf
    info = json.loads(resp.envs["PCIDEVICE_TOPO_DEV_SRIOV_VFIO_INFO"])
    assert info[vf]["vfio"]["dev-mount"] == f"/dev/vfio/{group}"
    # the RDMA port: its uverbs/umad char devices
    (ib,) = kubelet.devices("topo.dev/rdma_ib")
    resp = await kubelet.allocate("topo.dev/rdma_ib", [ib])
    assert any(d.container_path.startswith("/dev/infiniband/uverbs") for d in resp.devices)
    # GPUs: NVIDIA_VISIBLE_DEVICES with the UUIDs, and their /dev/nvidia<minor> where the dev root has them
    pick = await kubelet.preferred(GPU, sorted(gpus), [], 2)
    resp = await kubelet.allocate(GPU, pick)
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(pick)
    # the host uplink carrying the default route is never offered
    offered = {i for r in kubelet.clients for i in kubelet.devices(r)}
    uplink = node.function("eno1").bdf
    assert uplink.startswith("0000:") and uplink not in offered
    assert "0000:43:00.1" in offered  # its sibling port without the route is offered


def test_discover_config_prints_gpus_nics_pools_and_links(node):
    with installed(fake_for(f"{node.root}/node.yaml")):
        r = CliRunner().invoke(cli, ["discover", "--config", f"{node.root}/config.yaml"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = r.output
    assert "8 GPUs" in out and "Resource nvidia.com/gpu" in out
    for pool in ("topo.dev/sriov_vfio", "topo.dev/rdma_ib", "topo.dev/sriov_a", "example.com/pf_other"):
        assert f"Resource {pool}" in out
    row = next(line for line in out.splitlines() if line.startswith("GPU0 "))
    header = next(line for line in out.splitlines() if line.split()[:2] == ["GPU0", "GPU1"])
    cols = header.split()
    # the GPU<->NIC part of the matrix: GPU0 sits on the same PCIe switch as the first ConnectX card
    nic_col = cols.index("0000:1c:00.2")
    assert row.split()[1 + nic_col] == "PIX"


def nics_only_config(node, path, pools=None) -> str:
    """The generated node's roots, no GPU driver needed (zero GPUs), and optionally NIC pools."""
    doc = {"version": "v1", "flags": {"sysfsRoot": node.sysfs_root, "devRoot": node.dev_root,
                                      "procRoot": node.proc_root, "failOnInitError": False}}
    if pools is not None:
        doc["nics"] = {"resourceList": pools}
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def allocation(resp) -> tuple[list[tuple[str, str]], dict]:
    devices = sorted((d.container_path, d.host_path) for d in resp.devices)
    infos = [json.loads(v) for k, v in resp.envs.items() if k.endswith("_INFO")]
    assert len(infos) == 1, f"want one PCIDEVICE_..._INFO, got envs {dict(resp.envs)}"
    return devices, infos[0]


async def test_rdma_nic_gets_the_same_allocate_in_the_default_pool_as_in_an_rdma_pool(
        kubelet, start_daemon, plugin_dir, node, tmp_path):
    (rdma,) = [f for f in node.functions if f.rdma_dev]
    answers = {}
    for name, pools, resource in (("default", None, "topo.dev/nic"),
                                  ("rdma pool", [{"resourceName": "rdma", "selectors": {"isRdma": True}}],
                                   "topo.dev/rdma")):
        config = nics_only_config(node, tmp_path / f"{resource.replace('/', '_')}.yaml", pools)
        daemon = start_daemon("--config", config, "--device-plugin-path", plugin_dir, raw=True)
        await kubelet.wait_for(lambda: rdma.bdf in kubelet.devices(resource), timeout=20)
        resp = await kubelet.allocate(resource, [rdma.bdf])
        answers[name] = allocation(resp)
        assert resp.envs[f"PCIDEVICE_TOPO_DEV_{resource.split('/')[1].upper()}"] == rdma.bdf
        assert await daemon.terminate() == 0
    devices, info = answers["default"]
    assert (devices, info) == answers["rdma pool"]
    paths = [c for c, _ in devices]
    assert "/dev/infiniband/rdma_cm" in paths
    for kind in ("uverbs", "umad", "issm"):
        assert any(p.startswith(f"/dev/infiniband/{kind}") for p in paths), (kind, paths)
    assert info[rdma.bdf]["rdma"]["rdma_dev"] == rdma.rdma_dev


def test_demo_hardware_shows_what_the_kubelet_would_get_from_this_node(node):
    """`demo --hardware` on a GPU node: the node's own devices (NVML + sysfs), not a simulated one."""
    with installed(fake_for(f"{node.root}/node.yaml")):
        r = CliRunner().invoke(cli, ["demo", "--hardware", "--config", f"{node.root}/config.yaml"],
                               catch_exceptions=False)
    assert r.exit_code == 0, r.output
    topo = node.topology
    for g in topo.gpus:  # every GPU of this node, with its NUMA node, as ListAndWatch gave it
        assert any(g.uuid in line and f"NUMA {g.numa}" in line for line in r.output.splitlines()), (g.uuid, r.output)
    assert "topo.dev/rdma_ib: 1 device from ListAndWatch" in r.output
    assert "dgx-a100" not in r.output and "daemon stopped (exit 0)" in r.output


def test_demo_hardware_and_simulate_exclude_each_other():
    r = CliRunner().invoke(cli, ["demo", "--hardware", "--simulate", "dgx-a100"])
    assert r.exit_code == 2 and "--hardware and --simulate exclude each other" in r.output
