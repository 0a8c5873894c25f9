"""Simulated nodes describe MIG layouts: `mig:` under a GPU, the MIG built-ins, and clear errors."""

from __future__ import annotations

import pytest

from allocator.topology import DeviceKind
from plugin.sources import TopologyError, builtin_names
from plugin.sources.simulated import load_simulated
from plugin.sources.simulated.node_yaml import load_node_yaml

HEAD = "apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\nmetadata: {name: lab}\ngpus:\n"


def test_mig_devices_carry_their_parent_and_what_nvml_would_say():
    t = load_node_yaml(HEAD + "  - {numa: 1, minor: 4, mig: [{profile: 3g.40gb, gi: 2, ci: 0},"
                              " {profile: 1g.10gb, uuid: MIG-00000000-0000-0000-0000-00000000000a, health: Unhealthy}]}\n"
                              "  - {numa: 0}\n", "lab.yaml")
    assert [d.name for d in t.gpus] == ["GPU0", "GPU1"]
    assert t.gpus[0].attributes == {"mig_mode": "enabled"} and not t.gpus[1].attributes
    big, small = t.of_kind(DeviceKind.MIG)
    assert (big.name, big.parent, big.numa, big.minor, big.memory_mib) == ("GPU0-mig0", "GPU0", 1, 4, 40960)
    assert dict(big.attributes) == {"profile": "3g.40gb", "gi": "2", "ci": "0", "index": "0:0",
                                    "caps": "/dev/nvidia-caps/nvidia-cap561,/dev/nvidia-caps/nvidia-cap562"}
    assert small.uuid == "MIG-00000000-0000-0000-0000-00000000000a" and small.health == "Unhealthy"
    assert small.attributes["gi"] == "1" and big.uuid.startswith("MIG-")
    # stable: the same file gives the same made-up UUIDs
    again = load_node_yaml(HEAD + "  - {numa: 1, minor: 4, mig: [{profile: 3g.40gb, gi: 2, ci: 0}]}\n", "lab.yaml")
    assert again.of_kind(DeviceKind.MIG)[0].uuid == big.uuid


def test_empty_mig_list_means_mig_mode_without_devices():
    t = load_node_yaml(HEAD + "  - {numa: 0, mig: []}\n", "lab.yaml")
    assert t.gpus[0].attributes["mig_mode"] == "enabled" and not t.of_kind(DeviceKind.MIG)


@pytest.mark.parametrize("gpu, words", [
    ("  - {numa: 0, mig: [{profile: 1g.10GB}]}\n", "lab.yaml:5: field gpus[0].mig[0].profile: '1g.10GB' is not a MIG profile name such as 1g.10gb"),
    ("  - {numa: 0, mig: [{profile: 1g.10gb, gi: 15}]}\n", "field gpus[0].mig[0].gi: 15 is greater than the maximum of 14"),
    ("  - {numa: 0, mig: [{profile: 1g.10gb, gi: 1}, {profile: 1g.10gb, gi: 1}]}\n",
     "lab.yaml:5: field gpus[0].mig[1]: GPU instance 1 / compute instance 0 is used twice on GPU0 (fix: give each"),
    ("  - {numa: 0, mig: [{profile: 1g.10gb, uuid: GPU-00000000-0000-0000-0000-000000000000}]}\n",
     "field gpus[0].mig[0].uuid"),
    ("  - {numa: 0, mig: [{profile: 1g.10gb, helth: Healthy}]}\n", "('helth' was unexpected)"),
])
def test_bad_mig_entries_name_the_file_line_and_field(gpu, words):
    with pytest.raises(TopologyError) as e:
        load_node_yaml(HEAD + gpu, "lab.yaml")
    assert words in str(e.value)


def test_mig_builtins():
    assert {"dgx-a100-mig", "dgx-a100-mig-1g"} <= set(builtin_names())
    mixed = load_simulated("dgx-a100-mig")
    profiles = {}
    for d in mixed.of_kind(DeviceKind.MIG):
        profiles.setdefault(d.parent, []).append(d.attributes["profile"])
    assert profiles["GPU0"] == ["3g.40gb", "2g.20gb", "1g.10gb"] and profiles["GPU1"] == ["1g.10gb"] * 7
    assert "GPU7" not in profiles and "mig_mode" not in mixed.device("GPU7").attributes
    uniform = load_simulated("dgx-a100-mig-1g")
    assert len(uniform.of_kind(DeviceKind.MIG)) == 56
    assert {d.attributes["profile"] for d in uniform.of_kind(DeviceKind.MIG)} == {"1g.10gb"}
    # MIG devices add no links: the GPU link matrix is the dgx-a100's
    base = load_simulated("dgx-a100")
    assert all(mixed.link(a, b) == base.link(a, b) for (a, b) in base.links)
