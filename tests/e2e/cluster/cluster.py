"""A real single-node Kubernetes cluster in private namespaces (tests/e2e/cluster).

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the kubelet, all built
from one Kubernetes release (cluster_build.py), on Debian's containerd with a bridge CNI,
inside a `Sandbox` (sandbox.py). Certificates come from openssl (pki.py). The kubelet joins
as node `topo-node` with its own client certificate, runs the Topology Manager, and sees a
private multi-NUMA view of /sys/devices/system/node that matches the simulated node the
plugin serves (this VM has one NUMA node). Stopped by PID: API clients (kubelet,
scheduler, controller manager) before the API server, then etcd, then containerd.
"""

from __future__ import annotations

import base64
import json
import pathlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pki import PKI
from sandbox import NODE_IP, Gone, Sandbox, wait_for

NODE = "topo-node"
API = f"https://{NODE_IP}:6443"
CHECKPOINT = "device-plugins/kubelet_internal_checkpoint"
#: Inside every node of a cluster, a directory of that node's own files (its kubelet's configuration, its simulated
#: topology): one path in a chart's values, each node's own content (a bind mount in the node's mount namespace).
NODE_FILES = "/var/lib/topo-e2e"
#: Stop order: every API client before the API server (an API server with connected
#: clients can take minutes to exit on SIGTERM), the API server before etcd.
STOP_ORDER = ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")


@dataclass(frozen=True)
class Binaries:
    controlplane: pathlib.Path  # etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
    kubelet: pathlib.Path
    helm: pathlib.Path
    harness: pathlib.Path  # the Go harness: its `podresources` mode queries the kubelet
    cni_bin: pathlib.Path
    pause_archive: pathlib.Path
    pause_image: str
    #: The containerd to run: Debian's (no CDI), or a built one with CDI on (`cdi` True).
    containerd: str = "containerd"
    cdi: bool = False
    #: NRI on, external plugins connecting at this path in the node (the built containerd v2 only).
    nri_socket: str | None = None

    def __getitem__(self, name: str) -> str:
        return str(self.controlplane / name)


