"""NVIDIA's config file, unchanged, in our config reader: what is mapped, accepted, refused and ignored.

Refusals are what an operator sees at start-up (exit 2): the file, the line, the field and the fix.
"""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from plugin.cli import cli
from plugin.config import ConfigError, parse_config
from plugin.config.sharing import DeviceSelection, SharingError
from topo_testkit.nvidia_configs import FLAGS_AND_TIME_SLICING

NVIDIA_FULL = FLAGS_AND_TIME_SLICING


def test_nvidia_file_loads_with_flags_mapped_and_the_rest_explained(caplog):
    with caplog.at_level(logging.INFO):
        config = parse_config(NVIDIA_FULL, "nvidia.yaml")
    assert config.flags == {"migStrategy": "none", "failOnInitError": True, "deviceListStrategy": "envvar",
                            "deviceIdStrategy": "uuid", "passDeviceSpecs": False}
    ts = config.time_slicing
    assert ts is not None and not ts.rename_by_default and not ts.fail_requests_greater_than_one
    (entry,) = ts.resources
    assert (entry.name, entry.replicas, entry.rename, entry.devices) == ("nvidia.com/gpu", 10, None, DeviceSelection())
    assert entry.where == "nvidia.yaml:20: field sharing.timeSlicing.resources[0]"
    text = caplog.text
    assert "flags.gfd ignored" in text


