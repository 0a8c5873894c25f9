"""`discover`, `allocate` and `demo` with time-slicing and MIG, on simulated nodes (no GPU needed)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from plugin.cli import cli

SHARED = """\
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""


def run(*args: str) -> str:
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_discover_lists_mig_devices_per_profile_and_what_the_strategy_leaves_out():
    out = run("discover", "--simulate", "dgx-a100-mig", "--mig-strategy", "mixed", "--device-id-strategy", "index")
    assert "8 GPUs, 31 MIG devices, 8 NICs" in out
    block = out[out.index("Resource nvidia.com/mig-3g.40gb"):]
    assert block.splitlines()[1].split() == ["ID", "DEVICE", "PROFILE", "NUMA", "HEALTH", "UUID"]
    assert block.splitlines()[3].split()[:5] == ["3:0", "GPU3-mig0", "3g.40gb", "0", "Healthy"]
    assert "Not served under this --mig-strategy: GPU0, GPU1, GPU2, GPU3, GPU4, GPU5, GPU6" in out
    matrix_header = next(line for line in out.splitlines() if line.split()[:2] == ["GPU0", "GPU1"])
    assert "mig" not in matrix_header  # MIG devices have no links of their own
    none = run("discover", "--simulate", "dgx-a100-mig")
    assert "Not served under this --mig-strategy: GPU0-mig0" in none


def test_allocate_explains_a_replica_answer(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(SHARED)
    out = run("allocate", "--simulate", "dgx-a100", "--config", str(cfg), "--device-id-strategy", "index",
              "--resource", "nvidia.com/gpu.shared", "--size", "2",
              "--available", "0::0,0::1,1::1,5::0,5::1,5::2,5::3")
    # GPU0 and GPU1 (NUMA 0, GPU1 more loaded) beat two replicas of GPU5: most distinct GPUs in one node
    assert "Preferred allocation: 0::0, 1::1" in out
    assert "on: 0, 1" in out and "distinct GPUs: 2" in out and "W(GPUs): 1200" in out
    assert "Why: the time-slicing objective" in out
    data = json.loads(run("allocate", "--simulate", "dgx-a100", "--config", str(cfg), "--device-id-strategy",
                          "index", "--resource", "nvidia.com/gpu.shared", "--size", "3", "--format", "json"))
    assert data["policy"] == "replicas" and len(set(data["parents"])) == 3
    assert {c["name"]: c["value"] for c in data["criteria"]}["distinct GPUs"] == 3


def test_allocate_explains_a_mig_answer():
    data = json.loads(run("allocate", "--simulate", "dgx-a100-mig", "--mig-strategy", "mixed",
                          "--device-id-strategy", "index", "--resource", "nvidia.com/mig-1g.10gb", "--size", "3",
                          "--format", "json"))
    # 3 on one GPU: GPU0 has 1 free, GPU6 2: the fullest GPU that fits is a 7-slot one, on NUMA 0 (lowest order)
    assert data["ids"] == ["1:0", "1:1", "1:2"] and data["parents"] == ["1"]
    assert {c["name"]: c["value"] for c in data["criteria"]}["GPUs"] == 1


def test_demo_shows_mig_resources_and_the_cdi_specs_it_wrote():
    out = run("demo", "--simulate", "dgx-a100-mig", "--mig-strategy", "mixed", "--device-id-strategy", "index",
              "--device-list-strategy", "cdi-cri")
    assert "nvidia.com/mig-1g.10gb: 24 devices from ListAndWatch" in out
    assert "nvidia.com/mig-7g.80gb: GetPreferredAllocation(size=1, all free) -> 4:0" in out
    assert "Allocate(4:0) -> envs {'NVIDIA_VISIBLE_DEVICES': 'void'}" in out
    assert "cdi ['topo-dp.nvidia.com/mig-7g_80gb=4:0']" in out
    assert "CDI specs written to " in out and "topo-dp.nvidia.com-mig-3g_40gb.json" in out
