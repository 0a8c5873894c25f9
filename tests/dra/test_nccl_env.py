"""NCCL hints in DRA mode (`--nccl-env`): the claim's CDI spec tells NCCL which NICs are the claim's.

The driver prepares claims over real gRPC on real unix sockets (the kubelet
stand-in) from ResourceClaims the stand-in API server serves, on generated
nodes (`topo_testkit.nccl_nodes`: the only nodes whose NICs carry RDMA devices
and netdevs). The claim holds its GPUs and NICs together, so the NICs are
ordered by their GPU partners: the NIC with the GPU's `pcieSwitch` (or its
complex) first. Expected values come from the node's layout, never from the
code under test.
"""

from __future__ import annotations

import json
import os

import pytest

from kubelet_standin import register, registration_sockets
from plugin.dra import DraDriver, DraOptions, SliceOptions
from plugin.dra.slices.build import build_devices, device_table
from plugin.runtime.compose.dra import dra_driver
from topo_testkit.nccl_nodes import dgx_h100_ethernet_node, dgx_h100_node, expected_hint, gb300_cx8_dd_node
from topo_testkit.sysfs_fixture import GeneratedNode, write_node

NODE = "node-a"
DRIVER = "topo.dev"
SLICES = SliceOptions(node_name=NODE, driver_name=DRIVER)
NODES = {"dgx-h100": dgx_h100_node, "dgx-h100-ethernet": dgx_h100_ethernet_node, "gb300-cx8-dd": gb300_cx8_dd_node}


@pytest.fixture
def roots(short_tmp):
    # unix socket paths must stay short (tests/conftest.py)
    return os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi")


@pytest.fixture
async def prepare(roots, kube_api, apiserver):
    """prepare(node, nccl_env, results) -> (the claim's CDI spec, slice device name -> Device)."""
    drivers: list[DraDriver] = []

    async def run(node: GeneratedNode, nccl_env: bool, names: list[tuple[str, str]]) -> dict:
        opts = DraOptions(slices=SLICES, kubelet_root=roots[0], cdi_root=roots[1], resync_s=3600,
                          instance_id=f"pod-{len(drivers)}", nccl_env=nccl_env)
        drv = dra_driver(opts, kube_api)
        await drv.start(node.topology)
        drivers.append(drv)
        plugin = await register(registration_sockets(roots[0])[-1])
        results = [{"request": req, "driver": DRIVER, "pool": NODE, "device": d} for d, req in names]
        uid = apiserver.add_claim("team", f"claim-{len(drivers)}", results)
        resp = await plugin.prepare(("team", uid, f"claim-{len(drivers)}"))
        assert resp.claims[uid].error == ""
        with open(os.path.join(roots[1], f"{DRIVER}-claim_{uid}.json"), encoding="utf-8") as f:
            return json.load(f)

    yield run
    for d in drivers:
        await d.stop()


def nccl(spec: dict) -> dict[str, str]:
    """The NCCL variables the spec gives every container of the claim (and none per device)."""
    for d in spec["devices"]:
        assert not [e for e in d["containerEdits"].get("env", []) if e.startswith("NCCL_")]
    env = (spec.get("containerEdits") or {}).get("env", [])
    return dict(e.split("=", 1) for e in env if e.startswith("NCCL_"))


def slice_name(node: GeneratedNode, key: str) -> str:
    """The slice device name of a GPU (`GPU3`) or NIC (by netdev) of the node."""
    bdf = node.function(key).bdf
    return next(n for n, d in device_table(node.topology, SLICES).items() if (d.pci_bus_id or d.name) == bdf)


def claim_of(node: GeneratedNode, gpus: list[int], nics: list[str]) -> list[tuple[str, str]]:
    """(slice device name, request) of GPUs (by index) and NICs (by netdev)."""
    return [(slice_name(node, f"GPU{i}"), "gpus") for i in gpus] + [(slice_name(node, n), "nics") for n in nics]


#: node -> (GPU indices, NIC netdevs) of the claim: each GPU with its own NIC, listed out of GPU order.
CLAIMS = {
    "dgx-h100": ([2, 3], ["ibp3s0", "ibp2s0"]),
    "dgx-h100-ethernet": ([5, 4], ["ens4np0", "ens5np0"]),
    "gb300-cx8-dd": ([0, 1], ["ibp2s0", "ibp3s0"]),  # GPU0's NIC is ibp3s0, the second in PCI order
}


@pytest.mark.parametrize("name", list(CLAIMS))
async def test_the_claims_spec_names_its_nics_each_gpus_own_first(name, prepare, tmp_path):
    node = write_node(NODES[name](), str(tmp_path / "node"))
    gpus, nics = CLAIMS[name]
    spec = await prepare(node, True, claim_of(node, gpus, nics))
    want = expected_hint(node, [node.function(f"GPU{i}").bdf for i in gpus], [node.function(n).bdf for n in nics])
    assert want and nccl(spec) == want
    # The pairs are the published `pcieSwitch` (or complex) groups: what a claim's matchAttribute selects on.
    published = {d["name"]: d["attributes"] for d in build_devices(node.topology, SLICES)}
    in_gpu_order = sorted(gpus, key=lambda i: node.function(f"GPU{i}").bdf)
    for gpu, nic in zip(in_gpu_order, hint_order(node, want)):
        g, n = published[slice_name(node, f"GPU{gpu}")], published[slice_name(node, nic)]
        key = "complex" if "complex" in g else "pcieSwitch"
        assert g[key] == n[key], f"GPU{gpu} and {nic} do not share a {key}"
    if name == "gb300-cx8-dd":  # the order is the GPUs', not the NICs' own
        assert hint_order(node, want) == ["ibp3s0", "ibp2s0"]


def hint_order(node: GeneratedNode, env: dict[str, str]) -> list[str]:
    """The netdevs of the NICs the hint names, in its order."""
    by_rdma = {f.rdma_dev: f.netdev for f in node.functions if f.rdma_dev}
    if "NCCL_IB_HCA" in env:
        return [by_rdma[e.split(":")[0]] for e in env["NCCL_IB_HCA"].removeprefix("=").split(",")]
    return env["NCCL_SOCKET_IFNAME"].removeprefix("=").split(",")


async def test_off_by_default(prepare, tmp_path):
    node = write_node(dgx_h100_node(), str(tmp_path / "node"))
    assert DraOptions(slices=SLICES).nccl_env is False
    spec = await prepare(node, DraOptions(slices=SLICES).nccl_env, claim_of(node, [0, 1], ["ibp0s0", "ibp1s0"]))
    assert nccl(spec) == {}


@pytest.mark.parametrize("what", ["gpus-only", "nics-only"])
async def test_a_claim_without_gpus_or_without_nics_gets_no_hint(what, prepare, tmp_path):
    node = write_node(dgx_h100_node(), str(tmp_path / "node"))
    devices = claim_of(node, [0, 1], []) if what == "gpus-only" else claim_of(node, [], ["ibp0s0", "ibp1s0"])
    assert nccl(await prepare(node, True, devices)) == {}
