"""`discover` output and the option precedence flag > TOPO_DP_<OPTION> > config file > default."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from plugin.cli import cli


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_list_builtins():
    r = run("discover", "--list-builtins")
    assert r.exit_code == 0
    assert {"dgx-1-v100", "dgx-a100", "dgx-h100", "pcie-2socket-4gpu-2nic"} <= set(r.output.split())


def test_table_shows_devices_and_link_matrix():
    r = run("discover", "--simulate", "dgx-1-v100", "--device-id-strategy", "index")
    assert r.exit_code == 0
    lines = r.output.splitlines()
    header = next(line for line in lines if line.split()[:2] == ["GPU0", "GPU1"])
    assert header.split()[-2:] == ["NUMA", "Affinity"]
    row0 = next(line for line in lines if line.startswith("GPU0 "))
    assert row0.split()[1:6] == ["X", "NV1", "NV1", "NV2", "NV2"]
    assert "Resource nvidia.com/gpu" in r.output and "Resource topo.dev/nic" in r.output


def test_json_yaml_and_dot():
    data = json.loads(run("discover", "--simulate", "pcie-2socket-4gpu-2nic", "--format", "json").output)
    assert [d["numa"] for d in data["devices"] if d["kind"] == "gpu"] == [0, 0, 1, 1]
    assert {"a": "GPU0", "b": "GPU1", "link": "PIX", "weight": 50} in data["links"]
    assert yaml.safe_load(run("discover", "--simulate", "pcie-2socket-4gpu-2nic", "--format", "yaml").output) == data
    dot = run("discover", "--simulate", "dgx-1-v100", "--format", "dot").output
    assert dot.startswith("graph topology {") and '"GPU0" -- "GPU3" [label="NV2"' in dot and "cluster_numa1" in dot


def test_discover_shows_each_gpus_closest_nics():
    r = run("discover", "--simulate", "dgx-a100", "--device-id-strategy", "index")
    row = next(line for line in r.output.splitlines() if line.split()[:2] == ["2", "GPU2"])
    assert row.endswith("mlx5_2,mlx5_3 (PXB)")  # the two NICs behind GPU2's PCIe switch pair
    data = json.loads(run("discover", "--simulate", "dgx-h100", "--format", "json").output)
    gpu5 = next(d for d in data["devices"] if d["name"] == "GPU5")
    assert gpu5["closestNics"] == {"link": "PIX", "nics": ["mlx5_5"]}
    assert all("closestNics" not in d for d in data["devices"] if d["kind"] == "nic")
    y = yaml.safe_load(run("discover", "--simulate", "dgx-h100", "--format", "yaml").output)
    assert y["devices"][0]["closestNics"] == {"link": "PIX", "nics": ["mlx5_0"]}



def test_discover_shows_complexes_where_the_platform_defines_them():
    """gb300-cx8-dd: the PCIe matrix says NODE, the complex column and table say which NIC is whose, the
    closest NIC is the complex's (it pairs as PIX), JSON carries the fields and dot draws the pairs."""
    r = run("discover", "--simulate", "gb300-cx8-dd", "--device-id-strategy", "index")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    gpu0 = next(line for line in lines if line.split()[:2] == ["0", "GPU0"])
    assert "MT2452XZ0A01 (data-direct)" in gpu0 and gpu0.endswith("mlx5_1 (PIX)")
    nic1 = next(line for line in lines if line.split()[:2] == ["mlx5_1", "mlx5_1"])
    assert nic1.endswith("MT2452XZ0A01 (data-direct)")
    assert next(line for line in lines if line.startswith("GPU0 ")).split()[5:7] == ["NODE", "NODE"]
    table = lines[lines.index(next(line for line in lines if line.startswith("GPU–NIC complexes"))) + 2:]
    assert [row.split()[:2] + row.split()[-1:] for row in table] == [
        ["GPU0", "mlx5_1", "NODE"], ["GPU1", "mlx5_0", "NODE"], ["GPU2", "mlx5_3", "NODE"], ["GPU3", "mlx5_2", "NODE"]]
    data = json.loads(run("discover", "--simulate", "gb300-cx8-dd", "--format", "json").output)
    by_name = {d["name"]: d for d in data["devices"]}
    assert (by_name["mlx5_0"]["complex"], by_name["mlx5_0"]["complexKind"]) == ("MT2452XZ0A02", "data-direct")
    assert by_name["GPU1"]["complex"] == "MT2452XZ0A02" and by_name["GPU1"]["fabric"]["cliqueId"] == 7
    assert by_name["GPU1"]["fabric"]["clique"] == by_name["GPU2"]["fabric"]["clique"]
    dot = run("discover", "--simulate", "gb300-cx8-dd", "--format", "dot").output
    assert '"GPU0" -- "mlx5_1" [label="complex MT2452XZ0A01"' in dot and '"GPU0" -- "mlx5_0"' not in dot


