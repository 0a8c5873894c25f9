"""The keys where the chart and the daemon used to disagree now accept and refuse the same values.

`devRoot`, `procRoot` and `sysfsRoot` had to be absolute in the chart but not in the daemon;
the resource-name pattern and length existed only in the chart (the daemon bounded the name,
the chart the whole string). Now both sides read the rule from the option's declaration. Each
value is tried on the daemon as a flag, as an environment variable and in a config file, and
against the chart's checked-in `values.schema.json` (the drift test in test_options_model.py
proves that file is the generated one; tests/chart checks a few of these through helm itself).
"""

from __future__ import annotations

import json
import pathlib

import jsonschema
import pytest
from click.testing import CliRunner

from plugin.cli import cli
from plugin.config.flags import BY_NAME

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_SCHEMA = json.loads((ROOT / "charts" / "topo-device-plugin" / "values.schema.json").read_text())

DOMAIN_253 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # the longest DNS subdomain
PATHS = [("/host/dev", True), ("/", True), ("dev", False), ("./dev", False), ("host/dev", False)]
NAMES = [
    ("example.com/accel", True),
    ("example.com/" + "n" * 63, True),  # the longest name part
    (f"{DOMAIN_253}/gpu", True),  # the longest domain
    ("example.com/" + "n" * 64, False),
    (f"{DOMAIN_253}x/gpu", False),
    ("kubernetes.io/gpu", False),  # the kubelet keeps these
    ("x.kubernetes.io/gpu", False),
    ("requests.example.com/gpu", False),
    ("NVIDIA.com/gpu", False),
    ("gpu", False),
    ("example.com/gpu/extra", False),
]
CASES = [(name, value, ok) for name in ("dev_root", "proc_root", "sysfs_root") for value, ok in PATHS] + \
        [(name, value, ok) for name in ("gpu_resource_name", "nic_resource_name") for value, ok in NAMES]
IDS = [f"{n}={v[:24]}{'…' if len(v) > 24 else ''}-{'ok' if ok else 'refused'}" for n, v, ok in CASES]


def chart_accepts(key: str, value: str) -> bool:
    values = {"config": {"flags": {key: value}}}
    return not list(jsonschema.Draft7Validator(CHART_SCHEMA).iter_errors(values))


def discover(*args: str, env: dict[str, str] | None = None):
    # --simulate: the roots are not read, so an accepted value runs the whole command
    return CliRunner().invoke(cli, ["discover", "--simulate", "pcie-2socket-4gpu-2nic", *args], env=env)


#: Roots a simulated node never reads: an accepted value is then refused as having no effect.
UNREAD_WHEN_SIMULATED = ("sysfs_root", "proc_root")


def accepted(name: str, r) -> bool:
    if name in UNREAD_WHEN_SIMULATED:
        return r.exit_code == 2 and "has no effect with --simulate" in r.output
    return r.exit_code == 0


@pytest.mark.parametrize("name,value,ok", CASES, ids=IDS)
def test_the_daemon_and_the_chart_agree(tmp_path, name, value, ok):
    o = BY_NAME[name]
    assert chart_accepts(o.key, value) is ok, f"chart: config.flags.{o.key}={value!r}"

    r = discover(o.flag, value)
    assert accepted(name, r) if ok else r.exit_code == 2, r.output
    if not ok:
        assert f"Invalid value for '{o.flag}'" in r.output and o.fix in r.output, r.output

    r = discover(env={o.env: value})
    assert accepted(name, r) if ok else r.exit_code == 2, r.output
    if not ok:
        assert f"from the environment variable {o.env}" in r.output and o.fix in r.output, r.output

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"version": "v1", "flags": {o.key: value}}))
    r = discover("--config", str(config))
    assert accepted(name, r) if ok else r.exit_code == 2, r.output
    if not ok:
        assert f"{config}:1: field flags.{o.key}" in r.output and f"(fix: {o.fix})" in r.output, r.output
        assert "Traceback" not in r.output


def test_a_relative_root_is_refused_with_the_option_and_the_fix():
    r = discover("--dev-root", "dev")
    assert r.exit_code == 2
    assert "Invalid value for '--dev-root': 'dev' is not an absolute path (fix: give an absolute path" in r.output
