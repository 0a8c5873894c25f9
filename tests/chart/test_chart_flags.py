"""The generated `config.flags` rules hold in helm itself, as in the daemon.

tests/cli/test_option_rules.py checks the five keys that used to disagree (the device roots,
the resource names) value by value against the chart's schema with Python's validator; helm
validates with Go's regular expressions, so the boundary values go through `helm template`
too: what helm accepts reaches the rendered config file, and the daemon's own validation
accepts that file (`plugin.config.parse_config`).
"""

from __future__ import annotations

import pytest
import yaml

from plugin.config import ConfigError, parse_config
from plugin.config.flags import RESOURCE_NAME_PATTERN
from tests.chart.test_chart import CHART, RELEASE, run_helm, write_values

DOMAIN_253 = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
CASES = [
    ("devRoot", "/host/dev", True),
    ("procRoot", "host/proc", False),
    ("sysfsRoot", "./sys", False),
    ("gpuResourceName", f"{DOMAIN_253}/{'n' * 63}", True),  # the longest name the kubelet accepts
    ("gpuResourceName", f"{DOMAIN_253}x/gpu", False),
    ("nicResourceName", "example.com/" + "n" * 64, False),
    ("nicResourceName", "x.kubernetes.io/nic", False),
]


def daemon_accepts(config_text: str) -> bool:
    try:
        parse_config(config_text, "config.yaml")
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("key,value,ok", CASES, ids=[f"{k}-{'ok' if ok else 'refused'}-{v[:12]}" for k, v, ok in CASES])
def test_helm_and_the_daemon_agree(helm, tmp_path, key, value, ok):
    values = write_values(tmp_path, {"config": {"flags": {key: value}}})
    proc = run_helm(helm, "template", RELEASE, str(CHART), "-f", str(values), "--show-only",
                    "templates/configmap.yaml")
    if not ok:
        assert proc.returncode != 0, f"helm accepted config.flags.{key}={value!r}"
        assert "values don't meet the specifications of the schema" in proc.stderr and key in proc.stderr, proc.stderr
        assert not daemon_accepts(f"version: v1\nflags:\n  {key}: {value}\n")
        return
    assert proc.returncode == 0, proc.stderr
    rendered = yaml.safe_load(proc.stdout)["data"]["config.yaml"]
    assert yaml.safe_load(rendered)["flags"][key] == value
    assert daemon_accepts(rendered)


def test_the_templates_check_resource_names_by_the_daemons_pattern():
    """templates/_validate.tpl restates the rule for extraArgs/extraEnv values, which no schema sees."""
    text = (CHART / "templates" / "_validate.tpl").read_text()
    assert f'regexMatch "{RESOURCE_NAME_PATTERN}"' in text
