"""kubernetes-sigs/scheduler-plugins' topology-aware scheduler as a second scheduler (issue 32).

The binary is kube-scheduler with upstream's `NodeResourceTopologyMatch` plugin registered
(./topo_scheduler: its own go.mod pins sigs.k8s.io/scheduler-plugins and moves every k8s.io
module to the control plane's release), built once by scripts/go_build_cached.sh. It runs
beside the default scheduler under its own name (`topo-aware-scheduler`): only pods that name
it in `spec.schedulerName` are its, so one cluster can run a workload twice, once per
scheduler.

What a cluster needs for it, and what this module makes:
- the NodeResourceTopology CRD (`topology.node.k8s.io/v1alpha2`): the chart installs it with
  `nrt.enabled`; `crd()` gives the chart's own definition for clusters without the chart
  (the scale benchmark), so the scheduler reads exactly the schema our publisher writes to;
- a client identity (certificate CN `topo-aware-scheduler`) with the default scheduler's
  roles plus `get/list/watch` on noderesourcetopologies (`rbac_objects()`);
- a KubeSchedulerConfiguration with one profile: the plugin as filter and scorer
  (`single-numa-node` filtering; `LeastNUMANodes` scoring, which upstream says works under
  every policy, `restricted` included) and its Reserve step left off unless a resync period
  is asked for (as upstream's example configuration does).

Two entry points: `TopoScheduler(cluster).start()` inside a running `Cluster` (through its
public methods only: `pki`, `admin`, `apply`, `sb.spawn`, `sb.sh`, `wait_up`), and the pure
pieces (`scheduler_config`, `rbac_objects`, `argv`, `crd`) for a control plane of one's own
(benchmarks/nrt_scale_bench.py).
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODULE_DIR = pathlib.Path(__file__).resolve().parent / "topo_scheduler"
CRD_TEMPLATE = ROOT / "charts" / "topo-device-plugin" / "templates" / "nrt-crd.yaml"
SCHEDULER_NAME = "topo-aware-scheduler"
#: The client certificate's CN: the user the RBAC below binds.
USER = "topo-aware-scheduler"
PLUGIN = "NodeResourceTopologyMatch"
#: Scoring strategies of the plugin (scheduler-plugins apis/config: ScoringStrategyType).
SCORING = ("LeastNUMANodes", "LeastAllocated", "MostAllocated", "BalancedAllocation")


class BuildUnavailable(RuntimeError):
    """The scheduler cannot be built here (no Go toolchain, or the build failed): the message says why."""


def build() -> pathlib.Path:
    """The cached binary (built on first use: a few minutes on a 2-core machine; cached afterwards)."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "go_build_cached.sh"), str(MODULE_DIR), "topo-scheduler"],
                          capture_output=True, text=True)
    if proc.returncode == 0 and proc.stdout.strip():
        return pathlib.Path(proc.stdout.strip().splitlines()[-1])
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    why = "no Go toolchain" if proc.returncode == 3 else f"the build exited {proc.returncode}"
    raise BuildUnavailable(f"cannot build the topology-aware scheduler from {MODULE_DIR} ({why}):\n{tail}")


@dataclass(frozen=True)
class TopoSchedulerOptions:
    """How the second scheduler is configured."""

    scheduler_name: str = SCHEDULER_NAME
    #: The plugin's scoring strategy; `LeastNUMANodes` for `restricted` clusters (it ranks nodes by how
    #: few NUMA nodes the pod would need), the others score only under `single-numa-node`.
    scoring: str = "LeastNUMANodes"
    #: > 0: the plugin's Reserve step and its "overreserve" cache, resynced every so many seconds
    #: (upstream discourages < 5 s); 0: no Reserve, the filter reads the published objects as they are.
    cache_resync_s: int = 0
    #: The client's rate limit (0: kube-scheduler's default, 50 QPS / 100 burst).
    qps: int = 0
    #: The scheduler's secure port (healthz); inside a sandbox's network namespace a fixed one is fine.
    port: int = 10269
    verbosity: int = 1

    def __post_init__(self) -> None:
        if self.scoring not in SCORING:
            raise ValueError(f"TopoSchedulerOptions.scoring: {self.scoring!r} is not one of {', '.join(SCORING)}")
        if self.cache_resync_s < 0:
            raise ValueError("TopoSchedulerOptions.cache_resync_s: must be >= 0 (0 turns the Reserve cache off)")


def scheduler_config(kubeconfig: pathlib.Path, options: TopoSchedulerOptions) -> str:
    """The KubeSchedulerConfiguration (JSON, which is YAML too) for the second scheduler."""
    args: dict[str, Any] = {"scoringStrategy": {"type": options.scoring}}
    plugins: dict[str, Any] = {"multiPoint": {"enabled": [{"name": PLUGIN}]}}
    if options.cache_resync_s:
        args["cacheResyncPeriodSeconds"] = options.cache_resync_s
    else:
        # Without a resync period the Reserve step has no cache to keep: off, as in upstream's example.
        plugins["reserve"] = {"disabled": [{"name": PLUGIN}]}
    client: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    if options.qps:
        client.update(qps=options.qps, burst=options.qps)
    cfg = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
           "leaderElection": {"leaderElect": False}, "clientConnection": client,
           "profiles": [{"schedulerName": options.scheduler_name, "plugins": plugins,
                         "pluginConfig": [{"name": PLUGIN, "args": args}]}]}
    return json.dumps(cfg, indent=1) + "\n"


