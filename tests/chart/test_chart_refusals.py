"""The chart refuses what the daemon refuses at start, with the daemon's own words.

Why both sides in every test: the chart's checks (templates/_validate.tpl) restate rules that
live in the daemon (plugin/model/serving_modes.py, plugin/model/time_slicing.py, plugin/model/nic_pools,
plugin/model/resource_names.py, plugin/config/sharing.py). Each rule below is rendered twice: by the
real chart, which must fail `helm template` with the message, and by a copy of the chart with
the checks taken out, whose rendered ConfigMap and command line are then handed to the real
daemon (`python -m plugin serve --simulate dgx-h100`, the chart's own flags). The daemon must
refuse with exit 2, and the chart's message must be the daemon's: `<values path>: <the
daemon's text after its location>`. A reworded daemon message, a new condition on either side
or a renamed field fails here.

Accepted combinations run the same way: the chart renders, and the daemon passes every start-up
check (DRA is on in each, so it stops right after them, at the API server it cannot reach here).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "topo-device-plugin"
NAMESPACE = "topo-system"
RELEASE = "tdp"
#: Rendered for the tested Kubernetes line, as tests/chart/test_chart.py's run_helm does.
KUBE_VERSION = json.loads((ROOT / "tests" / "kubelet" / "k8s_versions.json").read_text())["current"]["kubernetes"]
#: Every case runs on a simulated node, without the NVIDIA runtime.
BASE = {"simulate": "dgx-h100", "nvidia": {"enabled": False}}

pytestmark = pytest.mark.timeout(1800)  # a cold helm build runs inside the first test


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def merge(into: dict[str, Any], new: dict[str, Any]) -> None:
        for k, v in new.items():
            if isinstance(v, dict) and isinstance(into.get(k), dict):
                merge(into[k], v)
            else:
                into[k] = copy.deepcopy(v)

    for p in parts:
        merge(out, p)
    return out


def flags(**kw: Any) -> dict[str, Any]:
    return {"config": {"flags": kw}}


def pools(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"config": {"nics": {"resourceList": list(entries)}}}


def time_slicing(*entries: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"config": {"sharing": {"timeSlicing": {**kw, "resources": list(entries)}}}}


def dra(*names: str) -> dict[str, Any]:
    return {"dra": {"resources": list(names)}}


POOL_A = {"resourceName": "rdma_a", "resourcePrefix": "example.com", "selectors": {"vendors": ["15b3"]}}


@dataclass(frozen=True)
class Rule:
    """A combination the daemon refuses at start; `values` break exactly this rule.

    `location`: how the daemon's message names the place: `field` (`<config file>[:<line>]:
    field <field>: `, the chart's `where` is then `config.<field>`), `--dra-resources` (the flag
    the chart renders from dra.resources), `Invalid value for '<flag>'` (a flag's value refused
    when the command line is read), or None (no place: the chart names the value).
    `says`: words that identify the rule, so another refusal cannot pass for this one.
    """

    id: str
    values: dict[str, Any]
    where: str
    location: str | None
    says: str
    #: The daemon module whose rule it is (for messages).
    source: str


RULES = [
    Rule("sharing-mps-and-time-slicing", {"config": {"sharing": {
        "mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]},
        "timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}},
         "config.sharing.mps", "field", "cannot share GPUs both by time-slicing and by MPS", "plugin/config/sharing.py"),
    Rule("nic-pool-name-invalid", pools({"resourceName": "-rdma", "selectors": {"vendors": ["15b3"]}}),
         "config.nics.resourceList[0].resourceName", "field", "is not a valid extended resource name",
         "plugin/model/nic_pools/config.py"),
    Rule("nic-pool-prefix-reserved", pools({**POOL_A, "resourcePrefix": "requests.example.com"}),
         "config.nics.resourceList[0].resourceName", "field", "is not a valid extended resource name",
         "plugin/model/nic_pools/config.py"),
    Rule("nic-pool-duplicate", pools(POOL_A, {**POOL_A, "selectors": {"vendors": ["8086"]}}),
         "config.nics.resourceList[1].resourceName", "field", "example.com/rdma_a is already defined",
         "plugin/model/nic_pools/config.py"),
    Rule("nic-selector-rdma-on-vfio", pools({**POOL_A, "selectors": {"drivers": ["vfio-pci"], "isRdma": True}}),
         "config.nics.resourceList[0].selectors.isRdma", "field", "vfio-pci functions have no RDMA device",
         "plugin/model/nic_pools/config.py"),
    *[Rule(f"nic-{rid}", pools({**POOL_A, "selectors": [{"vendors": ["15b3"]}, {key: items}]}),
           f"config.nics.resourceList[0].selectors[1].{key}[{len(items) - 1}]", "field", says,
           "plugin/model/nic_pools/config.py")
      for rid, key, items, says in [
          ("pf-without-name", "pfNames", [" #0-3"], "' #0-3' names no PF"),
          ("pf-two-hashes", "pfNames", ["ens1f0#0#1"], "'ens1f0#0#1' has more than one '#'"),
          ("pf-no-index", "pfNames", ["ens1f0# "], "'ens1f0# ' has no VF index after '#'"),
          ("pf-bad-range", "pfNames", ["ens1f0#0,a-b"], "has a bad VF index or range 'a-b'"),
          ("pf-range-reversed", "pfNames", ["ens1f0#2,7-3"], "has the range '7-3' whose end is before its start"),
          # Python's repr picks double quotes for a name with a quote, and long values are clipped.
          ("pf-quoted-long-name", "pfNames", ["it's-" + "p" * 90 + "#5-1"], "whose end is before its start"),
          ("pf-listed-twice", "pfNames", ["ens1f0#0-1", " ENS1F0#3"], "'ENS1F0' is already listed"),
          ("root-device-not-pci", "rootDevices", ["3b:00#1"], "'3b:00' is not a PCI address"),
          ("root-device-listed-twice", "rootDevices", ["3b:00.0#0", "0000:3B:00.0#1"], "is already listed at"),
      ]],
    # Resource names under config.flags: the generated rules of values.schema.json refuse them before any
    # template runs, as the daemon's config schema does (tests/chart/test_chart_flags.py). On the command
    # line the daemon names the flag.
    Rule("gpu-resource-name-invalid-in-extra-args", {"extraArgs": ["--gpu-resource-name=example.kubernetes.io/gpu"]},
         "extraArgs", "Invalid value for '--gpu-resource-name'",
         "'example.kubernetes.io/gpu' is not a valid extended resource name", "plugin/model/resource_names.py"),
    Rule("gpu-resource-name-domain-too-long-in-extra-args",
         {"extraArgs": ["--gpu-resource-name=" + "d" * 254 + "/gpu"]}, "extraArgs",
         "Invalid value for '--gpu-resource-name'", "is not a valid extended resource name", "plugin/model/resource_names.py"),
    Rule("dra-unknown-resource", dra("nvidia.com/gpu", "topo.dev/nics"),
         "dra.resources", "--dra-resources", "'topo.dev/nics' is not a resource of this configuration",
         "plugin/model/serving_modes.py"),
    Rule("dra-default-nic-with-pools", merged(dra("topo.dev/nic"), pools(POOL_A)),
         "dra.resources", "--dra-resources", "it serves nvidia.com/gpu, example.com/rdma_a",
         "plugin/model/serving_modes.py"),
    Rule("dra-mig-without-the-gpu-resource", merged(dra("topo.dev/nic"), flags(draMig="dynamic")),
         "config.flags.draMig", "field", "MIG through DRA needs the GPU resource nvidia.com/gpu in draResources",
         "plugin/cli/options.py"),
    Rule("dra-gpu-with-mig-strategy", merged(dra("nvidia.com/gpu"), flags(migStrategy="mixed")),
         "dra.resources", "--dra-resources", "needs MIG strategy none, not 'mixed'", "plugin/model/serving_modes.py"),
    Rule("dra-gpu-with-mig-strategy-in-extra-args",
         merged(dra("nvidia.com/gpu"), flags(migStrategy="none"), {"extraArgs": ["--mig-strategy=single"]}),
         "dra.resources", "--dra-resources", "needs MIG strategy none, not 'single'", "plugin/model/serving_modes.py"),
    Rule("dra-gpu-with-mig-strategy-in-extra-env",
         merged(dra("nvidia.com/gpu"), {"extraEnv": [{"name": "TOPO_DP_MIG_STRATEGY", "value": "mixed"}]}),
         "dra.resources", "--dra-resources", "needs MIG strategy none, not 'mixed'", "plugin/model/serving_modes.py"),
    Rule("dra-renamed-gpu-in-extra-env-time-sliced",
         merged(dra("example.com/gpu"), time_slicing({"name": "gpu", "replicas": 2}),
                {"extraEnv": [{"name": "TOPO_DP_GPU_RESOURCE_NAME", "value": "example.com/gpu"}]}),
         "dra.resources", "--dra-resources", "example.com/gpu through DRA cannot be time-sliced",
         "plugin/model/serving_modes.py"),
    Rule("dra-gpu-time-sliced", merged(dra("nvidia.com/gpu"), time_slicing({"name": "nvidia.com/gpu", "replicas": 4})),
         "dra.resources", "--dra-resources", "nvidia.com/gpu through DRA cannot be time-sliced",
         "plugin/model/serving_modes.py"),
    Rule("dra-renamed-gpu-time-sliced",
         merged(flags(gpuResourceName="example.com/gpu"), dra("example.com/gpu"),
                time_slicing({"name": "example.com/mig-1g.10gb", "replicas": 2})),
         "dra.resources", "--dra-resources", "example.com/gpu through DRA cannot be time-sliced",
         "plugin/model/serving_modes.py"),
    Rule("time-slicing-not-a-gpu", time_slicing({"name": "topo.dev/nic", "replicas": 2}),
         "config.sharing.timeSlicing.resources[0].name", "field", "'topo.dev/nic' cannot be time-sliced",
         "plugin/model/time_slicing.py"),
    Rule("time-slicing-other-domain", merged(flags(gpuResourceName="example.com/gpu"),
                                             time_slicing({"name": "nvidia.com/gpu", "replicas": 2})),
         "config.sharing.timeSlicing.resources[0].name", "field",
         "'nvidia.com/gpu' cannot be time-sliced: only example.com/gpu and the MIG resources",
         "plugin/model/time_slicing.py"),
    Rule("time-slicing-rename-invalid",
         time_slicing({"name": "gpu", "replicas": 2}, {"name": "mig-1g.10gb", "replicas": 2,
                                                      "rename": "shared.kubernetes.io/mig"}),
         "config.sharing.timeSlicing.resources[1].rename", "field", "is not a valid extended resource name",
         "plugin/model/time_slicing.py"),
    Rule("time-slicing-shared-name-too-long",
         time_slicing({"name": "mig-" + "m" * 55, "replicas": 2}, renameByDefault=True),
         "config.sharing.timeSlicing.resources[0].rename", "field", ".shared' is not a valid extended resource name",
         "plugin/model/time_slicing.py"),
    Rule("time-slicing-replicas-collide",
         time_slicing({"name": "gpu", "replicas": 2, "rename": "example.com/shared"},
                      {"name": "nvidia.com/mig-1g.10gb", "replicas": 2, "rename": "example.com/shared"}),
         "config.sharing.timeSlicing.resources[1]", "field",
         "example.com/shared already holds replicas of nvidia.com/gpu", "plugin/model/time_slicing.py"),
]


# ---- rendering and running -----------------------------------------------------------------------


def helm_template(helm: str, chart: Path, values: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess:
    vfile = tmp_path / f"values-{uuid.uuid4().hex[:8]}.yaml"
    vfile.write_text(yaml.safe_dump(values, sort_keys=False))
    return subprocess.run([helm, "template", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(vfile),
                           "--kube-version", KUBE_VERSION], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def unchecked_chart(tmp_path_factory) -> Path:
    """A copy of the chart without its start-up checks: renders what the daemon would get."""
    chart = tmp_path_factory.mktemp("unchecked") / "topo-device-plugin"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "_validate.tpl").write_text(
        '{{- define "topo-device-plugin.validate" -}}{{- end }}\n')
    return chart


@dataclass
class Rendered:
    config: str
    args: list[str]
    env: list[dict[str, Any]] = field(default_factory=list)


def render(helm: str, chart: Path, values: dict[str, Any], tmp_path: Path) -> Rendered:
    proc = helm_template(helm, chart, values, tmp_path)
    assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
    objects = {o["kind"]: o for o in yaml.safe_load_all(proc.stdout) if o}
    container = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    return Rendered(objects["ConfigMap"]["data"]["config.yaml"], container["args"], container.get("env", []))


#: What the downward API gives the chart's env entries on a node.
FIELD_REFS = {"spec.nodeName": "node-a", "metadata.uid": str(uuid.uuid4())}


def run_daemon(rendered: Rendered, tmp_path: Path) -> subprocess.CompletedProcess:
    """`topo-device-plugin serve` with the chart's config, flags and environment; only the paths of
    the pod (config mount, kubelet root, metrics port) are local ones."""
    work = tmp_path / f"daemon-{uuid.uuid4().hex[:8]}"
    (work / "kubelet" / "device-plugins").mkdir(parents=True)
    config = work / "config.yaml"
    config.write_text(rendered.config)
    local = {"--config": f"--config={config}", "--kubelet-root-dir": f"--kubelet-root-dir={work / 'kubelet'}",
             "--metrics-address": "--metrics-address=127.0.0.1:0"}
    args = [local.get(a.partition("=")[0], a) for a in rendered.args]
    assert args[0] == "serve" and all(a in args for a in local.values()), rendered.args
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TOPO_DP_") and k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    for e in rendered.env:
        env[e["name"]] = e["value"] if "value" in e else FIELD_REFS[e["valueFrom"]["fieldRef"]["fieldPath"]]
    env["PYTHONPATH"] = str(ROOT)
    try:
        return subprocess.run([sys.executable, "-m", "plugin", *args, f"--cdi-spec-dir={work / 'cdi'}"],
                              capture_output=True, text=True, cwd=work, env=env, timeout=120)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the daemon did not stop within {e.timeout} s: it accepted the config and served it\n"
                    f"{rendered.config}\n{args}")


def daemon_error(proc: subprocess.CompletedProcess) -> str:
    found = re.findall(r"^Error: (.*)$", proc.stderr, re.M)
    assert found, f"no error message (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return found[-1]


# ---- one test per rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_chart_refuses_what_the_daemon_refuses(helm, unchecked_chart, tmp_path, rule):
    values = merged(BASE, rule.values)
    # The daemon, given what the chart would install, refuses at start (exit 2: the user's input).
    proc = run_daemon(render(helm, unchecked_chart, values, tmp_path), tmp_path)
    message = daemon_error(proc)
    assert proc.returncode == 2, f"exit {proc.returncode}: {message}"
    if rule.location == "field":
        m = re.fullmatch(r"(?P<file>\S+?)(:\d+)?: field (?P<field>\S+): (?P<body>.*)", message)
        assert m, message
        assert m["file"].endswith("config.yaml"), message
        assert f"config.{m['field']}" == rule.where, message  # the chart names the value the daemon names
        body = m["body"]
    elif rule.location is not None:
        assert message.startswith(f"{rule.location}: "), message
        body = message.removeprefix(f"{rule.location}: ")
    else:
        body = message
    assert rule.says in body, f"the daemon refused for another reason than {rule.source}'s rule: {message}"
    # The real chart refuses the same values at `helm template`, in the same words.
    chart = helm_template(helm, CHART, values, tmp_path)
    assert chart.returncode != 0, f"{rule.id}: the chart rendered what the daemon refuses: {message}"
    assert f"{rule.where}: {body}" in chart.stderr, \
        f"chart and daemon disagree\n  daemon: {message}\n  chart:  {chart.stderr.strip()}"


def test_helm_lint_reports_the_refusal(helm, tmp_path):
    """The issue's case, DRA and time-slicing on the GPU resource, under `helm lint`: helm's lint mode
    turns a template `fail` into an [INFO] line and does not fail (helm's choice, not ours), so the
    message must at least be in its output. `helm install` renders as `helm template` does and fails."""
    vfile = tmp_path / "values.yaml"
    vfile.write_text(yaml.safe_dump(merged(dra("nvidia.com/gpu"),
                                           time_slicing({"name": "nvidia.com/gpu", "replicas": 4}))))
    proc = subprocess.run([helm, "lint", str(CHART), "-f", str(vfile)], capture_output=True, text=True, cwd=ROOT)
    assert "dra.resources: nvidia.com/gpu through DRA cannot be time-sliced" in proc.stdout + proc.stderr


def test_existing_configmap_turns_the_config_checks_off(helm, tmp_path):
    """With config.existingConfigMap the chart does not know the config, so it cannot judge it."""
    values = merged(dra("nvidia.com/gpu"), flags(migStrategy="mixed"), {"config": {"existingConfigMap": "mine"}})
    proc = helm_template(helm, CHART, values, tmp_path)
    assert proc.returncode == 0, proc.stderr


# ---- what stays accepted -------------------------------------------------------------------------

ACCEPTED = {
    # DRA on the NIC; the GPU stays on the device-plugin side, time-sliced and with MIG.
    "dra-nic-gpu-shared-and-mig": merged(dra("topo.dev/nic"), flags(migStrategy="mixed"),
                                         time_slicing({"name": "gpu", "replicas": 2},
                                                      {"name": "mig-1g.10gb", "replicas": 2}, renameByDefault=True)),
    # DRA on a renamed GPU resource and on a NIC pool with its own prefix.
    "dra-renamed-gpu-and-pool": merged(flags(gpuResourceName="example.com/gpu"), pools(POOL_A),
                                       dra("example.com/gpu", "example.com/rdma_a")),
    # Two resources' replicas under their own names; a pool name 63 characters long.
    "time-slicing-renamed": merged(dra("example.com/" + "r" * 63), pools({**POOL_A, "resourceName": "r" * 63}),
                                   time_slicing({"name": "nvidia.com/gpu", "replicas": 2, "rename": "gpu-shared"},
                                                {"name": "mig-2g.20gb", "replicas": 2})),
    # A flag in extraArgs wins over the config file (and over extraEnv), as in the daemon.
    "dra-gpu-mig-none-in-extra-args": merged(dra("nvidia.com/gpu"), flags(migStrategy="mixed"),
                                             {"extraEnv": [{"name": "TOPO_DP_MIG_STRATEGY", "value": "single"}],
                                              "extraArgs": ["--mig-strategy=mixed", "--mig-strategy=none"]}),
    # VF ranges, PCI addresses with and without a domain, RDMA beside a kernel driver: all fine.
    "nic-pool-selectors": merged(dra("example.com/rdma_a"), pools({**POOL_A, "selectors": [
        {"pfNames": ["ens1f0#0,2-7", "ens1f1", "ens1f2#3-3"], "isRdma": True, "drivers": ["vfio-pci", "mlx5_core"]},
        {"rootDevices": ["0000:3b:00.0#0-3", "3b:00.1", "0001:3b:00.0"]}]})),
    # The GPU through DRA with MIG strategy none said explicitly, beside NIC pools.
    "dra-gpu-mig-none": merged(dra("nvidia.com/gpu"), flags(migStrategy="none"), pools(POOL_A)),
}


@pytest.mark.parametrize("name", ACCEPTED)
def test_chart_accepts_what_the_daemon_accepts(helm, tmp_path, name):
    values = merged(BASE, ACCEPTED[name])
    rendered = render(helm, CHART, values, tmp_path)
    proc = run_daemon(rendered, tmp_path)
    # Past every start-up check of the config, the DRA driver looks for its API server (none here).
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
    assert "DRA mode cannot reach the API server" in daemon_error(proc)


# ---- sharing.timeSlicing's shape: the daemon's schema, in values.schema.json ----------------------

SHAPES = [
    ({"name": "nvidia.com/gpu", "replicas": 1}, "resources[0].replicas",
     "/config/sharing/timeSlicing/resources/0/replicas"),
    ({"name": "nvidia.com/gpu", "replicas": 2, "devices": 0}, "resources[0].devices",
     "/config/sharing/timeSlicing/resources/0/devices"),
    ({"name": "nvidia.com/gpu", "replicas": 2, "devices": ["GPU-1"]}, "resources[0].devices",
     "/config/sharing/timeSlicing/resources/0/devices"),
    ({"name": "nvidia.com/gpu", "replica": 2}, "resources[0]", "/config/sharing/timeSlicing/resources/0"),
]


@pytest.fixture(scope="module")
def schemaless_chart(unchecked_chart, tmp_path_factory) -> Path:
    """The unchecked chart without values.schema.json either."""
    chart = tmp_path_factory.mktemp("schemaless") / "topo-device-plugin"
    shutil.copytree(unchecked_chart, chart)
    (chart / "values.schema.json").unlink()
    return chart


@pytest.mark.parametrize("entry,field_,pointer", SHAPES, ids=[f"{s[1]}-{i}" for i, s in enumerate(SHAPES)])
def test_time_slicing_shape_is_refused_by_both_schemas(helm, schemaless_chart, tmp_path, entry, field_, pointer):
    values = merged(BASE, time_slicing(entry))
    chart = helm_template(helm, CHART, values, tmp_path)
    assert chart.returncode != 0
    assert "values don't meet the specifications of the schema" in chart.stderr and pointer in chart.stderr, \
        chart.stderr
    # The daemon, given that config (rendered without the chart's schema), refuses the same field.
    proc = run_daemon(render(helm, schemaless_chart, values, tmp_path), tmp_path)
    assert proc.returncode == 2
    assert f"field sharing.timeSlicing.{field_}" in daemon_error(proc)


def test_time_slicing_schema_is_the_daemons():
    """values.schema.json's time-slicing definitions are plugin/config/config-v1.json's, `$defs` renamed."""
    daemon = json.loads((ROOT / "plugin" / "config" / "config-v1.json").read_text())["$defs"]
    chart = json.loads((CHART / "values.schema.json").read_text())
    names = {"resourceName": "sharedResourceName", "replicatedResources": "replicatedResources",
             "replicatedResource": "replicatedResource"}

    def rewrite(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: ("#/definitions/" + names[v.rsplit("/", 1)[1]] if k == "$ref" else rewrite(v))
                    for k, v in x.items()}
        return [rewrite(i) for i in x] if isinstance(x, list) else x

    for theirs, ours in names.items():
        assert chart["definitions"][ours] == rewrite(daemon[theirs]), ours
    sharing = chart["properties"]["config"]["properties"]["sharing"]["properties"]
    assert sharing["timeSlicing"] == {"$ref": "#/definitions/replicatedResources"}