def test_nvidia_flags_drive_the_cli_like_ours(tmp_path):
    """deviceIDStrategy: index in NVIDIA's spelling gives index IDs; migStrategy: mixed serves MIG profiles."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(NVIDIA_FULL.replace('deviceIDStrategy: "uuid"', 'deviceIDStrategy: "index"')
                   .replace('migStrategy: "none"', 'migStrategy: "mixed"'))
    r = CliRunner().invoke(cli, ["discover", "--config", str(cfg), "--simulate", "dgx-a100-mig", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert '"name": "nvidia.com/mig-3g.40gb"' in r.output and '"id": "3:1"' in r.output
    assert '"name": "nvidia.com/gpu"' in r.output and '"id": "7::9"' in r.output  # GPU7 shared 10 ways


@pytest.mark.parametrize("change, where, words", [
    (('nvidiaDriverRoot: "/"', 'nvidiaDriverRoot: "/run/nvidia/driver"'), "5: field flags.nvidiaDriverRoot",
     "set flags.devRoot to where this container sees /run/nvidia/driver/dev"),
    (('deviceListStrategy: "envvar"', 'deviceListStrategy: "volume-mounts"'), "8: field flags.plugin.deviceListStrategy",
     "volume-mounts strategy is not supported"),
    (("failOnInitError: true", "failOnInitError: true\n  gdrcopyEnabled: true"), "5: field flags.gdrcopyEnabled",
     "set it to false"),
    (("passDeviceSpecs: false", "sharedDevicesAllocationPolicy: packed"),
     "7: field flags.plugin.sharedDevicesAllocationPolicy", "most distinct, least-loaded GPUs"),
    (('deviceIDStrategy: "uuid"', 'deviceIDStrategy: "uuid"\n  deviceIdStrategy: index'),
     "9: field flags.plugin.deviceIDStrategy", "contradicts flags.deviceIdStrategy"),
    (("version: v1", "version: v1\nimex:\n  channelIDs: [2]"), "3: field imex.channelIDs",
     "channelIDs must be [] or [0] (NVIDIA's device plugin accepts no other); found [2]"),
    (("version: v1", "version: v1\nimex:\n  channelIDs: [0, 1]"), "3: field imex.channelIDs",
     "found [0, 1]"),
    (("failOnInitError: true", "failOnInitError: true\n  deviceDiscoveryStrategy: tegra"),
     "5: field flags.deviceDiscoveryStrategy", "Tegra devices are not supported"),
])
def test_nvidia_settings_we_cannot_honour_are_refused_with_the_fix(change, where, words):
    with pytest.raises(ConfigError) as e:
        parse_config(NVIDIA_FULL.replace(*change), "nvidia.yaml")
    assert f"nvidia.yaml:{where}" in str(e.value) and words in str(e.value) and "(fix: " in str(e.value)


@pytest.mark.parametrize("change, words", [
    (("replicas: 10", "replicas: 1"), "field sharing.timeSlicing.resources[0].replicas: 1 is less than the minimum of 2"),
    (("replicas: 10", "replicas: 10\n      devices: some"), "field sharing.timeSlicing.resources[0].devices"),
    (("replicas: 10", "replicas: 10\n      devices: 0"), "field sharing.timeSlicing.resources[0].devices"),
    (("replicas: 10", "replicas: 10\n      devices: [GPU-1]"), "field sharing.timeSlicing.resources[0].devices"),
    (("replicas: 10", "replica: 10"), "21: field sharing.timeSlicing.resources[0]: Additional properties are not "
                                      "allowed ('replica' was unexpected)"),
    (("    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n", "    resources: []\n"),
     "field sharing.timeSlicing.resources: [] should be non-empty"),
])
def test_time_slicing_follows_nvidias_rules(change, words):
    with pytest.raises(ConfigError) as e:
        parse_config(NVIDIA_FULL.replace(*change), "nvidia.yaml")
    assert words in str(e.value)


def test_devices_all_count_and_list_are_read_as_nvidia_writes_them():
    text = NVIDIA_FULL.replace("      replicas: 10\n", "      replicas: 10\n      devices: 3\n"
                               "    - name: nvidia.com/mig-1g.10gb\n      replicas: 2\n"
                               "      devices: [0, '1:2', GPU-00000000-0000-0000-0000-000000000001]\n"
                               "      rename: gpu-small\n")
    ts = parse_config(text, "c.yaml").time_slicing
    assert ts is not None
    assert ts.resources[0].devices == DeviceSelection(count=3)
    assert ts.resources[1].devices.refs == ("0", "1:2", "GPU-00000000-0000-0000-0000-000000000001")
    assert ts.target(ts.resources[1], "nvidia.com") == "nvidia.com/gpu-small"  # NVIDIA's domain for a bare name
    assert ts.target(ts.resources[0], "nvidia.com") == "nvidia.com/gpu"


def test_nvidias_mps_section_loads_as_mps_replicas_one_per_container():
    ts = parse_config(NVIDIA_FULL.replace("timeSlicing:", "mps:"), "nvidia.yaml").time_slicing
    assert ts is not None and ts.mps and ts.fail_requests_greater_than_one
    (entry,) = ts.resources
    assert (entry.name, entry.replicas) == ("nvidia.com/gpu", 10)
    assert entry.where == "nvidia.yaml:20: field sharing.mps.resources[0]"


def test_mps_and_time_slicing_together_are_refused_naming_both():
    both = NVIDIA_FULL + "  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"
    with pytest.raises(SharingError) as e:
        parse_config(both, "nvidia.yaml")
    msg = str(e.value)
    assert msg.startswith("nvidia.yaml:") and "field sharing.mps: a config cannot share GPUs both" in msg
    assert "keep sharing.timeSlicing or sharing.mps" in msg


@pytest.mark.parametrize("section, ids, required", [
    ("imex:\n  channelIDs: [0]\n  required: true\n", (0,), True),
    ("imex:\n  channelIDs: [0]\n", (0,), False),
    ("imex:\n  channelIDs: []\n", (), False),
    ("imex:\n  channelIDs: null\n", (), False),  # NVIDIA's own test: a null list is valid
    ("imex: {}\n", (), False),
])
def test_nvidias_imex_section_loads_verbatim(section, ids, required):
    """NVIDIA's `imex:` keys as NVIDIA's api/config/v1/imex.go reads them: channel 0 or none."""
    config = parse_config(NVIDIA_FULL + section, "nvidia.yaml")
    assert (config.imex_channel_ids, config.imex_required) == (ids, required)


def test_nvidia_resources_section_is_ignored_with_nvidias_warning(caplog):
    text = NVIDIA_FULL + "resources:\n  gpus:\n  - pattern: '*A100*'\n    name: a100\n"
    with caplog.at_level(logging.WARNING):
        parse_config(text, "nvidia.yaml")
    assert "Customizing the 'resources' field is not supported" in caplog.text


def test_refusal_stops_serve_with_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(NVIDIA_FULL + "  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n")
    r = CliRunner().invoke(cli, ["serve", "--config", str(cfg), "--simulate", "dgx-a100",
                                 "--device-plugin-path", str(tmp_path / "dp")])
    assert r.exit_code == 2 and "cannot share GPUs both by time-slicing and by MPS" in r.output