def rbac_objects(user: str = USER) -> list[dict[str, Any]]:
    """What `user` needs: the default scheduler's roles, and reading NodeResourceTopology objects."""
    rbac = "rbac.authorization.k8s.io/v1"
    subject = [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]

    def cluster_binding(name: str, role: str) -> dict[str, Any]:
        return {"apiVersion": rbac, "kind": "ClusterRoleBinding", "metadata": {"name": name},
                "subjects": subject, "roleRef": {"kind": "ClusterRole", "name": role,
                                                 "apiGroup": "rbac.authorization.k8s.io"}}

    return [
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": f"{user}-nrt-reader"},
         "rules": [{"apiGroups": ["topology.node.k8s.io"], "resources": ["noderesourcetopologies"],
                    "verbs": ["get", "list", "watch"]}]},
        cluster_binding(f"{user}-nrt-reader", f"{user}-nrt-reader"),
        cluster_binding(f"{user}-as-kube-scheduler", "system:kube-scheduler"),
        cluster_binding(f"{user}-as-volume-scheduler", "system:volume-scheduler"),
        # Its delegated authentication reads the API server's client-CA ConfigMap in kube-system.
        {"apiVersion": rbac, "kind": "RoleBinding",
         "metadata": {"name": f"{user}-authentication-reader", "namespace": "kube-system"},
         "subjects": subject, "roleRef": {"kind": "Role", "name": "extension-apiserver-authentication-reader",
                                          "apiGroup": "rbac.authorization.k8s.io"}},
    ]


def argv(binary: pathlib.Path, config: pathlib.Path, kubeconfig: pathlib.Path,
         options: TopoSchedulerOptions) -> list[str]:
    return [str(binary), f"--config={config}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
            f"--secure-port={options.port}", "--profiling=false", f"--v={options.verbosity}"]


def crd(template: pathlib.Path = CRD_TEMPLATE) -> dict[str, Any]:
    """The chart's NodeResourceTopology CRD without Helm (its template's conditions and labels dropped).

    Why from the chart and not upstream's manifest: the scheduler must read the schema our chart
    installs, so the benchmark and a chart-less test use that one."""
    import yaml

    lines = []
    for line in template.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("{{-") and stripped.endswith("}}"):
            continue  # a template statement: if/end/variable/include
        lines.append(line.replace("{{ $name }}", "noderesourcetopologies.topology.node.k8s.io"))
    text = "\n".join(lines)
    unknown = re.search(r"{{.*?}}", text)
    if unknown:
        raise ValueError(f"{template}: a template expression this reader does not know: {unknown.group(0)}")
    obj = yaml.safe_load(text)
    if not isinstance(obj, dict) or obj.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{template}: not a CustomResourceDefinition after dropping the template lines")
    meta = obj.setdefault("metadata", {})
    if not meta.get("labels"):
        meta.pop("labels", None)
    return obj


def _server_of(kubeconfig: pathlib.Path) -> str:
    """The API server's URL from a kubeconfig (the cluster's admin one), so no address is assumed here."""
    import yaml

    cfg = yaml.safe_load(kubeconfig.read_text())
    try:
        return str(cfg["clusters"][0]["cluster"]["server"])
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"{kubeconfig}: no clusters[0].cluster.server") from None


class TopoScheduler:
    """The second scheduler inside a running `Cluster` (tests/e2e/cluster/cluster.py).

    Start it after the API server is up; it reads NodeResourceTopology objects, so the CRD must be
    installed (the chart with `nrt.enabled`, or `install_crd=True`)."""

    def __init__(self, cluster: Any, options: TopoSchedulerOptions | None = None, binary: pathlib.Path | None = None,
                 name: str = "topo-scheduler"):
        self.cluster = cluster
        self.options = options or TopoSchedulerOptions()
        self.binary = binary
        self.name = name  # the process's name in the sandbox (logs: <name>-N.log)

    def start(self, install_crd: bool = False, timeout: float = 180) -> None:
        c = self.cluster
        binary = self.binary or build()
        if install_crd:
            c.apply(crd())
        for obj in rbac_objects():
            c.apply(obj)
        kubeconfig = c.pki.kubeconfig(c.pki.issue(self.name, USER), _server_of(pathlib.Path(c.admin)))
        config = pathlib.Path(c.w) / f"{self.name}.json"
        config.write_text(scheduler_config(kubeconfig, self.options))
        c.sb.spawn(self.name, argv(binary, config, kubeconfig, self.options))
        c.wait_up(self.name, f"{self.name}'s /healthz", self.healthy, timeout)

    def healthy(self) -> bool:
        """Its /healthz answers `ok` (asked from inside the cluster's namespaces; a self-signed certificate)."""
        code = ("import ssl,sys,urllib.request;ctx=ssl._create_unverified_context();"
                f"r=urllib.request.urlopen('https://127.0.0.1:{self.options.port}/healthz',context=ctx,timeout=5);"
                "sys.exit(0 if r.read().strip()==b'ok' else 1)")
        return bool(self.cluster.sb.sh(sys.executable, "-c", code, check=False).returncode == 0)

    def stop(self) -> int | None:
        return self.cluster.sb.stop(self.name)

    def logs_tail(self, lines: int = 40) -> str:
        return str(self.cluster.sb.tail(self.name, lines))
