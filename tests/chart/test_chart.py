"""The Helm chart: lint, render, strict decode against the Kubernetes API types, schema.

Tools (conftest.py): a real `helm` built from its Go module by scripts/install_helm.sh and the
chart-decode program in tests/chart/decode (k8s.io/api types, strict decoding), both
cached under ~/.cache/topo-device-plugin/bin. Cold builds take a few minutes; warm runs
reuse the binaries at once. Where no Go toolchain (or no module proxy) is available the
tests skip and say why; set TOPO_DP_REQUIRE_CHART_TOOLS=1 to make that a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "topo-device-plugin"
NAMESPACE = "topo-system"
RELEASE = "tdp"

# Cold builds of helm and chart-decode run inside the first test that needs them.
pytestmark = pytest.mark.timeout(1800)


@dataclass
class Rendered:
    text: str
    objects: list[dict[str, Any]]

    def get(self, kind: str) -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] == kind]
        assert len(found) == 1, f"expected one {kind}, got {[o['kind'] for o in self.objects]}"
        return found[0]

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    @property
    def container(self) -> dict[str, Any]:
        return self.get("DaemonSet")["spec"]["template"]["spec"]["containers"][0]

    @property
    def pod_spec(self) -> dict[str, Any]:
        return self.get("DaemonSet")["spec"]["template"]["spec"]


#: The Kubernetes version rendering assumes: the current tested line (offline `helm template`
#: assumes 1.20, which the chart's kubeVersion refuses).
KUBE_VERSION = json.loads((ROOT / "tests" / "kubelet" / "k8s_versions.json").read_text())["current"]["kubernetes"]


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess:
    """helm with `args`; `template` renders for the tested Kubernetes version (as `helm install` would for
    the cluster's own) unless the caller names one."""
    if args and args[0] == "template" and "--kube-version" not in args:
        args = (*args, "--kube-version", KUBE_VERSION)
    return subprocess.run([helm, *args], capture_output=True, text=True, cwd=ROOT)


def write_values(tmp_path: Path, values: dict[str, Any], name: str = "values.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def render(helm: str, tmp_path: Path, values: dict[str, Any], chart: Path = CHART) -> Rendered:
    vfile = write_values(tmp_path, values)
    proc = run_helm(helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE, "-f", str(vfile))
    assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
    objects = [o for o in yaml.safe_load_all(proc.stdout) if o]
    return Rendered(proc.stdout, objects)


def decode(decoder: str, manifest: str) -> subprocess.CompletedProcess:
    return subprocess.run([decoder], input=manifest, capture_output=True, text=True)


# ---- value sets ----------------------------------------------------------------------------

NIC_POOLS = {
    "config": {
        "flags": {"failOnInitError": False, "nicAllocationPolicy": "packed"},
        "nics": {
            "resourceList": [
                {
                    "resourceName": "mlnx_rdma",
                    "resourcePrefix": "example.com",
                    "allocationPolicy": "spread",
                    "selectors": [{"vendors": ["15b3"], "devices": ["101e"], "isRdma": True}],
                    "additionalInfo": {"*": {"tier": "fast"}},
                },
                {
                    "resourceName": "intel_sriov_netdevice",
                    "deviceType": "netDevice",
                    "excludeTopology": False,
                    "selectors": {"pfNames": ["ens785f0#0-7"], "drivers": ["iavf"]},
                },
            ]
        },
    },
    "nvidia": {"enabled": False},
    "hostDev": {"enabled": True},
    "privileges": {"hostNetwork": True, "capabilities": ["NET_ADMIN"]},
}

CUSTOM_KUBELET = {"kubeletRootDir": "/var/snap/microk8s/common/var/lib/kubelet/"}

METRICS = {
    "metrics": {
        "port": 9500,
        "serviceMonitor": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "interval": "15s",
            "metricRelabelings": [{"action": "drop", "regex": "go_.*", "sourceLabels": ["__name__"]}],
        },
    },
    "namespace": {"create": True},
    "podAnnotations": {"example.com/team": "gpu"},
    "podLabels": {"tier": "node"},
}

KIND_SIMULATED = {
    "image": {"repository": "localhost/topo-device-plugin", "tag": "e2e", "pullPolicy": "Never"},
    "simulate": "dgx-a100",
    "nvidia": {"enabled": False},
    "hostSys": {"enabled": False},
    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
    "extraArgs": ["--log-level=debug"],
    "extraEnv": [{"name": "TOPO_DP_TIME_BUDGET_MS", "value": "50"}],
}

EXTRAS = {
    "image": {"digest": "sha256:" + "ab" * 32},
    "config": {"existingConfigMap": "my-topo-config"},
    "privileges": {"privileged": True},
    "updateStrategy": {"type": "OnDelete"},
    "serviceAccount": {"create": False, "name": "custom-sa"},
    "metrics": {"bindAddress": "::", "service": {"enabled": True}},
    "runtimeClassName": "nvidia",
    "nodeSelector": {"feature.node.kubernetes.io/pci-10de.present": "true"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}
                ]
            }
        }
    },
    "extraVolumes": [{"name": "node-file", "hostPath": {"path": "/etc/topo", "type": "DirectoryOrCreate"}}],
    "extraVolumeMounts": [{"name": "node-file", "mountPath": "/etc/topo", "readOnly": True}],
}