def numa_sysfs(dest: pathlib.Path, nodes: dict[int, list[int]], distances: dict[int, list[int]]) -> None:
    """A /sys/devices/system/node with these NUMA nodes (-> CPUs) and distance rows.

    cadvisor (in the kubelet) reads per node: `cpu<N>` links to the CPUs' real directories
    (core and package IDs come from there), `meminfo`, `distance` and `hugepages/`.
    Memory is the machine's, split evenly.
    """
    total_kb = next(int(line.split()[1]) for line in pathlib.Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal:"))
    ids = sorted(nodes)
    dest.mkdir(parents=True)

    for name in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        (dest / name).write_text(",".join(map(str, ids)) + "\n")
    for n in ids:
        d = dest / f"node{n}"
        d.mkdir()
        for c in nodes[n]:
            (d / f"cpu{c}").symlink_to(f"/sys/devices/system/cpu/cpu{c}")
        (d / "cpulist").write_text(",".join(map(str, nodes[n])) + "\n")
        mem = total_kb // len(ids)
        (d / "meminfo").write_text(f"Node {n} MemTotal:       {mem} kB\nNode {n} MemFree:        {mem // 2} kB\n"
                                   f"Node {n} MemUsed:        {mem - mem // 2} kB\n")
        (d / "distance").write_text(" ".join(str(x) for x in distances[n]) + "\n")
        for size in ("hugepages-2048kB", "hugepages-1048576kB"):
            (d / "hugepages" / size).mkdir(parents=True)
            for f in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
                (d / "hugepages" / size / f).write_text("0\n")


def kubelet_config(w: pathlib.Path, pki: PKI, sock: str, tm_policy: str, cpu_policy: str,
                   address: str = NODE_IP) -> str:
    extra = ""
    if cpu_policy == "static":
        # The static policy needs CPUs reserved for the system; CPU 0 it is.
        extra = "reservedSystemCPUs: \"0\"\n"
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {address}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {pki.ca_cert}}}
authorization: {{mode: Webhook}}
clusterDomain: cluster.local
cgroupDriver: cgroupfs
# These machines run cgroup v1 (hybrid); kubelets since 1.35 refuse it unless told otherwise.
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix://{sock}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
makeIPTablesUtilChains: false
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
serializeImagePulls: false
topologyManagerPolicy: {tm_policy}
topologyManagerScope: container
cpuManagerPolicy: {cpu_policy}
cpuManagerReconcilePeriod: 2s
{extra}"""


class Cluster:
    def __init__(self, workdir: pathlib.Path, bins: Binaries):
        self.w = workdir
        self.bins = bins
        self.sb = Sandbox(workdir)
        self.pki = PKI(workdir / "pki")
        self.admin: pathlib.Path | None = None
        self.tm_policy = "none"
        self.cpu_policy = "none"
        self.home = workdir / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.files = workdir / "node-files"
        self.workers: list[WorkerNode] = []

    # ---- bring-up ----
    def up(self, numa: dict[int, list[int]], distances: dict[int, list[int]], tm_policy: str,
           cpu_policy: str = "none", images: list[pathlib.Path] = ()) -> None:
        self.sb.start()
        numa_sysfs(self.w / "numa-sysfs", numa, distances)
        self.sb.sh("mount", "--bind", str(self.w / "numa-sysfs"), "/sys/devices/system/node")
        bind_node_files(self.sb, self.files)
        self.certificates()
        self.sb.start_containerd(self.bins.cni_bin, self.bins.pause_image, self.bins.containerd,
                                 cdi_dirs=["/var/run/cdi"] if self.bins.cdi else [], nri_socket=self.bins.nri_socket)
        for archive in (self.bins.pause_archive, *images):
            self.sb.import_image(archive)
        self.start_etcd()
        self.start_apiserver()
        self.start_controllers()
        self.start_kubelet(tm_policy, cpu_policy)
        wait_for("the default ServiceAccount", lambda: self.kubectl("get", "serviceaccount", "default",
                                                                    check=False).returncode == 0, 120)

    def certificates(self) -> None:
        p = self.pki
        p.make_ca()
        sans = ["IP:127.0.0.1", f"IP:{NODE_IP}", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes",
                "DNS:kubernetes.default", "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"]
        self.serving = p.issue("apiserver", "kube-apiserver", server_sans=sans)
        self.kubelet_client = p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
        admin = p.issue("admin", "topo-e2e-admin", "system:masters")
        self.admin = p.kubeconfig(admin, API)
        self.cm_kubeconfig = p.kubeconfig(p.issue("controller-manager", "system:kube-controller-manager"), API)
        self.sched_kubeconfig = p.kubeconfig(p.issue("scheduler", "system:kube-scheduler"), API)
        self.node_kubeconfig = p.kubeconfig(p.issue("node", f"system:node:{NODE}", "system:nodes"), API)

    def start_etcd(self) -> None:
        data = self.w / "etcd"
        self.sb.spawn("etcd", [self.bins["etcd"], "--name", "topo-e2e", "--data-dir", str(data),
                               "--listen-client-urls", "http://127.0.0.1:2379",
                               "--advertise-client-urls", "http://127.0.0.1:2379",
                               "--listen-peer-urls", "http://127.0.0.1:2380",
                               "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                               "--initial-cluster", "topo-e2e=http://127.0.0.1:2380",
                               "--log-level", "warn"])
        self.wait_up("etcd", "etcd's /health", lambda: self._http_ok("http://127.0.0.1:2379/health"))

    def wait_up(self, name: str, what: str, ready, timeout: float = 300) -> None:
        """Poll `ready` while process `name` lives; its exit fails at once, with its log."""
        def check():
            if not self.sb.running(name):
                raise Gone(f"{name} exited ({self.sb.procs[name].returncode}):\n{self.sb.tail(name)}")
            return ready()
        try:
            wait_for(what, check, timeout)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.sb.tail(name)}") from None

    def _http_ok(self, url: str, sb: Sandbox | None = None) -> bool:
        """GET `url` from inside the namespaces (no curl needed: this interpreter does it)."""
        code = ("import sys,urllib.request;"
                f"sys.exit(0 if urllib.request.urlopen({url!r}, timeout=5).status == 200 else 1)")
        return (sb or self.sb).sh(sys.executable, "-c", code, check=False).returncode == 0

    def start_apiserver(self) -> None:
        p = self.pki
        self.sb.spawn("kube-apiserver", [
            self.bins["kube-apiserver"],
            "--etcd-servers=http://127.0.0.1:2379",
            "--bind-address=0.0.0.0", "--secure-port=6443", f"--advertise-address={NODE_IP}",
            f"--cert-dir={self.w / 'apiserver'}",
            f"--tls-cert-file={self.serving.cert}", f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={p.ca_cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p.sa_pub}", f"--service-account-signing-key-file={p.sa_key}",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}",
            # Else `kubectl logs/exec` try to resolve the node's name and time out.
            "--kubelet-preferred-address-types=InternalIP",
            "--profiling=false", "--v=1",
        ])
        self.wait_up("kube-apiserver", "the API server's /readyz",
                     lambda: self.kubectl("get", "--raw", "/readyz", check=False).stdout.strip() == "ok")

    def start_controllers(self) -> None:
        p = self.pki
        self.sb.spawn("kube-controller-manager", [
            self.bins["kube-controller-manager"], f"--kubeconfig={self.cm_kubeconfig}",
            f"--authentication-kubeconfig={self.cm_kubeconfig}", f"--authorization-kubeconfig={self.cm_kubeconfig}",
            f"--service-account-private-key-file={p.sa_key}", f"--root-ca-file={p.ca_cert}",
            "--use-service-account-credentials=true", "--leader-elect=false",
            "--bind-address=127.0.0.1", "--secure-port=10257", "--profiling=false", "--v=1",
        ])
        sched_cfg = self.w / "scheduler.yaml"
        sched_cfg.write_text("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
                             f"clientConnection: {{kubeconfig: {self.sched_kubeconfig}}}\n"
                             "leaderElection: {leaderElect: false}\n")
        self.sb.spawn("kube-scheduler", [
            self.bins["kube-scheduler"], f"--config={sched_cfg}",
            f"--authentication-kubeconfig={self.sched_kubeconfig}", f"--authorization-kubeconfig={self.sched_kubeconfig}",
            "--bind-address=127.0.0.1", "--secure-port=10259", "--profiling=false", "--v=1",
        ])

    def start_kubelet(self, tm_policy: str | None = None, cpu_policy: str | None = None) -> None:
        self.tm_policy = tm_policy or self.tm_policy
        cpu_policy = cpu_policy or self.cpu_policy
        if cpu_policy != self.cpu_policy:
            # The kubelet refuses to start when its CPU manager state names another policy.
            (self.w / "var-lib-kubelet" / "cpu_manager_state").unlink(missing_ok=True)
        self.cpu_policy = cpu_policy
        cfg = self.w / "kubelet.yaml"
        cfg.write_text(kubelet_config(self.w, self.pki, self.sb.containerd_sock, self.tm_policy, self.cpu_policy))
        shutil.copy(cfg, self.files / "kubelet.yaml")
        self.sb.spawn("kubelet", [str(self.bins.kubelet), f"--config={cfg}", f"--kubeconfig={self.node_kubeconfig}",
                                  f"--hostname-override={NODE}", f"--node-ip={NODE_IP}", "--v=2"])
        self.wait_up("kubelet", "the kubelet's /healthz", lambda: self._http_ok("http://127.0.0.1:10248/healthz"))
        self.wait_up("kubelet", f"node {NODE} Ready", self.node_ready)

    def stop_kubelet(self, sig: int = signal.SIGTERM) -> int | None:
        return self.sb.stop("kubelet", sig)

    def add_node(self, name: str, numa: dict[int, list[int]], distances: dict[int, list[int]], tm_policy: str,
                 cpu_policy: str = "none", images: list[pathlib.Path] = (),
                 files: Callable[[pathlib.Path], None] | None = None) -> WorkerNode:
        """One more node (its own namespaces, containerd and kubelet) joined to this cluster's control plane.

        `files` writes the node's own files (its directory on the host, NODE_FILES inside) before its kubelet
        starts: a DaemonSet already installed puts its pod there as soon as the node registers, and that pod's
        hostPath volumes must find them."""
        node = WorkerNode(self, len(self.workers) + 1, name)
        self.workers.append(node)
        if files is not None:
            node.files.mkdir(parents=True, exist_ok=True)
            files(node.files)
        node.up(numa, distances, tm_policy, cpu_policy, images)
        return node

    def down(self) -> None:
        # The other nodes' kubelets first: the API server they talk to stops with this sandbox.
        for node in reversed(self.workers):
            node.down()
        # Whatever a test started beside the cluster (a second scheduler, a driver) is an API client too: first.
        extra = [n for n in reversed(list(self.sb.procs)) if n not in STOP_ORDER and n != "containerd"]
        self.sb.close(order=(*extra, *STOP_ORDER))

    # ---- clients ----
    def kubectl(self, *args: str, check: bool = True, input: str | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess:
        return self.sb.sh(self.bins["kubectl"], f"--kubeconfig={self.admin}", *args, check=check, input=input,
                          timeout=timeout, env={"HOME": str(self.home)})

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {"HOME": str(self.home), "KUBECONFIG": str(self.admin),
               "HELM_CACHE_HOME": str(self.home / "helm-cache"), "HELM_CONFIG_HOME": str(self.home / "helm-config"),
               "HELM_DATA_HOME": str(self.home / "helm-data")}
        return self.sb.sh(str(self.bins.helm), *args, check=check, timeout=timeout, env=env)

    def node(self) -> dict[str, Any]:
        return self.get("node", NODE)

    def node_ready(self) -> bool:
        conds = {c["type"]: c["status"] for c in self.node().get("status", {}).get("conditions", [])}
        return conds.get("Ready") == "True"

    def allocatable(self) -> dict[str, str]:
        return self.node()["status"].get("allocatable", {})

    def capacity(self) -> dict[str, str]:
        return self.node()["status"].get("capacity", {})

    def podresources(self) -> dict[str, Any]:
        """The kubelet's pod-resources API (List + GetAllocatableResources), through the Go harness (run in the
        node's mount namespace, so the socket's short path there: a host path can pass the 107-byte limit)."""
        sock = "/var/lib/kubelet/pod-resources/kubelet.sock"
        out = self.sb.sh(str(self.bins.harness), "-mode", "podresources", "-socket", sock)
        return json.loads(out.stdout)

    def checkpoint(self) -> list[dict[str, Any]]:
        """The device manager's checkpoint: per container and resource, the IDs and the decoded Allocate answer."""
        from plugin.api import api_pb2

        raw = json.loads((self.w / "var-lib-kubelet" / CHECKPOINT).read_text())
        out = []
        for e in raw["Data"].get("PodDeviceEntries") or []:
            resp = api_pb2.ContainerAllocateResponse()
            resp.ParseFromString(base64.b64decode(e["AllocResp"]))
            ids = sorted({i for ids in (e.get("DeviceIDs") or {}).values() for i in ids})
            out.append({"pod_uid": e["PodUID"], "container": e["ContainerName"], "resource": e["ResourceName"],
                        "ids": ids, "response": resp})
        return out

    def cpu_manager_state(self) -> dict[str, Any]:
        path = self.w / "var-lib-kubelet" / "cpu_manager_state"
        return json.loads(path.read_text()) if path.exists() else {}

    def plugin_sockets(self) -> list[str]:
        d = self.w / "var-lib-kubelet" / "device-plugins"
        return sorted(p.name for p in d.iterdir() if p.is_socket() and p.name != "kubelet.sock")

    def logs_tail(self) -> str:
        return "\n".join(self.sb.tail(n) for n in ("kubelet", "kube-apiserver", "containerd"))



