"""`topo-device-plugin explain`: the kubelet Topology Manager's view of a pod on a simulated node."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from plugin.cli.explain import explain

BASE = ["--simulate", "dgx-a100", "--device-id-strategy", "index"]
REJECT_MESSAGE = "Resources cannot be allocated with Topology locality"


def run(*args: str):
    return CliRunner().invoke(explain, [*BASE, *args], catch_exceptions=False)


def run_json(*args: str) -> dict:
    res = run(*args, "--format", "json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


# -- the acceptance scenario: dgx-a100 (4 GPUs per NUMA node), 2 used on each, request 4 --

def test_restricted_rejects_with_topology_affinity_error():
    res = run("--policy", "restricted", "--request", "nvidia.com/gpu=4", "--allocated", "0,1,4,5")
    assert res.exit_code == 0, res.output  # a rejection is a report, not a failure
    assert "TopologyAffinityError" in res.output
    assert REJECT_MESSAGE in res.output
    assert "{0,1} not preferred" in res.output
    assert "REJECTED" in res.output

    data = run_json("--policy", "restricted", "--request", "nvidia.com/gpu=4", "--allocated", "0,1,4,5")
    assert data["admit"] is False
    assert data["reason"] == "TopologyAffinityError" and data["message"] == REJECT_MESSAGE
    (merge,) = data["merges"]
    assert merge["bestHint"] == {"affinity": [0, 1], "preferred": False}
    (gpu,) = merge["resources"]
    assert gpu["minAffinitySize"] == 1
    assert gpu["hints"] == [{"affinity": [0, 1], "preferred": False}]
    assert data["allocations"] == []


def test_best_effort_admits_across_both_nodes_and_shows_the_devices():
    res = run("--policy", "best-effort", "--request", "nvidia.com/gpu=4", "--allocated", "0,1,4,5")
    assert res.exit_code == 0, res.output
    assert "ADMITTED" in res.output
    assert "{0,1} not preferred" in res.output
    assert "devices 2, 3, 6, 7" in res.output

    data = run_json("--policy", "best-effort", "--request", "nvidia.com/gpu=4", "--allocated", "0,1,4,5")
    assert data["admit"] is True and data["reason"] == ""
    assert data["merges"][0]["bestHint"] == {"affinity": [0, 1], "preferred": False}
    (alloc,) = data["allocations"]
    assert sorted(alloc["devices"]) == ["2", "3", "6", "7"]
    assert alloc["numaSpan"] == [0, 1]
    assert alloc["case"] == "B" and alloc["preferredCall"] is None
    assert alloc["score"] > 0


def test_fail_on_reject_exits_1():
    res = run("--policy", "restricted", "--request", "nvidia.com/gpu=4", "--allocated", "0,1,4,5", "--fail-on-reject")
    assert res.exit_code == 1
    assert REJECT_MESSAGE in res.output
    ok = run("--policy", "best-effort", "--request", "nvidia.com/gpu=4", "--allocated", "0,1,4,5", "--fail-on-reject")
    assert ok.exit_code == 0


# -- single-numa-node versus restricted (cases in the spirit of the kubelet's tests) --

@pytest.mark.parametrize(
    "request_, allocated, restricted, single",
    [
        ("4", [], True, True),  # fits on one node
        ("5", [], True, False),  # needs both nodes; that is the narrowest possible, so preferred
        ("8", [], True, False),
        ("4", ["--allocated", "0,1,4,5"], False, False),
        ("2", ["--allocated", "0,1,4,5"], True, True),
        ("3", ["--allocated", "0,1"], True, True),
    ],
)
def test_single_numa_node_versus_restricted(request_, allocated, restricted, single):
    r = run_json("--policy", "restricted", "--request", f"nvidia.com/gpu={request_}", *allocated)
    s = run_json("--policy", "single-numa-node", "--request", f"nvidia.com/gpu={request_}", *allocated)
    assert r["admit"] is restricted
    assert s["admit"] is single
    if single:
        assert len(s["allocations"][0]["numaSpan"]) == 1


def test_single_numa_node_picks_the_node_the_plugin_answer_is_kept_on():
    data = run_json("--policy", "single-numa-node", "--request", "nvidia.com/gpu=2", "--allocated", "0,1,2")
    assert data["merges"][0]["bestHint"] == {"affinity": [1], "preferred": True}
    (alloc,) = data["allocations"]
    # Case A: 4 aligned for 2 needed, the plugin is asked among node 1 only.
    assert alloc["case"] == "A"
    assert alloc["preferredCall"]["available"] == ["4", "5", "6", "7"]
    assert alloc["preferredCall"]["size"] == 2
    assert alloc["numaSpan"] == [1]


def test_gpus_and_nics_must_share_a_node():
    data = run_json("--policy", "single-numa-node", "--request", "nvidia.com/gpu=2", "--request", "topo.dev/nic=1",
                    "--allocated", "topo.dev/nic=mlx5_4,mlx5_5,mlx5_6,mlx5_7")
    assert data["admit"] is True
    assert data["merges"][0]["bestHint"]["affinity"] == [0]
    assert {a["resource"]: a["numaSpan"] for a in data["allocations"]} == {
        "nvidia.com/gpu": [0], "topo.dev/nic": [0]
    }


def test_pod_scope_with_an_init_container_reuses_its_devices():
    data = run_json("--policy", "restricted", "--scope", "pod", "--request", "nvidia.com/gpu=2",
                    "--init-request", "nvidia.com/gpu=1")
    assert data["admit"] is True and data["scope"] == "pod"
    assert data["merges"][0]["containers"] == ["init", "main"]
    assert data["merges"][0]["resources"][0]["request"] == 2  # max(init 1, app 2)
    init, main = data["allocations"]
    assert init["container"] == "init" and main["container"] == "main"
    assert set(init["devices"]) <= set(main["devices"])
    assert main["reused"] == init["devices"]


def test_policy_none_admits_without_merging():
    data = run_json("--policy", "none", "--request", "nvidia.com/gpu=2")
    assert data["admit"] is True and data["merges"] == []
    (alloc,) = data["allocations"]
    assert alloc["preferredCall"]["available"] == [str(i) for i in range(8)]
    assert len(alloc["devices"]) == 2
    res = run("--policy", "none", "--request", "nvidia.com/gpu=2")
    assert "Policy none" in res.output and "ADMITTED" in res.output


def test_prefer_closest_numa_nodes_option_is_accepted_and_reported():
    data = run_json("--policy", "best-effort", "--request", "nvidia.com/gpu=2",
                    "--policy-option", "prefer-closest-numa-nodes=true")
    assert data["policyOptions"] == {"prefer-closest-numa-nodes": "true"}
    assert data["admit"] is True


def test_the_second_container_allocate_failure_is_unexpected_admission_error():
    # 3 free GPUs, 4 requested: best-effort admits the merge, Allocate then fails.
    data = run_json("--policy", "best-effort", "--request", "nvidia.com/gpu=4", "--allocated", "0,1,2,3,4")
    assert data["admit"] is False
    assert data["reason"] == "UnexpectedAdmissionError"
    assert data["message"].startswith("Allocate failed due to requested number of devices unavailable")


# -- bad usage: exit 2 with a clear message -------------------------------------

@pytest.mark.parametrize(
    "args, message",
    [
        (["--policy", "restricted"], "--request"),
        (["--policy", "restricted", "--request", "nvidia.com/gpu"], "expected RESOURCE=N"),
        (["--policy", "restricted", "--request", "nvidia.com/gpu=x"], "whole number"),
        (["--policy", "restricted", "--request", "example.com/foo=1"], "serves no resource 'example.com/foo'"),
        (["--policy", "restricted", "--request", "nvidia.com/gpu=1", "--allocated", "42"], "no device has ID '42'"),
        (["--policy", "restricted", "--request", "nvidia.com/gpu=1", "--allocated", "nvidia.com/gpu=mlx5_0"],
         "unknown device IDs for nvidia.com/gpu: mlx5_0"),
        (["--policy", "restricted", "--request", "nvidia.com/gpu=1", "--policy-option", "max-allowable-numa-nodes=7"],
         'the minimum value of "max-allowable-numa-nodes" should not be less than 8'),
        (["--policy", "restricted", "--request", "nvidia.com/gpu=1", "--policy-option", "fancy=true"],
         'unknown Topology Manager Policy option: "fancy"'),
        (["--policy", "restricted", "--request", "nvidia.com/gpu=1", "--policy-option", "novalue"], "KEY=VALUE"),
        (["--policy", "sometimes", "--request", "nvidia.com/gpu=1"], "sometimes"),
    ],
)
def test_bad_usage_exits_2(args, message):
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_bad_topology_file_exits_2_naming_the_file(tmp_path):
    bad = tmp_path / "node.yaml"
    bad.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus: [oops\n")
    res = CliRunner().invoke(explain, ["--simulate", str(bad), "--policy", "restricted",
                                       "--request", "nvidia.com/gpu=1"])
    assert res.exit_code == 2
    assert str(bad) in res.output


def _nine_numa_node_file(tmp_path):
    lines = [
        "apiVersion: topo-device-plugin/v1",
        "kind: SimulatedNode",
        "metadata: {name: nine-numa}",
        "numa:",
        f"  nodes: [{', '.join(str(i) for i in range(9))}]",
        "gpus:",
    ]
    lines += [f"  - {{name: GPU{i}, numa: {i}}}" for i in range(9)]
    path = tmp_path / "nine.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_more_than_max_allowable_numa_nodes_is_the_kubelet_start_error(tmp_path):
    path = _nine_numa_node_file(tmp_path)
    args = ["--simulate", str(path), "--device-id-strategy", "index", "--policy", "best-effort",
            "--request", "nvidia.com/gpu=1"]
    res = CliRunner().invoke(explain, args)
    assert res.exit_code == 2, res.output
    assert "unsupported on machines with more than 8 NUMA Nodes" in res.output
    ok = CliRunner().invoke(explain, [*args, "--policy-option", "max-allowable-numa-nodes=9", "--format", "json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["admit"] is True


# -- GPU-NIC pairing inside the model -----------------------------------------------------------

H100 = ["--simulate", "dgx-h100", "--device-id-strategy", "index"]


def test_a_container_asking_gpus_and_nics_gets_them_paired():
    """The NIC request comes after the container's GPU Allocate: its partners are those GPUs."""
    args = [*H100, "--policy", "single-numa-node", "--request", "nvidia.com/gpu=2", "--request", "topo.dev/nic=2",
            "--allocated", "nvidia.com/gpu=0", "--allocated", "topo.dev/nic=mlx5_1"]
    res = CliRunner().invoke(explain, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "partners (this container's earlier Allocates): nvidia.com/gpu=1,2" in res.output
    data = json.loads(CliRunner().invoke(explain, [*args, "--format", "json"]).output)
    gpu, nic = data["allocations"]
    assert gpu["preferredCall"]["partners"] == {}
    assert nic["preferredCall"]["partners"] == {"nvidia.com/gpu": gpu["devices"]}
    # GPU1's PIX NIC is taken: GPU2 gets its PIX NIC, GPU1 the best left on its NUMA node.
    assert sorted((p["device"], p["link"]) for p in data["pairs"]["main"]) == [("1", "NODE"), ("2", "PIX")]


def test_with_seeds_the_partners_and_window_zero_turns_pairing_off():
    base = [*H100, "--policy", "none", "--request", "topo.dev/nic=1", "--format", "json"]
    paired = json.loads(CliRunner().invoke(explain, [*base, "--with", "nvidia.com/gpu=6"]).output)
    (alloc,) = paired["allocations"]
    assert alloc["devices"] == ["mlx5_6"] and alloc["preferredCall"]["pairs"][0]["link"] == "PIX"
    off = json.loads(CliRunner().invoke(explain, [*base, "--with", "nvidia.com/gpu=6",
                                                  "--pairing-window-ms", "0"]).output)
    (alloc,) = off["allocations"]
    assert alloc["devices"] != ["mlx5_6"] and alloc["preferredCall"]["partners"] == {}