def test_nodes_without_complexes_show_no_complex_column_or_field():
    r = run("discover", "--simulate", "hgx-b200")
    assert r.exit_code == 0 and "COMPLEX" not in r.output and "complexes" not in r.output
    data = json.loads(run("discover", "--simulate", "dgx-h100", "--format", "json").output)
    assert all("complex" not in d and "fabric" not in d for d in data["devices"])
    assert "complex" not in run("discover", "--simulate", "dgx-h100", "--format", "dot").output


def test_discover_on_a_node_without_nics_has_no_closest_nics(tmp_path):
    node = tmp_path / "gpus.yaml"
    node.write_text("apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\nmetadata: {name: two}\n"
                    "numa: {nodes: [0]}\ngpus: [{name: GPU0, numa: 0}, {name: GPU1, numa: 0}]\n")
    r = run("discover", "--simulate", str(node))
    assert r.exit_code == 0, r.output
    assert "GPU1" in r.output and "CLOSEST NICS" not in r.output
    assert "closestNics" not in run("discover", "--simulate", str(node), "--format", "json").output


def test_bad_topology_file_exits_2_naming_file_line_and_token(tmp_path):
    bad = tmp_path / "node.txt"
    bad.write_text("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV9x\t0-1\nGPU1\tNV9x\t X \t0-1\n")
    r = CliRunner().invoke(cli, ["discover", "--simulate", str(bad)])
    assert r.exit_code == 2
    assert f"{bad}:2" in r.output and "'NV9x'" in r.output


def ids(output: str) -> list[str]:
    return [d["id"] for d in json.loads(output)["resources"][0]["devices"]]


def test_precedence_flag_over_env_over_config_over_default(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("version: v1\nflags:\n  deviceIdStrategy: index\n  gpuResourceName: example.com/gpu\n")
    base = ["discover", "--simulate", "pcie-2socket-4gpu-2nic", "--format", "json"]
    assert ids(run(*base).output)[0].startswith("GPU-")  # default: uuid
    from_config = run(*base, "--config", str(cfg)).output
    assert ids(from_config) == ["0", "1", "2", "3"]
    assert json.loads(from_config)["resources"][0]["name"] == "example.com/gpu"
    from_env = run(*base, "--config", str(cfg), env={"TOPO_DP_DEVICE_ID_STRATEGY": "uuid"}).output
    assert ids(from_env)[0].startswith("GPU-")
    from_flag = run(*base, "--config", str(cfg), "--device-id-strategy", "index",
                    env={"TOPO_DP_DEVICE_ID_STRATEGY": "uuid"}).output
    assert ids(from_flag) == ["0", "1", "2", "3"]


def test_bad_config_exits_2_naming_file_field_and_fix(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("version: v1\nflags:\n  deviceIdStrategy: serial\n")
    r = CliRunner().invoke(cli, ["discover", "--simulate", "dgx-a100", "--config", str(cfg)])
    assert r.exit_code == 2
    assert f"{cfg}:3: field flags.deviceIdStrategy" in r.output and "fix:" in r.output
    cfg.write_text("version: v1\nflag:\n  deviceIdStrategy: index\n")
    r = CliRunner().invoke(cli, ["discover", "--simulate", "dgx-a100", "--config", str(cfg)])
    assert r.exit_code == 2 and "remove or rename the unknown field" in r.output


def test_invalid_resource_name_is_a_usage_error():
    r = CliRunner().invoke(cli, ["discover", "--simulate", "dgx-a100", "--gpu-resource-name", "kubernetes.io/gpu"])
    assert r.exit_code == 2 and "not a valid extended resource name" in r.output


def test_version():
    r = run("--version")
    assert r.exit_code == 0 and "topo-device-plugin" in r.output
