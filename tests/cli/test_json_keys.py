"""One JSON key style for every command (issue 33): Kubernetes' camelCase, all the way down.

Every command that prints JSON runs here on built-in simulated nodes, and the whole output is
walked: a field name that is not camelCase (`numa_nodes`, `NUMA span`, `left-score`) fails, so a
key added later in another style fails too. Maps keyed by data (resource names, container names,
device IDs, kubelet option names) are the ones `plugin.cli.json_keys.DATA_MAPS` names; their keys
are data and are not checked, their values are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from plugin.cli import cli
from plugin.cli.explain_cluster import verdicts_json
from plugin.cli.json_keys import CAMEL, DATA_MAP_LISTS, DATA_MAPS, camel
from plugin.model.resources import ResourceOptions, build_resources
from plugin.nrt.build import TopologyManagerSettings, build_nrt, published_resources
from plugin.nrt.cluster import cluster_verdicts, pod_from_spec
from plugin.sources.simulated import load_simulated

GPU = "nvidia.com/gpu"
#: Time-slicing with 4 replicas per GPU, renamed (the replica policy's JSON has its own fields).
SHARING = "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n" \
          "    - name: nvidia.com/gpu\n      replicas: 4\n"

#: (command, arguments) for every JSON-printing path: plain, paired, shared (replicas, MIG), rejected.
CASES = [
    ("discover", ["--list-builtins", "--format", "json"]),
    ("discover", ["--simulate", "dgx-h100", "--format", "json"]),
    ("discover", ["--simulate", "dgx-a100-mig", "--mig-strategy", "mixed", "--format", "json"]),
    ("discover", ["--simulate", "gb300-cx8-dd", "--format", "json"]),
    ("allocate", ["--simulate", "dgx-a100", "--device-id-strategy", "index", "--size", "2",
                  "--available", "0,1,2,4,5", "--must-include", "4", "--format", "json"]),
    ("allocate", ["--simulate", "dgx-h100", "--device-id-strategy", "index", "--size", "2",
                  "--resource", "topo.dev/nic", "--with", f"{GPU}=0,1", "--format", "json"]),
    ("allocate", ["--simulate", "dgx-a100-mig", "--mig-strategy", "mixed", "--size", "2",
                  "--resource", "nvidia.com/mig-1g.10gb", "--format", "json"]),
    ("allocate", ["--simulate", "dgx-a100", "--config", "{sharing}", "--resource", "nvidia.com/gpu.shared",
                  "--size", "3", "--format", "json"]),
    ("explain", ["--simulate", "dgx-h100", "--device-id-strategy", "index", "--policy", "single-numa-node",
                 "--request", f"{GPU}=2", "--request", "topo.dev/nic=2", "--init-request", f"{GPU}=1",
                 "--allocated", f"{GPU}=0", "--policy-option", "prefer-closest-numa-nodes=true",
                 "--format", "json"]),
    ("explain", ["--simulate", "dgx-a100", "--device-id-strategy", "index", "--policy", "restricted",
                 "--scope", "pod", "--request", f"{GPU}=4", "--allocated", "0,1,4,5", "--with", "topo.dev/nic=mlx5_0",
                 "--format", "json"]),
    ("explain", ["--simulate", "dgx-a100", "--policy", "none", "--request", f"{GPU}=1", "--format", "json"]),
]


def _field_names(obj: Any, path: str = "", data_keyed: bool = False) -> Iterator[tuple[str, str]]:
    """(path, key) for every field name in `obj`; the keys of data-keyed maps are skipped."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if data_keyed:
                yield from _field_names(value, f"{path}[{key!r}]")
                continue
            yield path, key
            child = f"{path}.{key}"
            if key in DATA_MAPS and isinstance(value, dict):
                yield from _field_names(value, child, data_keyed=True)
            elif key in DATA_MAP_LISTS and isinstance(value, list):
                for i, v in enumerate(value):
                    yield from _field_names(v, f"{child}[{i}]", data_keyed=True)
            else:
                yield from _field_names(value, child)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _field_names(v, f"{path}[{i}]")


def _not_camel(data: Any) -> list[str]:
    return sorted({f"{path or '.'}: {key!r}" for path, key in _field_names(data) if not CAMEL.fullmatch(str(key))})


def _json_commands() -> set[str]:
    """Every command with a `--format` choice that includes json."""
    out = set()
    for name, cmd in cli.commands.items():
        for p in cmd.params:
            if isinstance(p, click.Option) and "--format" in p.opts and isinstance(p.type, click.Choice) \
                    and "json" in p.type.choices:
                out.add(name)
    return out


def test_every_json_command_is_walked_here():
    # A new command with --format json must get a case above, or this fails.
    assert _json_commands() == {c for c, _ in CASES}


@pytest.mark.parametrize("command,args", CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CASES)])
def test_every_key_of_the_json_is_camel_case(command, args, tmp_path):
    (tmp_path / "sharing.yaml").write_text(SHARING)
    args = [a.replace("{sharing}", str(tmp_path / "sharing.yaml")) for a in args]
    res = CliRunner().invoke(cli, [command, *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data, "the command printed empty JSON"
    assert _not_camel(data) == []


def test_discover_yaml_has_the_same_keys_as_its_json():
    run = CliRunner().invoke
    as_json = json.loads(run(cli, ["discover", "--simulate", "dgx-a100-mig", "--format", "json"]).stdout)
    as_yaml = yaml.safe_load(run(cli, ["discover", "--simulate", "dgx-a100-mig", "--format", "yaml"]).stdout)
    assert as_yaml == as_json


def test_explain_cluster_json_is_camel_case():
    # explain --cluster reads NodeResourceTopology objects through an API server (tests/nrt runs that);
    # its JSON is printed by verdicts_json, checked here on published simulated nodes.
    topology = load_simulated("dgx-h100")
    resources = published_resources(build_resources(topology, ResourceOptions()))
    objects = [build_nrt("unknown-policy", topology, resources, set(), TopologyManagerSettings()),
               build_nrt("snn", topology, resources, set(), TopologyManagerSettings("single-numa-node", "container"))]
    pod = pod_from_spec({"spec": {"containers": [{"name": "main", "resources": {"limits": {GPU: 4}}}]}})
    data = json.loads(verdicts_json(cluster_verdicts(objects, pod)))
    assert {n["node"]: n["policyAssumed"] for n in data["nodes"]} == {"unknown-policy": True, "snn": False}
    assert _not_camel(data) == []


def test_the_walk_fails_on_a_snake_case_key_and_keeps_data_keys():
    # The check itself can fail: a snake_case field or a sentence as a key is reported, data keys are not.
    assert _not_camel({"numaNodes": [], "runner_up": {"ids": []}, "criteria": {"NUMA span": 1}}) == [
        ".: 'runner_up'", ".criteria: 'NUMA span'"]
    assert _not_camel({"inUse": {GPU: ["0"]}, "providersHints": [{GPU: [{"affinity": None}]}]}) == []
    assert camel("min_affinity_size") == "minAffinitySize" and camel(GPU) == GPU