SHARING_CDI = {
    "config": {
        "flags": {"deviceListStrategy": ["envvar", "cdi-cri"], "migStrategy": "mixed"},
        "sharing": {"timeSlicing": {"renameByDefault": True,
                                    "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}},
        "imex": {"channelIDs": [0], "required": False},
    },
}

DRA = {
    "dra": {"resources": ["nvidia.com/gpu", "topo.dev/nic"], "exampleClaimTemplates": True,
            "extendedResources": ["nvidia.com/gpu"]},
    "config": {"flags": {"deviceListStrategy": "envvar"}},
}

DRA_NETDEV_ATTACH = {"dra": {"resources": ["nvidia.com/gpu", "topo.dev/nic"], "netdevAttach": "auto"}}

FABRIC_LABELS_NODE = {"fabricLabels": {"node": True}}
FABRIC_LABELS_NFD = {"fabricLabels": {"nfdFile": True}}
NRT = {"nrt": {"enabled": True, "kubeletConfig": "/etc/kubernetes/kubelet.yaml"}}

VALUE_SETS = {
    "default": {},
    "dra": DRA,
    "dra-netdev-attach": DRA_NETDEV_ATTACH,
    "fabric-labels-node": FABRIC_LABELS_NODE,
    "fabric-labels-nfd": FABRIC_LABELS_NFD,
    "nrt": NRT,
    "sharing-cdi": SHARING_CDI,
    "nic-pools": NIC_POOLS,
    "custom-kubelet-root": CUSTOM_KUBELET,
    "metrics-servicemonitor": METRICS,
    "kind-simulated": KIND_SIMULATED,
    "extras": EXTRAS,
}


CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass", "CustomResourceDefinition",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}


# ---- lint and strict decode of every value set ------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint(helm, tmp_path, name):
    vfile = write_values(tmp_path, VALUE_SETS[name])
    proc = run_helm(helm, "lint", str(CHART), "--strict", "--namespace", NAMESPACE, "-f", str(vfile))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_object_decodes_strictly(helm, decoder, tmp_path, name):
    rendered = render(helm, tmp_path, VALUE_SETS[name])
    proc = decode(decoder, rendered.text)
    assert proc.returncode == 0, f"chart-decode rejected the {name} manifests:\n{proc.stderr}"
    decoded = [json.loads(line) for line in proc.stdout.splitlines()]
    assert sorted(d["kind"] for d in decoded) == rendered.kinds()
    for d in decoded:
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["namespace"] == NAMESPACE, d
        else:
            assert not d.get("namespace"), d


# ---- the decoder really is strict ----------------------------------------------------------------


def test_decoder_rejects_a_misspelled_field_in_a_post_processed_manifest(helm, decoder, tmp_path):
    text = render(helm, tmp_path, {}).text
    assert decode(decoder, text).returncode == 0
    bad = text.replace("imagePullPolicy:", "imagePullPolicyy:", 1)
    assert bad != text
    proc = decode(decoder, bad)
    assert proc.returncode == 1
    assert 'unknown field "spec.template.spec.containers[0].imagePullPolicyy"' in proc.stderr


def test_decoder_is_case_sensitive_like_the_api_server(helm, decoder, tmp_path):
    text = render(helm, tmp_path, {}).text
    proc = decode(decoder, text.replace("containerPort:", "ContainerPort:", 1))
    assert proc.returncode == 1
    assert "ContainerPort" in proc.stderr


def test_decoder_rejects_a_typo_passed_through_values(helm, decoder, tmp_path):
    """extraVolumes are raw Kubernetes objects: the schema cannot check them, the decoder does."""
    values = {"extraVolumes": [{"name": "x", "hostPth": {"path": "/x"}}]}
    rendered = render(helm, tmp_path, values)  # helm itself accepts it
    proc = decode(decoder, rendered.text)
    assert proc.returncode == 1
    assert "hostPth" in proc.stderr


def test_decoder_rejects_unknown_kinds_bad_quantities_and_broken_references(decoder):
    manifest = """
apiVersion: example.com/v1
kind: Widget
metadata: {name: w}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: ds}
spec:
  selector: {matchLabels: {app: a}}
  template:
    metadata: {labels: {app: b}}
    spec:
      containers:
        - name: c
          image: i
          livenessProbe: {httpGet: {path: /healthz, port: metrics}}
          volumeMounts: [{name: missing, mountPath: /x}]
          resources: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: q}
data: {a: b}
binaryData: {c: "%%%not-base64"}
"""
    proc = decode(decoder, manifest)
    assert proc.returncode == 1
    err = proc.stderr
    assert "unknown kind Widget" in err
    assert "unknown kind Pod" not in err  # core/v1 Pod is known and valid enough
    assert "does not match the pod template labels" in err
    assert 'port "metrics" is not a named port' in err
    assert 'volumeMounts "missing": no volume of that name' in err
    assert "exceeds the limit" in err
    assert "ConfigMap/q" in err


# ---- what the default render contains ----------------------------------------------------------


@pytest.fixture(scope="module")
def default(helm, tmp_path_factory) -> Rendered:
    return render(helm, tmp_path_factory.mktemp("default"), {})


def test_default_objects(default):
    assert default.kinds() == ["ConfigMap", "DaemonSet", "ServiceAccount"]


def test_default_daemonset_scheduling(default):
    ds = default.get("DaemonSet")
    spec = default.pod_spec
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in spec["tolerations"]
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    assert "hostNetwork" not in spec
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_default_daemon_command_line(default):
    c = default.container
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert c["image"] == f"localhost/topo-device-plugin:{chart['appVersion']}"
    assert "command" not in c  # the image's ENTRYPOINT is topo-device-plugin
    assert c["args"] == [
        "serve",
        "--config=/etc/topo-device-plugin/config.yaml",
        "--kubelet-root-dir=/var/lib/kubelet",
        "--metrics-address=0.0.0.0:9400",
    ]


def test_default_mounts(default):
    c, spec = default.container, default.pod_spec
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert volumes["device-plugins"]["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert mounts["device-plugins"]["mountPath"] == "/var/lib/kubelet/device-plugins"
    assert not mounts["device-plugins"].get("readOnly")  # the daemon creates its sockets there
    assert volumes["sys"]["hostPath"]["path"] == "/sys" and mounts["sys"] == {
        "name": "sys", "mountPath": "/sys", "readOnly": True}
    assert "dev" not in volumes and all(m["mountPath"] != "/dev" for m in c["volumeMounts"])
    assert mounts["config"] == {"name": "config", "mountPath": "/etc/topo-device-plugin", "readOnly": True}
    assert volumes["config"]["configMap"]["name"] == default.get("ConfigMap")["metadata"]["name"]
    assert "emptyDir" in volumes["tmp"]  # the root filesystem is read-only
    hostpaths = sorted(v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v)
    assert hostpaths == ["/sys", "/var/lib/kubelet/device-plugins", "/var/lib/topo-device-plugin"]
    # GPU faults outlive a daemon restart there, and `health clear` writes the operator's clears there.
    assert volumes["gpu-health-state"]["hostPath"] == {"path": "/var/lib/topo-device-plugin",
                                                       "type": "DirectoryOrCreate"}
    assert mounts["gpu-health-state"]["mountPath"] == "/var/lib/topo-device-plugin"
    assert not mounts["gpu-health-state"].get("readOnly")


def test_default_security_context(default):
    sc = default.container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False


def test_default_probes_use_the_metrics_port(default):
    c = default.container
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_default_resources_are_set(default):
    res = default.container["resources"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert res == values["resources"]
    assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]
    assert "cpu" not in res["limits"]  # no CPU throttling of pod admission


def test_default_nvidia_env(default):
    env = {e["name"]: e.get("value") for e in default.container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "NODE_NAME" in env


def test_config_checksum_annotation_tracks_the_config(helm, tmp_path, default):
    def checksum(r: Rendered) -> str:
        return r.get("DaemonSet")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    config_text = default.get("ConfigMap")["data"]["config.yaml"]
    assert checksum(default) == hashlib.sha256(config_text.rstrip("\n").encode()).hexdigest()
    changed = render(helm, tmp_path, {"config": {"flags": {"logLevel": "debug"}}})
    assert checksum(changed) != checksum(default)
    same = render(helm, tmp_path, {"podLabels": {"a": "b"}})
    assert checksum(same) == checksum(default)


# ---- the rendered config is what the daemon accepts ------------------------------------------------


def _daemon_python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, env=env)


LOAD_CONFIG = """
import sys
from plugin.config import load_config
cfg = load_config(sys.argv[1])
print(sorted(cfg.flags), len(cfg.nic_resource_list))
"""


@pytest.mark.parametrize("name", ["default", "nic-pools", "metrics-servicemonitor", "sharing-cdi"])
def test_rendered_config_passes_the_daemons_own_validation(helm, tmp_path, name):
    config = render(helm, tmp_path, VALUE_SETS[name]).get("ConfigMap")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(config)
    proc = _daemon_python(LOAD_CONFIG, str(path))
    assert proc.returncode == 0, f"the daemon rejects the chart's config:\n{config}\n{proc.stderr}"


@pytest.mark.parametrize("name,node", [("default", "dgx-a100"), ("nic-pools", "pcie-2socket-4gpu-2nic")])
def test_rendered_config_drives_discover(helm, tmp_path, name, node):
    """End to end: the daemon's CLI takes the chart's config file (flags applied, exit 0)."""
    config = render(helm, tmp_path, VALUE_SETS[name]).get("ConfigMap")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(config)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "plugin", "discover", "--config", str(path), "--simulate", node],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_values_schema_flags_match_the_daemon_config_schema():
    """values.schema.json mirrors the daemon's config schema (flags from plugin/config/flags.py); drift fails here."""
    daemon = json.loads(_daemon_python("import json; from plugin.config import schema; print(json.dumps(schema()))").stdout)
    chart = json.loads((CHART / "values.schema.json").read_text())
    chart_config = chart["properties"]["config"]["properties"]
    chart_managed = {"kubeletRootDir", "devicePluginPath", "simulate", "metricsAddress", "cdiSpecDir", "draResources",
                     "fabricLabelsFile", "fabricLabelsNode", "netdevAttach", "nriSocket", "draToolkitCdi",
                     "nrt", "kubeletConfig"}
    # NVIDIA's own keys are for NVIDIA config files brought along unchanged, not for chart values.
    nvidia_only = set(json.loads(_daemon_python(
        "import json; from plugin.config.nvidia import FLAG_PROPERTIES as F; print(json.dumps(list(F)))").stdout))
    daemon_flags = {k: v for k, v in daemon["properties"]["flags"]["properties"].items() if k not in nvidia_only}
    assert set(chart_config["flags"]["properties"]) == set(daemon_flags) - chart_managed
    for key, spec in daemon_flags.items():
        if "enum" in spec and key not in chart_managed:
            assert chart_config["flags"]["properties"][key]["enum"] == spec["enum"], key
    # Chart-managed choices are chart values of their own, with the daemon's choices.
    assert chart["properties"]["dra"]["properties"]["netdevAttach"]["enum"] == daemon_flags["netdevAttach"]["enum"]
    assert chart["properties"]["dra"]["properties"]["toolkitCdi"]["enum"] == daemon_flags["draToolkitCdi"]["enum"]
    daemon_health = daemon["properties"]["gpus"]["properties"]["health"]["properties"]
    chart_health = chart_config["gpus"]["properties"]["health"]["properties"]
    assert set(chart_health) == set(daemon_health)
    assert set(chart_config) - {"existingConfigMap"} == set(daemon["properties"]) - {"version", "resources"}
    # NVIDIA's `imex:` section, as the daemon reads it (channel 0 for every GPU container).
    imex = {k: v for k, v in daemon["properties"]["imex"].items() if k != "description"}
    assert chart_config["imex"] == imex


# The daemon's NIC pool vocabulary, read through its public parser: an unknown key's error
# lists the accepted keys, so renaming a constant inside plugin.model.nic_pools does not blind the
# check. What cannot be read fails the test and names what moved (never a skip).
NIC_KEYS = """
import json, re, sys
from plugin.model import nic_pools as n

def accepted(raw):
    try:
        n.parse_pool_specs(raw, "probe.yaml")
    except Exception as e:
        m = re.search(r"use one of: ([^)]*)", str(e))
        return [k.strip() for k in m.group(1).split(",")] if m else str(e)
    return "the parser accepted an unknown key"

out = {"entry": accepted([{"resourceName": "a", "zzqqxx": 1, "selectors": {}}]),
       "selector": accepted([{"resourceName": "a", "selectors": {"zzqqxx": ["1"]}}]),
       "linkTypes": list(getattr(n, "LINK_TYPES", []) or []) or "plugin.model.nic_pools.LINK_TYPES",
       "policies": list(getattr(n, "POLICIES", []) or []) or "plugin.model.nic_pools.POLICIES"}

def parses(raw):
    try:
        n.parse_pool_specs(raw, "probe.yaml")
        return True
    except Exception as e:
        return str(e)

out["accepts"] = {"linkTypes": {t: parses([{"resourceName": "a", "selectors": {"linkTypes": [t]}}])
                                for t in json.loads(sys.argv[1])},
                  "policies": {p: parses([{"resourceName": "a", "allocationPolicy": p, "selectors": {}}])
                               for p in json.loads(sys.argv[2])}}
print(json.dumps(out))
"""


def _schema_at(schema: dict, *path: str):
    node = schema
    for i, key in enumerate(path):
        if not isinstance(node, dict) or key not in node:
            pytest.fail(f"values.schema.json has no {'/'.join(path[: i + 1])} (moved or renamed?): the NIC pool "
                        "drift check reads the chart's pool schema from there; update this test")
        node = node[key]
    return node


def test_values_schema_nic_pools_match_the_daemon():
    schema = json.loads((CHART / "values.schema.json").read_text())
    resource = _schema_at(schema, "definitions", "nicResource", "properties")
    selector = _schema_at(schema, "definitions", "nicSelector", "properties")
    link_enum = _schema_at(selector, "linkTypes", "items", "enum")
    policy_enum = _schema_at(resource, "allocationPolicy", "enum")
    proc = _daemon_python(NIC_KEYS, json.dumps(link_enum), json.dumps(policy_enum))
    assert proc.returncode == 0, f"cannot read the daemon's NIC pool keys (plugin.model.nic_pools moved?):\n{proc.stderr}"
    daemon = json.loads(proc.stdout)
    moved = {k: v for k, v in daemon.items() if isinstance(v, str)}
    assert not moved, f"the daemon's NIC pool vocabulary is not where this check reads it: {moved}"
    assert set(resource) == set(daemon["entry"])
    assert set(selector) == set(daemon["selector"])
    assert link_enum == daemon["linkTypes"]
    assert policy_enum == daemon["policies"]
    # Every value the chart accepts, the daemon's parser accepts.
    refused = {f"{k}={v}": why for k, d in daemon["accepts"].items() for v, why in d.items() if why is not True}
    assert not refused, refused


# ---- specific value sets --------------------------------------------------------------------------


def test_custom_kubelet_root_dir(helm, tmp_path):
    r = render(helm, tmp_path, CUSTOM_KUBELET)
    root = "/var/snap/microk8s/common/var/lib/kubelet"
    assert f"--kubelet-root-dir={root}" in r.container["args"]
    volumes = {v["name"]: v for v in r.pod_spec["volumes"]}
    assert volumes["device-plugins"]["hostPath"]["path"] == f"{root}/device-plugins"
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    assert mounts["device-plugins"]["mountPath"] == f"{root}/device-plugins"


def test_pod_resources_socket_is_mounted_read_only_when_the_option_is_on(helm, tmp_path):
    r = render(helm, tmp_path, {"kubeletRootDir": "/var/lib/k0s/kubelet", "config": {"flags": {"podResources": True}}})
    config = yaml.safe_load(r.get("ConfigMap")["data"]["config.yaml"])
    assert config["flags"]["podResources"] is True  # the daemon reads the option from its config file
    volumes = {v["name"]: v for v in r.pod_spec["volumes"]}
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    # The daemon dials <kubelet-root-dir>/pod-resources/kubelet.sock: same path inside, read-only.
    assert volumes["pod-resources"]["hostPath"] == {"path": "/var/lib/k0s/kubelet/pod-resources", "type": "Directory"}
    assert mounts["pod-resources"] == {"name": "pod-resources", "mountPath": "/var/lib/k0s/kubelet/pod-resources",
                                       "readOnly": True}
    assert "--kubelet-root-dir=/var/lib/k0s/kubelet" in r.container["args"]


def test_nic_pools(helm, tmp_path):
    r = render(helm, tmp_path, NIC_POOLS)
    config = yaml.safe_load(r.get("ConfigMap")["data"]["config.yaml"])
    assert config["version"] == "v1"
    assert config["nics"]["resourceList"] == NIC_POOLS["config"]["nics"]["resourceList"]
    assert config["flags"]["failOnInitError"] is False
    spec, c = r.pod_spec, r.container
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert {"name": "dev", "mountPath": "/dev", "readOnly": True} in c["volumeMounts"]
    assert not any(e["name"].startswith("NVIDIA_") for e in c["env"])


def test_cdi_strategy_mounts_the_hosts_cdi_dir_and_sharing_reaches_the_config(helm, tmp_path, default):
    r = render(helm, tmp_path, SHARING_CDI)
    volumes = {v["name"]: v for v in r.pod_spec["volumes"]}
    assert volumes["cdi"]["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}
    assert {"name": "cdi", "mountPath": "/var/run/cdi"} in r.container["volumeMounts"]  # writable: specs go there
    config = yaml.safe_load(r.get("ConfigMap")["data"]["config.yaml"])
    assert config["sharing"] == SHARING_CDI["config"]["sharing"]
    assert config["imex"] == {"channelIDs": [0], "required": False}  # NVIDIA's section, to the daemon as given
    assert "cdi" not in {v["name"] for v in default.pod_spec["volumes"]}  # envvar: no CDI dir
    (tmp_path / "a").mkdir()
    annotations = render(helm, tmp_path / "a", {"config": {"flags": {"deviceListStrategy": "cdi-annotations"}}})
    assert "cdi" in {v["name"] for v in annotations.pod_spec["volumes"]}


def test_metrics_service_and_servicemonitor(helm, tmp_path):
    r = render(helm, tmp_path, METRICS)
    assert r.kinds() == ["ConfigMap", "DaemonSet", "Namespace", "Service", "ServiceAccount", "ServiceMonitor"]
    svc, sm, ns = r.get("Service"), r.get("ServiceMonitor"), r.get("Namespace")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9500, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = r.get("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in svc["spec"]["selector"].items())
    assert all(svc["metadata"]["labels"][k] == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["endpoints"][0]["interval"] == "15s"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert "--metrics-address=0.0.0.0:9500" in r.container["args"]
    assert ns["metadata"]["name"] == NAMESPACE
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_kind_simulated(helm, tmp_path):
    r = render(helm, tmp_path, KIND_SIMULATED)
    c = r.container
    assert c["image"] == "localhost/topo-device-plugin:e2e" and c["imagePullPolicy"] == "Never"
    assert c["args"][-2:] == ["--simulate=dgx-a100", "--log-level=debug"]
    assert r.get("DaemonSet")["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "25%"}
    assert all(v["name"] != "sys" for v in r.pod_spec["volumes"])
    assert {"name": "TOPO_DP_TIME_BUDGET_MS", "value": "50"} in c["env"]


def test_extras(helm, tmp_path):
    r = render(helm, tmp_path, EXTRAS)
    assert r.kinds() == ["DaemonSet", "Service"]  # existing ConfigMap, existing ServiceAccount
    c, spec = r.container, r.pod_spec
    assert c["image"] == "localhost/topo-device-plugin@sha256:" + "ab" * 32
    assert c["securityContext"]["privileged"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is True
    assert r.get("DaemonSet")["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert spec["serviceAccountName"] == "custom-sa"
    assert spec["runtimeClassName"] == "nvidia"
    assert "--metrics-address=[::]:9400" in c["args"]
    assert {v["name"]: v for v in spec["volumes"]}["config"]["configMap"]["name"] == "my-topo-config"


def test_image_tag_value_and_packaged_chart(helm, tmp_path):
    """What `helm install ... --set image.tag=X` gets, from the packaged chart as a user would."""
    proc = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    tgz = next(tmp_path.glob("topo-device-plugin-*.tgz"))
    proc = run_helm(helm, "template", RELEASE, str(tgz), "-n", NAMESPACE, "--set", "image.tag=1.2.3-rc.1")
    assert proc.returncode == 0, proc.stderr
    ds = [o for o in yaml.safe_load_all(proc.stdout) if o and o["kind"] == "DaemonSet"][0]
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":1.2.3-rc.1")
    # --set turns digits into an integer; the tag must still render as a string.
    proc = run_helm(helm, "template", RELEASE, str(tgz), "--set", "image.tag=20261122")
    assert proc.returncode == 0, proc.stderr
    assert 'image: "localhost/topo-device-plugin:20261122"' in proc.stdout


# ---- the schema rejects bad values ----------------------------------------------------------------

BAD_VALUES = [
    ("--set", "config.flags.allocationPolicy=fastest", "/config/flags/allocationPolicy"),
    ("--set", "config.flags.deviceIdStrategy=serial", "/config/flags/deviceIdStrategy"),
    ("--set", "config.flags.kubeletRootDir=/x", "kubeletRootDir"),  # the chart owns this flag
    ("--set", "config.flags.logLevell=debug", "logLevell"),
    ("--set-json", 'config.flags.deviceListStrategy=["envvar","volume-mounts"]', "/config/flags/deviceListStrategy"),
    ("--set", "kubeletRootDir=var/lib/kubelet", "/kubeletRootDir"),
    ("--set", "tolerration=x", "tolerration"),
    ("--set", "updateStrategy.type=Recreate", "/updateStrategy/type"),
    ("--set", "updateStrategy.rollingUpdate.maxUnavailable=0", "/updateStrategy/rollingUpdate/maxUnavailable"),
    ("--set", "updateStrategy.rollingUpdate.maxSurge=1", "maxSurge"),
    ("--set", "resources.limits.memory=12Gx", "/resources/limits/memory"),
    ("--set", "metrics.port=70000", "/metrics/port"),
    ("--set", "metrics.serviceMonitor.interval=30 seconds", "/metrics/serviceMonitor/interval"),
    ("--set", "image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("--set", "image.digest=sha256:abc", "/image/digest"),
    ("--set", "privileges.privileged=yes", "/privileges/privileged"),
    ("--set-json", 'privileges.capabilities=["ALL"]', "/privileges/capabilities"),
    ("--set-json", 'config.nics.resourceList=[{"resourceName":"a/b"}]', "/config/nics/resourceList/0/resourceName"),
    ("--set-json", 'config.nics.resourceList=[{"selectors":[]}]', "resourceName"),
    ("--set-json", 'config.nics.resourceList=[{"resourceName":"a","selectors":{"vendor":["15b3"]}}]', "vendor"),
    ("--set-json", 'config.nics.resourceList=[{"resourceName":"a"}]', "selectors"),
    ("--set-json", 'config.nics.resourceList=[{"resourceName":"a","selectors":[]}]', "selectors"),
    ("--set-json", 'config.nics.resourceList=[{"resourceName":"a","selectors":{"pKeys":["0x1"]}}]', "pKeys"),
    ("--set-json", 'config.nics.resourceList=[{"resourceName":"a","deviceType":"accelerator","selectors":{}}]',
     "deviceType"),
    ("--set-json", 'config.nics.resourceList=[{"resourceName":"a","resourcePrefix":"x.kubernetes.io","selectors":{}}]',
     "resourcePrefix"),
    ("--set-json", 'config.gpus.health.ignoredXids=["13"]', "/config/gpus/health/ignoredXids/0"),
    ("--set", "securityContext.runAsUser=-1", "/securityContext/runAsUser"),
    ("--set", "nameOverride=Bad_Name", "/nameOverride"),
    ("--set", "dra.resources=nvidia.com/gpu", "/dra/resources"),  # a list, not a string
    ("--set-json", 'dra.resources=["nvidia.com/gpu","nvidia.com/gpu"]', "/dra/resources"),
    ("--set-json", 'dra.resources=["Bad Name"]', "/dra/resources/0"),
    ("--set", "dra.driverName=x.dev", "driverName"),  # fixed in the daemon
    ("--set", "config.flags.draResources=nvidia.com/gpu", "draResources"),  # the chart owns this flag
    ("--set", "config.flags.fabricLabelsFile=/x/clique", "fabricLabelsFile"),  # fabricLabels.nfdFile owns it
    ("--set", "fabricLabels.nfdFeaturesDir=relative/dir", "/fabricLabels/nfdFeaturesDir"),
    ("--set", "dra.netdevAttach=on", "/dra/netdevAttach"),
    ("--set", "dra.nriSocket=nri.sock", "/dra/nriSocket"),
    ("--set", "config.flags.netdevAttach=auto", "netdevAttach"),  # dra.netdevAttach owns it (and the privileges)
    ("--set", "config.flags.draGpuShares=2.5", "draGpuShares"),  # a count of shares
    ("--set", "config.flags.draGpuShares=2000", "draGpuShares"),  # at most 1024
]


@pytest.mark.parametrize("flag,value,where", BAD_VALUES, ids=[v for _, v, _ in BAD_VALUES])
def test_schema_rejects_bad_values(helm, flag, value, where):
    proc = run_helm(helm, "template", RELEASE, str(CHART), flag, value)
    assert proc.returncode != 0, f"{value} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert where in proc.stderr, proc.stderr


def test_lint_fails_on_bad_values(helm, tmp_path):
    vfile = write_values(tmp_path, {"config": {"flags": {"allocationPolicy": "fastest"}}})
    proc = run_helm(helm, "lint", str(CHART), "-f", str(vfile))
    assert proc.returncode != 0
    assert "allocationPolicy" in proc.stdout + proc.stderr


def test_schema_works_offline():
    """Helm must not fetch the meta-schema: only draft-07 and no remote $ref."""
    text = (CHART / "values.schema.json").read_text()
    schema = json.loads(text)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert not re.search(r'"\$ref":\s*"(?!#)', text)


# ---- NOTES.txt ------------------------------------------------------------------------------------


def render_notes(helm: str, tmp_path: Path, values: dict[str, Any]) -> str:
    """`helm template` skips NOTES.txt and `helm install --dry-run` needs a cluster, so a
    copy of the chart renders it through `tpl` inside a throwaway ConfigMap."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    chart = work / "chart"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.tmpl")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes.tmpl") . | quote }}\n'
    )
    vfile = write_values(work, values)
    proc = run_helm(helm, "template", RELEASE, str(chart), "-n", NAMESPACE, "-f", str(vfile),
                    "--show-only", "templates/zz-notes.yaml")
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["data"]["notes"]


def test_notes(helm, tmp_path):
    notes = render_notes(helm, tmp_path, {})
    assert f"kubectl -n {NAMESPACE} rollout status daemonset/{RELEASE}-topo-device-plugin" in notes
    assert "nvidia\\.com/gpu" in notes
    assert "WARNING" not in notes
    notes = render_notes(helm, tmp_path, {**KIND_SIMULATED, **CUSTOM_KUBELET, "privileges": {"privileged": True}})
    assert "SIMULATED" in notes and "privileged=true" in notes
    assert "/var/snap/microk8s/common/var/lib/kubelet/device-plugins" in notes


# ---- README ------------------------------------------------------------------------------------------


def test_readme_is_up_to_date(helm):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chart_docs.py"), "--check", "--helm", helm],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"


def test_values_are_documented():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import chart_docs
    finally:
        sys.path.pop(0)
    text = (CHART / "values.yaml").read_text()
    documented = {".".join(d.path) for d in chart_docs.parse_docs(text)}
    values = yaml.safe_load(text)
    for key, value in values.items():
        children = any(d.startswith(key + ".") for d in documented)
        assert key in documented or children, f"values.yaml key {key!r} has no '# --' comment"
    schema = json.loads((CHART / "values.schema.json").read_text())

    def in_schema(path: list[str]) -> bool:
        node = schema
        for key in path:
            node = node.get("properties", {}).get(key)
            if node is None:
                return False
        return True

    missing = [d for d in documented if not in_schema(d.split("."))]
    assert not missing, f"documented but not in values.schema.json: {missing}"


def test_chart_app_version_matches_the_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    assert chart["appVersion"] == version


def test_chart_claims_the_tested_kubernetes_versions_only(helm):
    """The chart's kubeVersion floor is the oldest tested line (tests/kubelet/k8s_versions.json), so `helm
    install` refuses an older cluster with helm's message instead of deploying what nothing here proved;
    the tested lines render."""
    lines = json.loads((ROOT / "tests" / "kubelet" / "k8s_versions.json").read_text())
    tested = sorted((lines[n]["kubernetes"].lstrip("v") for n in lines if isinstance(lines[n], dict)),
                    key=lambda v: tuple(int(x) for x in v.split(".")))
    oldest_minor = ".".join(tested[0].split(".")[:2])
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={oldest_minor}.0-0"
    for version in tested:
        proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", version)
        assert proc.returncode == 0, f"{version}: {proc.stderr}"
    major, minor = (int(x) for x in oldest_minor.split("."))
    older = f"{major}.{minor - 1}.0"
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", older)
    assert proc.returncode != 0 and f"chart requires kubeVersion: >={oldest_minor}.0-0" in proc.stderr, proc.stderr


# ---- DRA ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dra(helm, tmp_path_factory) -> Rendered:
    return render(helm, tmp_path_factory.mktemp("dra"), DRA)


def _by_name(r: Rendered, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in r.objects if o["kind"] == kind}


def test_dra_objects(dra):
    assert dra.kinds() == sorted(["ConfigMap", "DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                                  "DeviceClass", "DeviceClass", "ResourceClaimTemplate", "ResourceClaimTemplate",
                                  "ResourceClaimTemplate", "ValidatingAdmissionPolicy",
                                  "ValidatingAdmissionPolicyBinding"])
    assert set(_by_name(dra, "DeviceClass")) == {"gpu.topo.dev", "nic.topo.dev"}
    assert set(_by_name(dra, "ResourceClaimTemplate")) == {"one-gpu", "two-gpu-nic-pairs", "four-gpu-nvlink"}


def test_dra_daemon_gets_its_option_identity_token_and_kubelet_directories(dra):
    c, spec = dra.container, dra.pod_spec
    assert "--dra-resources=nvidia.com/gpu,topo.dev/nic" in c["args"]
    assert spec["automountServiceAccountToken"] is True
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    for name, path in {"plugins-registry": "/var/lib/kubelet/plugins_registry",
                       "plugins": "/var/lib/kubelet/plugins", "cdi": "/var/run/cdi"}.items():
        assert volumes[name] == mounts[name] == path, name


def test_dra_rbac_is_what_the_driver_calls(dra):
    """The API calls of plugin/kube/client.py, and nothing more."""
    role = dra.get("ClusterRole")
    rules = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert rules == {("", "nodes"): {"get"}, ("resource.k8s.io", "resourceclaims"): {"get"},
                     ("resource.k8s.io", "resourceslices"): {"get", "list", "watch", "create", "update", "delete"}}
    binding = dra.get("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": dra.get("ServiceAccount")["metadata"]["name"],
                                    "namespace": NAMESPACE}]


def test_dra_without_netdev_attach_gets_no_network_privileges(dra):
    c, spec = dra.container, dra.pod_spec
    assert "--netdev-attach=off" in c["args"] and not any(a.startswith("--nri-socket") for a in c["args"])
    assert "hostNetwork" not in spec
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not {"nri", "netns"} & {v["name"] for v in spec["volumes"]}


@pytest.mark.parametrize("values", [
    {"dra": {"resources": ["nvidia.com/gpu"], "netdevAttach": "auto"}},  # GPU-only: no NIC to move
    {"dra": {"netdevAttach": "auto"}},  # no DRA at all
])
def test_netdev_attach_is_inert_without_a_nic_served_through_dra(helm, tmp_path, values):
    r = render(helm, tmp_path, values)
    c, spec = r.container, r.pod_spec
    assert not any(a.startswith(("--nri-socket", "--netdev-attach=auto")) for a in c["args"])
    assert "hostNetwork" not in spec and "add" not in c["securityContext"]["capabilities"]
    assert not {"nri", "netns"} & {v["name"] for v in spec["volumes"]}


def test_netdev_attach_gets_the_host_network_the_capabilities_the_sockets_and_claim_status(helm, tmp_path):
    r = render(helm, tmp_path, {**DRA_NETDEV_ATTACH, "privileges": {"capabilities": ["NET_ADMIN", "IPC_LOCK"]}})
    c, spec = r.container, r.pod_spec
    assert {"--netdev-attach=auto", "--nri-socket=/var/run/nri/nri.sock"} <= set(c["args"])
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["NET_ADMIN", "IPC_LOCK", "SYS_ADMIN"]}
    assert c["securityContext"]["privileged"] is False
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert volumes["nri"] == {"path": "/var/run/nri", "type": "DirectoryOrCreate"}
    assert mounts["nri"]["mountPath"] == "/var/run/nri"
    assert volumes["netns"] == {"path": "/var/run/netns", "type": "DirectoryOrCreate"}
    assert (mounts["netns"]["mountPath"], mounts["netns"]["mountPropagation"], mounts["netns"]["readOnly"]) == (
        "/var/run/netns", "HostToContainer", True)
    rules = {(g, res): set(rule["verbs"]) for rule in r.get("ClusterRole")["rules"]
             for g in rule["apiGroups"] for res in rule["resources"]}
    assert rules[("resource.k8s.io", "resourceclaims/status")] == {"patch"}
    # 1.36+: writing a driver's status.devices entries also takes resourceclaims/driver for that driver, from
    # the claim's own node only (k8s.io/kubernetes pkg/registry/resource/utils.go AuthorizedForDeviceStatus).
    [driver_rule] = [rule for rule in r.get("ClusterRole")["rules"] if rule["resources"] == ["resourceclaims/driver"]]
    assert driver_rule == {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                           "resourceNames": ["topo.dev"], "verbs": ["associated-node:patch"]}
    moved = render(helm, tmp_path, {"dra": {**DRA_NETDEV_ATTACH["dra"], "nriSocket": "/run/nri/custom.sock",
                                            "netnsDir": "/run/containerd/netns"}})
    assert "--nri-socket=/run/nri/custom.sock" in moved.container["args"]
    assert {v["name"]: v["hostPath"]["path"] for v in moved.pod_spec["volumes"] if "hostPath" in v}["netns"] == \
        "/run/containerd/netns"


def test_dra_device_classes_select_our_driver_and_kind(dra):
    for name, dc in _by_name(dra, "DeviceClass").items():
        kind = name.split(".")[0]
        expr = dc["spec"]["selectors"][0]["cel"]["expression"]
        assert expr == f'device.driver == "topo.dev" && device.attributes["topo.dev"].type == "{kind}"'


def test_dra_gpu_class_maps_the_extended_resource_and_the_nic_class_does_not(dra):
    """Unchanged pods asking for nvidia.com/gpu get a claim of gpu.topo.dev (KEP-5004); NICs were not listed."""
    classes = _by_name(dra, "DeviceClass")
    assert classes["gpu.topo.dev"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["nic.topo.dev"]["spec"]


@pytest.mark.parametrize("values, want", [
    # the one NIC resource through DRA
    ({"dra": {"resources": ["topo.dev/nic"], "extendedResources": ["topo.dev/nic"]}},
     {"nic.topo.dev": "topo.dev/nic"}),
    # the GPU resource renamed by an extra argument, as the daemon takes it
    ({"dra": {"resources": ["example.com/gpu"], "extendedResources": ["example.com/gpu"]},
      "extraArgs": ["--gpu-resource-name=example.com/gpu"]},
     {"gpu.topo.dev": "example.com/gpu"}),
    # nothing listed: no class maps a name
    ({"dra": {"resources": ["nvidia.com/gpu", "topo.dev/nic"]}}, {}),
], ids=["nic", "renamed-gpu", "none"])
def test_dra_extended_resources_map_the_class_of_their_kind(helm, tmp_path, values, want):
    r = render(helm, tmp_path, values)
    got = {n: o["spec"]["extendedResourceName"] for n, o in _by_name(r, "DeviceClass").items()
           if "extendedResourceName" in o["spec"]}
    assert got == want


TWO_NIC_POOLS = {"config": {"nics": {"resourceList": [
    {"resourceName": "rdma_a", "resourcePrefix": "example.com", "selectors": {"vendors": ["15b3"]}},
    {"resourceName": "rdma_b", "resourcePrefix": "example.com", "selectors": {"vendors": ["8086"]}}]}}}


@pytest.mark.parametrize("values, says", [
    ({"dra": {"resources": ["topo.dev/nic"], "extendedResources": ["nvidia.com/gpu"]}},
     "dra.extendedResources: 'nvidia.com/gpu' is not served through DRA here (dra.resources: [topo.dev/nic]): "
     "the device plugin serves it and the node advertises it, and a node serves a name one way only (fix: add "
     "nvidia.com/gpu to dra.resources, or remove it from dra.extendedResources)"),
    ({"dra": {"extendedResources": ["nvidia.com/gpu"]}},
     "dra.extendedResources: 'nvidia.com/gpu' is not served through DRA here (dra.resources: [])"),
    ({"dra": {"resources": ["nvidia.com/gpu"], "extendedResources": ["nvidia.com/gpu"], "deviceClasses": False}},
     "dra.extendedResources: needs dra.deviceClasses true"),
    ({**TWO_NIC_POOLS, "dra": {"resources": ["example.com/rdma_a", "example.com/rdma_b"],
                               "extendedResources": ["example.com/rdma_a"]}},
     "dra.extendedResources: 'example.com/rdma_a' cannot be mapped while 2 NIC resources are served through DRA "
     "(example.com/rdma_a, example.com/rdma_b): the DeviceClass nic.topo.dev holds every NIC the driver publishes"),
    # the config is not the chart's, but the mapping is: still judged
    ({"config": {"existingConfigMap": "mine"},
      "dra": {"resources": ["topo.dev/nic"], "extendedResources": ["nvidia.com/gpu"]}},
     "dra.extendedResources: 'nvidia.com/gpu' is not served through DRA here"),
], ids=["device-plugin-name", "dra-off", "no-classes", "two-nic-pools", "existing-configmap"])
def test_dra_extended_resource_mapping_refusals(helm, tmp_path, values, says):
    """A node serves a name one way: the chart maps only names it serves through DRA, with a class
    that holds only their devices."""
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "-f", str(write_values(tmp_path, values)))
    assert proc.returncode != 0
    assert says in proc.stderr, proc.stderr


def test_dra_example_claims_ask_for_pairs_and_nvlink(dra):
    t = {n: o["spec"]["spec"]["devices"] for n, o in _by_name(dra, "ResourceClaimTemplate").items()}
    assert t["one-gpu"]["requests"] == [{"name": "gpu", "exactly": {"deviceClassName": "gpu.topo.dev"}}]
    pairs = t["two-gpu-nic-pairs"]
    assert [(r["name"], r["exactly"]["deviceClassName"]) for r in pairs["requests"]] == [
        ("gpu-a", "gpu.topo.dev"), ("nic-a", "nic.topo.dev"), ("gpu-b", "gpu.topo.dev"), ("nic-b", "nic.topo.dev")]
    assert {"requests": ["gpu-a", "nic-a"], "matchAttribute": "topo.dev/pcieSwitch"} in pairs["constraints"]
    assert {"requests": ["gpu-b", "nic-b"], "matchAttribute": "topo.dev/pcieSwitch"} in pairs["constraints"]
    four = t["four-gpu-nvlink"]
    assert four["requests"][0]["exactly"]["count"] == 4
    assert four["constraints"] == [{"requests": ["gpus"], "matchAttribute": "topo.dev/nvlinkDomain"}]


def test_dra_off_by_default(default):
    assert not any(o["kind"] in ("ClusterRole", "DeviceClass", "ResourceClaimTemplate") for o in default.objects)
    assert not any(a.startswith("--dra-resources") for a in default.container["args"])


@pytest.mark.parametrize("how", [{"config": {"flags": {"draMig": "dynamic"}}},
                                 {"extraArgs": ["--dra-mig=static"]}], ids=["config", "extra-args"])
def test_dra_mig_adds_a_device_class_for_mig_devices(helm, tmp_path, how):
    r = render(helm, tmp_path, {"dra": {"resources": ["nvidia.com/gpu"]}, **how})
    classes = _by_name(r, "DeviceClass")
    assert set(classes) == {"gpu.topo.dev", "nic.topo.dev", "mig.topo.dev"}
    [sel] = classes["mig.topo.dev"]["spec"]["selectors"]
    assert sel["cel"]["expression"] == 'device.driver == "topo.dev" && device.attributes["topo.dev"].type == "mig"'


@pytest.mark.parametrize("how", [{"config": {"flags": {"draImexChannels": 2}}},
                                 {"extraArgs": ["--dra-imex-channels=1"]}], ids=["config", "extra-args"])
def test_dra_imex_channels_add_a_device_class_for_the_channels(helm, tmp_path, how):
    """Host-managed IMEX: a claim names `imex-channel.topo.dev` for a channel (the daemon publishes them as
    type `imex-channel`), as it names gpu.topo.dev for a GPU."""
    r = render(helm, tmp_path, {"dra": {"resources": ["nvidia.com/gpu"]}, **how})
    classes = _by_name(r, "DeviceClass")
    assert set(classes) == {"gpu.topo.dev", "nic.topo.dev", "imex-channel.topo.dev"}
    [sel] = classes["imex-channel.topo.dev"]["spec"]["selectors"]
    assert sel["cel"]["expression"] == \
        'device.driver == "topo.dev" && device.attributes["topo.dev"].type == "imex-channel"'
    assert "extendedResourceName" not in classes["imex-channel.topo.dev"]["spec"]


@pytest.mark.parametrize("values", [
    {"dra": {"resources": ["nvidia.com/gpu"]}, "config": {"flags": {"draImexChannels": 0}}},
    {"dra": {"resources": ["nvidia.com/gpu"]}, "extraArgs": ["--dra-imex-channels=0"]},
    {"dra": {"resources": ["nvidia.com/gpu"], "deviceClasses": False}, "config": {"flags": {"draImexChannels": 2}}},
], ids=["zero", "zero-extra-args", "no-classes"])
def test_no_imex_channel_class_without_channels_or_classes(helm, tmp_path, values):
    r = render(helm, tmp_path, values)
    assert "imex-channel.topo.dev" not in _by_name(r, "DeviceClass")


def test_dra_without_example_templates(helm, tmp_path):
    r = render(helm, tmp_path, {"dra": {"resources": ["nvidia.com/gpu"], "deviceClasses": False}})
    assert not any(o["kind"] in ("DeviceClass", "ResourceClaimTemplate") for o in r.objects)
    assert r.get("ClusterRole")


# ---- the fabric clique label (fabricLabels) ---------------------------------------------------------


def test_fabric_labels_off_by_default(default):
    assert not any(a.startswith("--fabric-labels") for a in default.container["args"])
    assert default.pod_spec["automountServiceAccountToken"] is False
    assert "nfd-features" not in {v["name"] for v in default.pod_spec["volumes"]}


def test_fabric_labels_node_gets_a_token_and_only_get_patch_on_nodes(helm, tmp_path):
    r = render(helm, tmp_path, FABRIC_LABELS_NODE)
    assert "--fabric-labels-node" in r.container["args"]
    assert not any(a.startswith("--fabric-labels-file") for a in r.container["args"])
    assert r.pod_spec["automountServiceAccountToken"] is True
    env = {e["name"]: e for e in r.container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    role = r.get("ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = r.get("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": r.get("ServiceAccount")["metadata"]["name"],
                                    "namespace": NAMESPACE}]
    assert "nfd-features" not in {v["name"] for v in r.pod_spec["volumes"]}


def test_fabric_labels_nfd_file_mounts_features_d_and_needs_no_api(helm, tmp_path):
    r = render(helm, tmp_path, FABRIC_LABELS_NFD)
    features = "/etc/kubernetes/node-feature-discovery/features.d"
    assert f"--fabric-labels-file={features}/topo-device-plugin-clique" in r.container["args"]
    assert "--fabric-labels-node" not in r.container["args"]
    volumes = {v["name"]: v["hostPath"] for v in r.pod_spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    assert volumes["nfd-features"] == {"path": features, "type": "DirectoryOrCreate"}
    assert mounts["nfd-features"]["mountPath"] == features and not mounts["nfd-features"].get("readOnly")
    assert r.pod_spec["automountServiceAccountToken"] is False
    assert not any(o["kind"] in ("ClusterRole", "ClusterRoleBinding") for o in r.objects)


def test_fabric_labels_nfd_dir_is_configurable(helm, tmp_path):
    r = render(helm, tmp_path, {"fabricLabels": {"nfdFile": True, "nfdFeaturesDir": "/opt/nfd/features.d/"}})
    assert "--fabric-labels-file=/opt/nfd/features.d/topo-device-plugin-clique" in r.container["args"]
    assert {v["name"]: v["hostPath"]["path"] for v in r.pod_spec["volumes"] if "hostPath" in v}[
        "nfd-features"] == "/opt/nfd/features.d/"


@pytest.mark.parametrize("values,mounted", [
    ({"dra": {"resources": ["nvidia.com/gpu"], "toolkitCdi": "uuid"}}, True),
    ({"dra": {"resources": ["nvidia.com/gpu"], "toolkitCdi": "uuid"},
      "config": {"flags": {"toolkitCdiDirs": ["/var/run/cdi"]}}}, False),  # the spec is read where we write ours
    ({"config": {"flags": {"deviceListStrategy": "cdi-cri", "cdiSpecs": "external"}}}, True),
    ({"config": {"flags": {"deviceListStrategy": "cdi-cri"}}}, False),  # our own specs: nothing of the toolkit's read
    ({"dra": {"resources": ["nvidia.com/gpu"]}}, False),  # toolkitCdi off
])
def test_the_toolkits_cdi_dir_is_mounted_read_only_exactly_when_its_spec_is_read(helm, tmp_path, values, mounted):
    r = render(helm, tmp_path, values)
    volumes = {v["name"]: v for v in r.pod_spec["volumes"]}
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    assert ("toolkit-cdi" in volumes) is mounted and ("toolkit-cdi" in mounts) is mounted
    if mounted:
        assert volumes["toolkit-cdi"]["hostPath"] == {"path": "/etc/cdi", "type": "DirectoryOrCreate"}
        assert mounts["toolkit-cdi"] == {"name": "toolkit-cdi", "mountPath": "/etc/cdi", "readOnly": True}
    dra_on = bool(values.get("dra"))
    toolkit = values.get("dra", {}).get("toolkitCdi", "off")
    assert (f"--dra-toolkit-cdi={toolkit}" in r.container["args"]) is dra_on


def test_mps_root_is_mounted_at_the_hosts_path_when_set(helm, tmp_path):
    """sharing.mps: the Allocate answers name host paths under mpsRoot, so the daemon must see them there."""
    r = render(helm, tmp_path, {"config": {"flags": {"mpsRoot": "/run/nvidia/mps"}}})
    volumes = {v["name"]: v["hostPath"] for v in r.pod_spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    assert volumes["mps-root"] == {"path": "/run/nvidia/mps", "type": "DirectoryOrCreate"}
    assert mounts["mps-root"]["mountPath"] == "/run/nvidia/mps" and not mounts["mps-root"].get("readOnly")
    assert volumes["mps-shm"]["path"] == "/run/nvidia/mps/shm" and mounts["mps-shm"]["mountPath"] == "/dev/shm"
    plain = render(helm, tmp_path, {})
    assert "mps-root" not in {v["name"] for v in plain.pod_spec["volumes"]}
    mps = render(helm, tmp_path, {"config": {"sharing": {"mps": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4}]}}}})  # NVIDIA's config: the daemon's default root
    assert {v["name"]: v["hostPath"] for v in mps.pod_spec["volumes"] if "hostPath" in v}["mps-root"] == {
        "path": "/run/nvidia/mps", "type": "DirectoryOrCreate"}


@pytest.mark.parametrize("values, caps", [
    ({}, "utility"),
    ({"config": {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}}, "utility,compute"),
    ({"dra": {"resources": ["nvidia.com/gpu"]}}, "utility,compute"),
    ({"config": {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
      "nvidia": {"driverCapabilities": "compute,utility"}}, "compute,utility"),
    ({"config": {"sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}},
      "nvidia": {"driverCapabilities": "all"}}, "all"),
])
def test_mps_asks_the_nvidia_runtime_for_compute(helm, tmp_path, values, caps):
    """The NVIDIA runtime puts nvidia-cuda-mps-control and nvidia-cuda-mps-server (and libcuda) into a container
    only for the `compute` capability: without it the daemon's MPS control program would not be there."""
    env = {e["name"]: e.get("value") for e in render(helm, tmp_path, values).container["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == caps


# ---- nrt.enabled: the NodeResourceTopology publisher, and the own-node admission policy --------------------------


def test_nrt_off_by_default(default):
    assert "--nrt" not in default.container["args"]
    assert not any(o["kind"] in ("CustomResourceDefinition", "ValidatingAdmissionPolicy") for o in default.objects)


def test_nrt_gets_its_option_a_token_the_kubelet_config_and_pod_resources_read_only(helm, tmp_path):
    r = render(helm, tmp_path, NRT)
    assert "--nrt" in r.container["args"]
    assert "--kubelet-config=/etc/kubernetes/kubelet.yaml" in r.container["args"]
    assert r.pod_spec["automountServiceAccountToken"] is True
    volumes = {v["name"]: v for v in r.pod_spec["volumes"]}
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    assert volumes["kubelet-config"]["hostPath"] == {"path": "/etc/kubernetes/kubelet.yaml", "type": "File"}
    assert mounts["kubelet-config"] == {"name": "kubelet-config", "mountPath": "/etc/kubernetes/kubelet.yaml",
                                        "readOnly": True}
    assert mounts["pod-resources"]["readOnly"] is True
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"


def test_nrt_rbac_is_what_the_publisher_calls(helm, tmp_path):
    r = render(helm, tmp_path, NRT)
    role = _by_name(r, "ClusterRole")[f"{RELEASE}-topo-device-plugin-nrt"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                             {"apiGroups": ["topology.node.k8s.io"], "resources": ["noderesourcetopologies"],
                              "verbs": ["get", "create", "update", "delete"]}]


def test_nrt_crd_is_kept_on_uninstall_and_matches_what_the_publisher_writes(helm, tmp_path):
    """The CRD the chart installs accepts the object the builder makes (its schema, checked with jsonschema)."""
    import jsonschema

    from plugin.model.resources import ResourceOptions, build_resources
    from plugin.nrt.build import TopologyManagerSettings, build_nrt, published_resources
    from plugin.sources.simulated import load_simulated

    crd = render(helm, tmp_path, NRT).get("CustomResourceDefinition")
    assert crd["metadata"]["name"] == "noderesourcetopologies.topology.node.k8s.io"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["spec"]["scope"] == "Cluster"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha2" and version["storage"] is True
    topology = load_simulated("dgx-h100")
    obj = build_nrt("n1", topology, published_resources(build_resources(topology, ResourceOptions())), (),
                    TopologyManagerSettings("single-numa-node", "container"))
    jsonschema.validate(obj, version["schema"]["openAPIV3Schema"])


def test_nrt_crd_can_be_left_to_another_installer(helm, tmp_path):
    r = render(helm, tmp_path, {"nrt": {"enabled": True, "installCRD": False}})
    assert not any(o["kind"] == "CustomResourceDefinition" for o in r.objects)


@pytest.mark.parametrize("values", [NRT, FABRIC_LABELS_NODE, DRA], ids=["nrt", "fabric-labels-node", "dra"])
def test_own_node_policy_binds_the_daemons_token_to_its_node(helm, tmp_path, values):
    r = render(helm, tmp_path, values)
    policy = r.get("ValidatingAdmissionPolicy")
    binding = r.get("ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    sa = f"{RELEASE}-topo-device-plugin"  # the daemon's account (nrt.enabled adds the uninstall hook's own)
    assert sa in _by_name(r, "ServiceAccount")
    assert policy["spec"]["matchConditions"] == [
        {"name": "our-daemon", "expression": f'request.userInfo.username == "system:serviceaccount:{NAMESPACE}:{sa}"'}]
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = {rule["resources"][0]: rule for rule in policy["spec"]["matchConstraints"]["resourceRules"]}
    assert set(rules) == {"resourceslices", "noderesourcetopologies", "nodes"}
    assert rules["nodes"]["operations"] == ["UPDATE"]
    text = json.dumps(policy["spec"])
    assert "authentication.kubernetes.io/node-name" in text and "nvidia.com/gpu.clique" in text


def test_own_node_policy_can_be_turned_off_and_is_absent_without_api_access(helm, tmp_path, default):
    assert not any(o["kind"].startswith("ValidatingAdmissionPolicy") for o in default.objects)
    r = render(helm, tmp_path, {**NRT, "nodeRestriction": {"enabled": False}})
    assert not any(o["kind"].startswith("ValidatingAdmissionPolicy") for o in r.objects)


def test_nrt_uninstall_runs_a_post_delete_cleanup_with_only_list_and_delete(helm, tmp_path):
    """The stopping daemons lose their account with the release; the hook Job deletes our objects after."""
    r = render(helm, tmp_path, NRT)
    job = r.get("Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-delete"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "plugin.nrt.cleanup"]
    role = _by_name(r, "ClusterRole")[f"{RELEASE}-topo-device-plugin-nrt-cleanup"]
    assert role["rules"] == [{"apiGroups": ["topology.node.k8s.io"], "resources": ["noderesourcetopologies"],
                              "verbs": ["list", "delete"]}]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == f"{RELEASE}-topo-device-plugin-nrt-cleanup"


# ---- dra.imexHost: the host's IMEX control program and socket for the readiness check --------------------------

IMEX_DRA = {"dra": {"resources": ["nvidia.com/gpu"]}, "config": {"flags": {"draImexChannels": 2}}}


def _imex_mounts(r: Rendered) -> tuple[dict[str, Any], dict[str, Any]]:
    volumes = {v["name"]: v.get("hostPath") for v in r.pod_spec["volumes"]}
    mounts = {m["name"]: m for m in r.container["volumeMounts"]}
    return ({k: v for k, v in volumes.items() if k.startswith("imex-")},
            {k: v for k, v in mounts.items() if k.startswith("imex-")})


def test_imex_channels_on_a_real_node_mount_the_hosts_control_program_and_socket(helm, tmp_path):
    """Our image has no nvidia-imex-ctl and NVIDIA's runtime injects none: without the host's, every channel's
    prepare would fail its readiness check. A missing program or socket directory fails the pod's start."""
    r = render(helm, tmp_path, IMEX_DRA)
    volumes, mounts = _imex_mounts(r)
    assert volumes == {"imex-ctl": {"path": "/usr/bin/nvidia-imex-ctl", "type": "File"},
                       "imex-socket": {"path": "/etc/nvidia-imex", "type": "Directory"}}
    assert mounts["imex-ctl"]["mountPath"] == "/host/imex/nvidia-imex-ctl" and mounts["imex-ctl"]["readOnly"]
    # The socket at the daemon's default --imex-control-socket path (/etc/nvidia-imex/imex_ctrl.sock).
    assert mounts["imex-socket"]["mountPath"] == "/etc/nvidia-imex" and mounts["imex-socket"]["readOnly"]
    assert "--imex-control-binary=/host/imex/nvidia-imex-ctl" in r.container["args"]


@pytest.mark.parametrize("extra", [
    {"simulate": "dgx-h100"},                                   # a simulated node: the check is off by default
    {"dra": {"resources": ["nvidia.com/gpu"], "imexHost": {"enabled": False}}},
    {"config": {"flags": {"draImexChannels": 2, "imexControlBinary": ""}}},          # handed out unchecked
    {"config": {"flags": {"draImexChannels": 2, "imexControlBinary": "/opt/imex/nvidia-imex-ctl"}}},
    {"config": {"flags": {"draImexChannels": 0}}},                                   # no channels
])
def test_imex_host_mounts_nothing_where_not_needed_or_chosen_by_the_operator(helm, tmp_path, extra):
    values = {**IMEX_DRA, **extra}
    r = render(helm, tmp_path, values)
    assert _imex_mounts(r) == ({}, {})
    assert not any(a.startswith("--imex-control-binary") for a in r.container["args"])