def bind_node_files(sb: Sandbox, files: pathlib.Path) -> None:
    """This node's own files (`files` on the host) at NODE_FILES inside its mount namespace."""
    files.mkdir(parents=True, exist_ok=True)
    sb.sh("mkdir", "-p", NODE_FILES)
    sb.sh("mount", "--bind", str(files), NODE_FILES)


class WorkerNode:
    """A further node of a `Cluster`: namespaces, containerd and a kubelet of its own, the cluster's control plane.

    Why its own namespaces: the kubelet hard-codes /var/lib/kubelet/device-plugins and listens on fixed ports, so
    two kubelets on one machine need two mount and two network namespaces. Its network is a veth pair to the
    control plane's namespace (`Sandbox.link_to`): node i is 10.233.i.2, its pods 10.232.i.0/24; the API server is
    reached at NODE_IP, as from the first node.
    """

    def __init__(self, cluster: Cluster, index: int, name: str):
        self.c = cluster
        self.index = index
        self.name = name
        self.ip = f"10.233.{index}.2"
        # Short: unix socket paths under it (containerd's) must stay below 107 bytes, and pytest's tmp_path under
        # workers is long already.
        self.w = cluster.w / f"n{index}"
        self.sb = Sandbox(self.w, hostname=name, address=None, pod_subnet=f"10.232.{index}.0/24")
        self.files = self.w / "node-files"
        self.tm_policy = "none"

    def up(self, numa: dict[int, list[int]], distances: dict[int, list[int]], tm_policy: str, cpu_policy: str,
           images: list[pathlib.Path]) -> None:
        c, bins = self.c, self.c.bins
        self.sb.start()
        self.sb.link_to(c.sb, f"tdp-w{self.index}", f"{self.ip}/24", f"10.233.{self.index}.1/24")
        numa_sysfs(self.w / "numa-sysfs", numa, distances)
        self.sb.sh("mount", "--bind", str(self.w / "numa-sysfs"), "/sys/devices/system/node")
        bind_node_files(self.sb, self.files)
        kubeconfig = c.pki.kubeconfig(c.pki.issue(f"node-{self.name}", f"system:node:{self.name}", "system:nodes"),
                                      API)
        self.sb.start_containerd(bins.cni_bin, bins.pause_image, bins.containerd,
                                 cdi_dirs=["/var/run/cdi"] if bins.cdi else [], nri_socket=bins.nri_socket)
        for archive in (bins.pause_archive, *images):
            self.sb.import_image(archive)
        self.tm_policy = tm_policy
        cfg = self.files / "kubelet.yaml"
        cfg.write_text(kubelet_config(self.w, c.pki, self.sb.containerd_sock, tm_policy, cpu_policy, address=self.ip))
        self.sb.spawn("kubelet", [str(bins.kubelet), f"--config={cfg}", f"--kubeconfig={kubeconfig}",
                                  f"--hostname-override={self.name}", f"--node-ip={self.ip}", "--v=2"])
        self.wait_up("the kubelet's /healthz", lambda: self.c._http_ok("http://127.0.0.1:10248/healthz", self.sb))
        self.wait_up(f"node {self.name} Ready", self.ready)

    def wait_up(self, what: str, ready) -> None:
        def check():
            if not self.sb.running("kubelet"):
                raise Gone(f"kubelet of {self.name} exited:\n{self.sb.tail('kubelet')}")
            return ready()
        try:
            wait_for(what, check, 300)
        except TimeoutError as e:
            raise TimeoutError(f"{e}\n{self.sb.tail('kubelet')}") from None

    def ready(self) -> bool:
        conds = {x["type"]: x["status"] for x in self.c.get("node", self.name).get("status", {}).get("conditions", [])}
        return conds.get("Ready") == "True"

    def podresources(self) -> dict[str, Any]:
        # The socket by its path inside the node's mount namespace (the harness runs there): the host path of a
        # worker node's kubelet directory can be past the 107-byte limit of a unix socket's path.
        sock = "/var/lib/kubelet/pod-resources/kubelet.sock"
        return json.loads(self.sb.sh(str(self.c.bins.harness), "-mode", "podresources", "-socket", sock).stdout)

    def down(self) -> None:
        self.sb.close(order=("kubelet",))
