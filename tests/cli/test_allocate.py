"""`topo-device-plugin allocate`: the preferred allocation for a simulated node, with its numbers."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from plugin.cli.allocate import allocate

BASE = ["--simulate", "dgx-a100", "--device-id-strategy", "index"]


def run(*args: str, base=BASE):
    return CliRunner().invoke(allocate, [*base, *args], catch_exceptions=False)


def run_json(*args: str, base=BASE) -> dict:
    res = run(*args, "--format", "json", base=base)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_default_request_takes_one_numa_node():
    data = run_json("--size", "4")
    assert data["resource"] == "nvidia.com/gpu" and data["policy"] == "numa-first"
    assert data["span"] == 1 and len(data["numaNodes"]) == 1
    assert len(data["ids"]) == 4 and data["optimal"] is True
    assert data["request"]["available"] == [str(i) for i in range(8)]


def test_must_include_is_honoured_and_span_minimised():
    data = run_json("--size", "3", "--available", "2,3,4,5,6", "--must-include", "4")
    assert "4" in data["ids"] and data["numaNodes"] == [1] and data["span"] == 1
    assert data["runnerUp"]["reason"].startswith("NUMA span 1 vs 2")


def test_text_output_shows_span_scores_and_why():
    res = run("--size", "2", "--available", "0,4,5")
    assert res.exit_code == 0, res.output
    assert "Preferred allocation: 4, 5" in res.output
    assert "NUMA span: 1 (node 1)" in res.output
    assert "W(S)" in res.output and "W(A\\S)" in res.output
    assert "Why: beats the next best set" in res.output


def test_tie_is_explained():
    res = run("--size", "2")
    assert "fixed tie rule" in res.output


def test_nic_resource_uses_its_pool_policy():
    data = run_json("--size", "2", "--resource", "topo.dev/nic")
    assert data["policy"] == "spread" and data["span"] == 1


def test_allocation_policy_flag_changes_the_gpu_policy():
    data = run_json("--size", "2", "--allocation-policy", "link-first")
    assert data["policy"] == "link-first"


def test_pcie_node_prefers_the_pix_pair():
    data = run_json("--size", "2", base=["--simulate", "pcie-2socket-4gpu-2nic", "--device-id-strategy", "index"])
    assert sorted(data["ids"]) in (["0", "1"], ["2", "3"])
    assert data["score"] == 50


@pytest.mark.parametrize(
    "args, message",
    [
        (["--size", "9"], "--size 9 is more than the node's 8 healthy devices: ask for at most 8"),
        (["--size", "3", "--available", "0,1"], "--size 3 is more than the 2 devices in --available: ask for at most 2, "
                                                 "or list more devices in --available"),
        (["--size", "2", "--available", "0,1", "--must-include", "2"], "--must-include 2 not among --available"),
        (["--size", "0"], "--size"),
        (["--size", "2", "--must-include", "42"], "unknown device IDs for nvidia.com/gpu: 42"),
        (["--size", "1", "--available", "0,1", "--must-include", "0,1"],
         "--must-include lists 2 devices but --size is 1: raise --size to at least 2"),
        (["--size", "1", "--available", "0,0"], "--available repeats 0: list each device once"),
        (["--size", "1", "--resource", "example.com/x"], "unknown resource 'example.com/x'"),
        ([], "--size"),
    ],
)
def test_bad_requests_exit_2(args, message):
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    # The command speaks its own flags, never the kubelet API's field names.
    assert not any(f in res.output for f in ("allocation_size", "available_deviceIDs", "must_include_deviceIDs"))


def test_unknown_source_exits_2():
    res = CliRunner().invoke(allocate, ["--simulate", "/no/such/node.yaml", "--size", "1"])
    assert res.exit_code == 2
    assert "/no/such/node.yaml" in res.output


# -- partners (--with): the answer pairs with the container's other devices ---------------------

H100 = ["--simulate", "dgx-h100", "--device-id-strategy", "index"]


def test_with_partners_the_nics_are_the_gpus_pix_nics_and_the_pairs_are_shown():
    res = run("--resource", "topo.dev/nic", "--size", "2", "--with", "nvidia.com/gpu=2,6", base=H100)
    assert res.exit_code == 0, res.output
    assert "Preferred allocation: mlx5_2, mlx5_6" in res.output
    assert "Partners (the container's other devices): nvidia.com/gpu=2,6" in res.output
    assert "mlx5_2 ~ nvidia.com/gpu=2 PIX (50), mlx5_6 ~ nvidia.com/gpu=6 PIX (50)" in res.output
    assert "pairing X(S,P): 100" in res.output


def test_partners_change_the_answer_and_the_why_names_the_pairing():
    """Without partners the NIC pool prefers one NUMA node; the GPUs' PIX NICs win with them."""
    blind = run_json("--resource", "topo.dev/nic", "--size", "2", base=H100)
    assert blind["ids"] == ["mlx5_0", "mlx5_1"] and blind["pairing"] == 0 and blind["pairs"] == []
    data = run_json("--resource", "topo.dev/nic", "--size", "2", "--available", "mlx5_0,mlx5_1,mlx5_2,mlx5_6",
                    "--with", "nvidia.com/gpu=2", "--with", "nvidia.com/gpu=6", base=H100)
    assert data["partners"] == {"nvidia.com/gpu": ["2", "6"]}
    assert data["ids"] == ["mlx5_2", "mlx5_6"] and data["pairing"] == 100
    assert [(p["device"], p["partner"], p["link"]) for p in data["pairs"]] == [
        ("mlx5_2", "nvidia.com/gpu=2", "PIX"), ("mlx5_6", "nvidia.com/gpu=6", "PIX")]
    assert data["runnerUp"]["reason"].startswith("pairing X(S,P) 100 vs")


def test_gpus_with_nic_partners():
    data = run_json("--size", "1", "--with", "topo.dev/nic=mlx5_5", base=H100)
    assert data["ids"] == ["5"] and data["pairs"][0]["link"] == "PIX"


@pytest.mark.parametrize("value,message", [
    ("nvidia.com/gpu", "expected RESOURCE=IDS"),
    ("example.com/x=1", "serves no resource 'example.com/x'"),
    ("nvidia.com/gpu=9", "unknown device IDs for nvidia.com/gpu: 9"),
    ("topo.dev/nic=mlx5_0", "partners are devices of another resource"),
])
def test_bad_partners_are_usage_errors(value, message):
    res = run("--resource", "topo.dev/nic", "--size", "1", "--with", value, base=H100)
    assert res.exit_code == 2 and message in res.output, res.output
