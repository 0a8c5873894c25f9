"""The paired NIC, ready to use, on a real Kubernetes 1.37 cluster: DRA through NRI.

One cluster for this module (tests/e2e/cluster: control plane, kubelet and containerd v2 with
CDI and NRI, in private namespaces). The plugin serves a simulated DGX H100 (8 GPUs, 8 NICs,
one GPU and one NIC behind each PCIe switch) whose NICs name a `netdev`; each netdev is a real
link in the node's network namespace, one end of a veth pair whose other end is the NIC's
port on a bridge (fabric.py). A claim asks for 2 GPUs + 2 NICs, each NIC under its GPU's PCIe
switch, with a NicConfig per NIC request (interface name, address, route, MTU 9000). What a
user notices is what is asserted: inside the container `ip` shows exactly those interfaces,
addresses, MTU and routes; the claim's status says the same (networkData); two such pods
ping each other over them, through the NICs' own ports; deleting a pod gives the NICs back to
the node with their names, MTU and MAC; a driver restart while a pod runs, and while one is
being deleted, loses nothing and moves nothing twice; a bad configuration fails prepare with
the reason on the pod and the claim, and moves nothing, and so do two claims of one pod asking
one interface name and an address a running pod holds (issue 35); an attach that only the
sandbox start can fail leaves no pause process behind (containerd 2.2.6+); a pod stopped while
the driver was away is said so once, not attached to. The tests run in file order, each
one stage of the story; the last one checks that the node is as it was before the first pod.
"""

from __future__ import annotations

import pathlib
import re
import sys
import time
from typing import Any

import pytest
import yaml
from cluster import Cluster
from cluster_fixtures import down_and_check_nothing_left, numa_layout, start_cluster
from fabric import RAILS, Fabric, LinkState
from kubelet_e2e import BUSYBOX
from sandbox import NODE_IP, wait_for
from workloads import NAMESPACE, StageTimes, Node, chart_values, daemon_pods, diagnose, helm_upgrade, \
    wait_daemon_ready

from plugin.dra.slices.build import device_name
from plugin.sources.simulated import load_simulated

pytestmark = pytest.mark.timeout(1800)

DRIVER = "topo.dev"
NS = "default"
NIC_CONFIG_API = "net.topo-device-plugin.io/v1alpha1"
#: The NIC that a DGX H100 calls mlx5_<i> is the netdev tdpnic<i> here.
NETDEV = "tdpnic{}"
#: containerd's NRI adaptation logs this once a plugin has registered and had its first
#: Synchronize (github.com/containerd/nri pkg/adaptation): the runtime's own word that our
#: plugin is connected, independent of what the daemon says about itself.
NRI_SYNCED = re.compile(r'plugin \\?"[0-9]*-?topo-device-plugin\\?" connected and synchronized')
STAGES = StageTimes()
stage = STAGES.stage


#: The pods' program: idle until told to stop (it is PID 1: without the trap it would ignore SIGTERM).
IDLE = "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"
#: Its preStop hook, which the kubelet runs when the pod is deleted, before it asks the runtime to stop
#: the container: it marks /tmp/terminating and waits while /tmp/hold exists, so a test can keep a
#: pod in deletion (its sandbox, and the NICs in it, alive) as long as it needs and end that by
#: removing the file; no sleep decides it. A hook and not a SIGTERM handler: containerd holds back
#: the synchronization of a newly connected NRI plugin while a StopContainer call is in progress
#: (internal/cri/server/container_stop.go, BlockPluginSync), so a restarted driver could not catch
#: up before the container had stopped.
PRE_STOP = ": > /tmp/terminating; while [ -e /tmp/hold ]; do sleep 0.2; done"


# ---- the node, the cluster, the chart ---------------------------------------------------------------


def node_with_netdevs(node: Node) -> dict[str, str]:
    """Give every NIC of the simulated node a netdev (NIC name -> netdev)."""
    data = yaml.safe_load(node.node_file.read_text())
    names = {}
    for i, nic in enumerate(data["nics"]):
        nic["netdev"] = NETDEV.format(i)
        names[nic["name"]] = nic["netdev"]
    node.node_file.write_text(yaml.safe_dump(data, sort_keys=False))
    return names


@pytest.fixture(scope="module")
def env(tmp_path_factory, cluster_inputs):
    node = Node.make(tmp_path_factory.mktemp("node"), simulate="dgx-h100")
    netdev_of = node_with_netdevs(node)
    numa, distances = node.numa_nodes()
    t0 = time.monotonic()
    for c in start_cluster(tmp_path_factory, cluster_inputs, numa_layout(numa), distances, tm_policy="none"):
        STAGES["cluster up"] = time.monotonic() - t0
        with stage("busybox imported, NIC stand-ins built"):
            # As on a systemd host, and as `ip netns add` leaves it: the node's /run/netns is a
            # shared mount, so the pod network namespaces containerd mounts there after the
            # driver's pod started reach that pod's HostToContainer mount of /var/run/netns.
            # (Every mount of the sandbox's namespace is private: tests/e2e/cluster/sandbox.py.)
            for argv in (("mkdir", "-p", "/run/netns"), ("mount", "--bind", "/run/netns", "/run/netns"),
                         ("mount", "--make-shared", "/run/netns")):
                c.sb.sh(*argv)
            c.sb.import_image(cluster_inputs["busybox"])
            fabric = Fabric(c.sb, sorted(netdev_of.values()))
            fabric.build()
        topology = load_simulated(str(node.node_file))
        nic_names = {device_name(d): d.name for d in topology.devices}
        yield {"c": c, "node": node, "image": cluster_inputs["image"].ref, "topology": topology,
               "fabric": fabric, "netdev": {dev: netdev_of[n] for dev, n in nic_names.items() if n in netdev_of},
               "device_names": nic_names, "links_before": {x["ifname"] for x in fabric.links()}}
    print("\nnetpath e2e stage times:", file=sys.stderr)
    for name, dt in STAGES.items():
        print(f"  {name:<60} {dt:7.1f} s", file=sys.stderr)


def values(env) -> dict[str, Any]:
    v = chart_values(
        env["image"], env["node"],
        # netdevAttach: the chart's default is off; auto runs the NRI plugin that moves the NICs.
        dra={"resources": ["nvidia.com/gpu", "topo.dev/nic"], "netdevAttach": "auto"},
        # No kube-proxy in this cluster: the pod reaches the API server at the node's address.
        extraEnv=[{"name": "KUBERNETES_SERVICE_HOST", "value": NODE_IP},
                  {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}])
    v["config"]["flags"]["logLevel"] = "info"  # the driver's log goes into failure messages: its story, not netlink's
    return v


@pytest.fixture(scope="module")
def installed(env):
    c = env["c"]
    with stage("helm install + driver Ready + NRI plugin connected"):
        helm_upgrade(c, values(env))
        env["daemon"] = wait_daemon_ready(c)
        wait_nri_synced(c, 0)
    return env


# ---- helpers -------------------------------------------------------------------------------------


def nri_syncs(c: Cluster) -> int:
    """How often containerd has connected and synchronized our NRI plugin so far."""
    return sum(len(NRI_SYNCED.findall(f.read_text(errors="replace"))) for f in c.sb.logs["containerd"])


def wait_nri_synced(c: Cluster, before: int, timeout: float = 120) -> int:
    """Wait until containerd reports one more connection of our plugin than `before`."""
    try:
        return wait_for("containerd to connect our NRI plugin", lambda: nri_syncs(c) > before and nri_syncs(c), timeout)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{c.sb.tail('containerd', 40)}") from None


def daemon_log(c: Cluster, lines: int = 60) -> str:
    """The driver's recent log (for failure messages)."""
    proc = c.kubectl("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=topo-device-plugin", f"--tail={lines}",
                     check=False)
    return f"--- driver log\n{proc.stdout}{proc.stderr}"[-8000:]


def nic_config(interface: str, address: str, route: tuple[str, str], mtu: int = 9000) -> dict[str, Any]:
    return {"apiVersion": NIC_CONFIG_API, "kind": "NicConfig", "interfaceName": interface,
            "addresses": [address], "routes": [{"destination": route[0], "gateway": route[1]}], "mtu": mtu}


def rail(i: int, host: int) -> dict[str, Any]:
    """What pod number `host` asks for on rail `i`: railI, 192.168.5I.host/24, a route to 10.5I.0.0/16, MTU 9000."""
    return nic_config(f"rail{i}", f"192.168.5{i}.{host}/24", (f"10.5{i}.0.0/16", f"192.168.5{i}.254"))


def template(name: str, configs: dict[str, dict[str, Any]], gpus: bool = True) -> dict[str, Any]:
    """A ResourceClaimTemplate: per NIC request in `configs` one NIC (with its GPU under the same PCIe
    switch when `gpus`), each NIC request configured with its NicConfig."""
    requests, constraints = [], []
    for nic in configs:
        requests.append({"name": nic, "exactly": {"deviceClassName": f"nic.{DRIVER}"}})
        if gpus:
            gpu = nic.replace("nic", "gpu")
            requests.insert(-1, {"name": gpu, "exactly": {"deviceClassName": f"gpu.{DRIVER}"}})
            constraints.append({"requests": [gpu, nic], "matchAttribute": f"{DRIVER}/pcieSwitch"})
    devices: dict[str, Any] = {"requests": requests,
                               "config": [{"requests": [r], "opaque": {"driver": DRIVER, "parameters": p}}
                                          for r, p in configs.items()]}
    if constraints:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": {"spec": {"devices": devices}}}


def net_pod(name: str, template_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"topo-e2e": "netpath"}},
        "spec": {
            # Long enough to restart the driver while the pod is being deleted; PRE_STOP ends at
            # once unless the test holds it.
            "terminationGracePeriodSeconds": 300,
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "resourceClaims": [{"name": "net", "resourceClaimTemplateName": template_name}],
            "containers": [{"name": "main", "image": BUSYBOX, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", IDLE], "resources": {"claims": [{"name": "net"}]},
                            "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", PRE_STOP]}}}}],
        },
    }


def get_pod(c: Cluster, name: str) -> dict[str, Any]:
    return c.get("pod", name, "-n", NS)


def pod_exists(c: Cluster, name: str) -> bool:
    return bool(c.get("pods", "-n", NS, "--field-selector", f"metadata.name={name}")["items"])


def wait_running(c: Cluster, name: str, timeout: float = 240) -> dict[str, Any]:
    def running():
        p = get_pod(c, name)
        return p if p.get("status", {}).get("phase") == "Running" else None
    try:
        return wait_for(f"pod {name} Running", running, timeout)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{diagnose(c, NS)}\n{c.sb.tail('containerd', 40)}\n{daemon_log(c)}") from None


def delete_pod(c: Cluster, name: str, timeout: float = 240) -> None:
    c.kubectl("delete", "pod", "-n", NS, name, "--wait=false")
    wait_for(f"pod {name} gone", lambda: not pod_exists(c, name), timeout)


def claim_of(c: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    (s,) = pod["status"]["resourceClaimStatuses"]
    return c.get("resourceclaim", s["resourceClaimName"], "-n", NS)


def results(claim: dict[str, Any]) -> dict[str, str]:
    """Request name -> device name, as the scheduler allocated them."""
    res = claim["status"]["allocation"]["devices"]["results"]
    assert all(r["driver"] == DRIVER for r in res), res
    return {r["request"]: r["device"] for r in res}


def in_pod(c: Cluster, pod: str, *argv: str, check: bool = True):
    return c.kubectl("exec", "-n", NS, pod, "-c", "main", "--", *argv, check=check)


LINK_RE = re.compile(r"^\d+: ([^:@\s]+)(?:@\S+)?: <([^>]*)> mtu (\d+).*?link/\S+ ([0-9a-f:]{17})")
ADDR_RE = re.compile(r"^\d+: (\S+)\s+inet (\S+)")


def pod_network(c: Cluster, pod: str) -> dict[str, Any]:
    """What `ip` shows inside the container: links (name -> LinkState), IPv4 addresses and routes per link."""
    links = {}
    for line in in_pod(c, pod, "busybox", "ip", "-o", "link").stdout.splitlines():
        m = LINK_RE.match(line)
        assert m, f"unexpected `ip -o link` line in {pod}: {line!r}"
        links[m[1]] = LinkState(m[1], int(m[3]), m[4], "UP" in m[2].split(","))
    addrs: dict[str, set[str]] = {}
    for line in in_pod(c, pod, "busybox", "ip", "-o", "-4", "addr").stdout.splitlines():
        m = ADDR_RE.match(line)
        assert m, f"unexpected `ip -o -4 addr` line in {pod}: {line!r}"
        addrs.setdefault(m[1], set()).add(m[2])
    routes: dict[str, set[tuple[str, str | None]]] = {}
    for line in in_pod(c, pod, "busybox", "ip", "route").stdout.splitlines():
        words = line.split()
        if "dev" in words:
            via = words[words.index("via") + 1] if "via" in words else None
            routes.setdefault(words[words.index("dev") + 1], set()).add((words[0], via))
    return {"links": links, "addrs": addrs, "routes": routes}


def link_identity(c: Cluster, pod: str, ifname: str) -> tuple[str, str]:
    """(ifindex, carrier changes) of a link inside the pod: a second move or reconfiguration
    (down, out, in, up) would change them."""
    base = f"/sys/class/net/{ifname}"
    out = in_pod(c, pod, "cat", f"{base}/ifindex", f"{base}/carrier_changes").stdout.split()
    return out[0], out[1]


def events(c: Cluster, pod: str) -> list[dict[str, Any]]:
    return c.get("events", "-n", NS, "--field-selector", f"involvedObject.name={pod}")["items"]


def ping(c: Cluster, pod: str, ifname: str, address: str, count: int = 3) -> int:
    """Ping `address` out of `ifname` only; returns the replies received."""
    proc = in_pod(c, pod, "busybox", "ping", "-c", str(count), "-W", "5", "-I", ifname, address, check=False)
    m = re.search(r"(\d+) packets transmitted, (\d+) packets received", proc.stdout)
    assert proc.returncode == 0 and m, f"ping {address} -I {ifname} from {pod}:\n{proc.stdout}\n{proc.stderr}"
    return int(m[2])


def nics_back_as_before(env) -> dict[str, LinkState]:
    """Every NIC netdev is in the node's namespace with its name, MTU, MAC and up state of the start."""
    fabric: Fabric = env["fabric"]
    return wait_for("every NIC netdev back in the node as it was",
                    lambda: fabric.nics() if fabric.nics() == fabric.initial else None, 120)


# ---- the story -----------------------------------------------------------------------------------


def test_runtime_has_nri_and_the_slices_name_each_nics_netdev(installed):
    c = installed["c"]
    # containerd v2 with NRI (conftest.py): its socket in the node, our plugin connected to it.
    assert " 2." in c.sb.sh(c.bins.containerd, "--version").stdout
    assert c.sb.sh("test", "-S", "/var/run/nri/nri.sock", check=False).returncode == 0
    assert nri_syncs(c) == 1
    slices = wait_for("our ResourceSlices", lambda: [s for s in c.get("resourceslices")["items"]
                                                     if s["spec"]["driver"] == DRIVER] or None, 120)
    attrs = {d["name"]: d.get("attributes", {}) for s in slices for d in s["spec"]["devices"]}
    nics = {name: a.get("netdev", {}).get("string") for name, a in attrs.items() if name.startswith("nic-")}
    assert nics == installed["netdev"]
    # The stand-ins are real links of the node, where the driver (host network) finds them.
    assert sorted(installed["fabric"].nics()) == sorted(nics.values())


BAD = {
    # pod -> (its NIC requests' configs, what the reason must name: the value and the field)
    "bad-address": ({"nic-a": {**rail(0, 9), "addresses": ["192.168.50.300/24"]}}, ("192.168.50.300/24", "addresses")),
    "bad-two-names": ({"nic-a": rail(0, 9), "nic-b": {**rail(1, 9), "interfaceName": "rail0"}},
                      ("rail0", "interfaceName")),
    # veth's maximum MTU is 65535 (the kernel's ETH_MAX_MTU), which the driver reads from the link.
    "bad-mtu": ({"nic-a": {**rail(0, 9), "mtu": 70000}}, ("70000", "65535", "mtu")),
    "bad-eth0": ({"nic-a": {**rail(0, 9), "interfaceName": "eth0"}}, ("eth0", "interfaceName")),
    # Refused at prepare since issue 35 (it used to fail the sandbox start, after the sandbox existed).
    "bad-gateway": ({"nic-a": {**rail(0, 9), "routes": [{"destination": "10.50.0.0/16", "gateway": "192.168.99.254"}]}},
                    ("192.168.99.254", "routes[0].gateway", "not in the network of any address")),
}


@pytest.fixture
def bad_pods(installed):
    """The pods of BAD, deleted afterwards whatever the test found (their claims hold 6 of the 8 NICs)."""
    c = installed["c"]
    for name, (configs, _) in BAD.items():
        c.apply(template(name, configs, gpus=False))
        c.apply(net_pod(name, name))
    yield
    with stage("bad pods deleted"):
        for name in BAD:
            c.kubectl("delete", "pod", "-n", NS, name, "--wait=false")
        for name in BAD:
            wait_for(f"pod {name} gone", lambda n=name: not pod_exists(c, n), 180)


def test_bad_nic_configs_fail_prepare_with_the_reason_and_move_nothing(installed, bad_pods):
    """Five broken configurations at once (6 NICs of 8, no GPUs): each pod stays Pending with the
    reason in its events and on its claim; no NIC leaves the node."""
    c, fabric = installed["c"], installed["fabric"]

    def failed_prepare(name: str, needles: tuple[str, ...]):
        msgs = [e["message"] for e in events(c, name) if e["reason"] == "FailedPrepareDynamicResources"]
        return [m for m in msgs if all(n in m for n in needles)]

    with stage("5 bad NicConfigs: prepare failed with the reason"):
        for name, (_, needles) in BAD.items():
            try:
                msgs = wait_for(f"{name}: prepare failing, naming {needles}", lambda: failed_prepare(name, needles), 180)
            except TimeoutError as e:
                raise TimeoutError(f"{e}\n{diagnose(c, NS)}") from None
            assert all("NodePrepareResources failed" in m for m in msgs), msgs
    for name, (configs, needles) in BAD.items():
        pod = get_pod(c, name)
        assert pod["status"]["phase"] == "Pending", (name, pod["status"])
        assert not any(s.get("state", {}).get("running") for s in pod["status"].get("containerStatuses") or [])
        claim = claim_of(c, pod)
        assert set(results(claim)) == set(configs)  # allocated: the configuration is ours to refuse

        def refused(claim_name=claim["metadata"]["name"], needles=needles):
            st = c.get("resourceclaim", claim_name, "-n", NS).get("status", {})
            return [cond for d in st.get("devices") or [] for cond in d.get("conditions") or []
                    if cond["type"] == "Ready" and cond["status"] == "False" and cond["reason"] == "InvalidNicConfig"
                    and all(n in cond.get("message", "") for n in needles)]
        try:
            wait_for(f"{name}: the claim's devices Ready=False InvalidNicConfig naming {needles}", refused, 60)
        except TimeoutError as e:
            st = c.get("resourceclaim", claim["metadata"]["name"], "-n", NS).get("status", {})
            raise TimeoutError(f"{e}\nclaim status: {st}\n{daemon_log(c)}") from None
        assert not any(d.get("networkData") for d in claim.get("status", {}).get("devices") or [])
    assert fabric.nics() == fabric.initial, "a NIC moved although its claim was refused"


def prepare_failures(c: Cluster, pod: str, *needles: str) -> list[str]:
    """The pod's FailedPrepareDynamicResources messages that name every one of `needles`."""
    return [e["message"] for e in events(c, pod) if e["reason"] == "FailedPrepareDynamicResources"
            and all(n in e["message"] for n in needles)]


def pod_with_claims(name: str, templates: list[str], selectors: dict[str, str] | None = None) -> dict[str, Any]:
    """net_pod with one claim per template in `templates`."""
    pod = net_pod(name, templates[0])
    pod["spec"]["resourceClaims"] = [{"name": f"net{i}", "resourceClaimTemplateName": t} for i, t in enumerate(templates)]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": f"net{i}"} for i in range(len(templates))]
    return pod


def delete_and_wait(c: Cluster, *pods: str) -> None:
    for name in pods:
        c.kubectl("delete", "pod", "-n", NS, name, "--wait=false")
    for name in pods:
        wait_for(f"pod {name} gone", lambda n=name: not pod_exists(c, n), 180)


def test_two_claims_of_one_pod_asking_one_interface_name_fail_prepare_before_any_sandbox(installed):
    """Each claim is fine alone; together they ask the pod for two interfaces called rail0. The
    kubelet prepares both in one call: the second is refused there, naming the first."""
    c, fabric = installed["c"], installed["fabric"]
    c.apply(template("net-one", {"nic-a": rail(0, 7)}, gpus=False))
    c.apply(template("net-two", {"nic-a": {**rail(1, 7), "interfaceName": "rail0"}}, gpus=False))
    c.apply(pod_with_claims("two-claims", ["net-one", "net-two"]))
    try:
        with stage("2 claims of one pod naming rail0: prepare failed with the reason"):
            try:
                msgs = wait_for("two-claims: prepare failing, naming the other claim",
                                lambda: prepare_failures(c, "two-claims", "interface name rail0 is already given to",
                                                         "prepared for the same pod"), 180)
            except TimeoutError as e:
                raise TimeoutError(f"{e}\n{diagnose(c, NS)}\n{daemon_log(c)}") from None
        claims = {s["name"]: s["resourceClaimName"] for s in get_pod(c, "two-claims")["status"]["resourceClaimStatuses"]}
        assert any(f"ResourceClaim {NS}/{claims['net0']}" in m or f"ResourceClaim {NS}/{claims['net1']}" in m
                   for m in msgs), (msgs, claims)
        pod = get_pod(c, "two-claims")
        assert pod["status"]["phase"] == "Pending"
        assert not [e for e in events(c, "two-claims") if e["reason"] == "FailedCreatePodSandBox"]
        assert fabric.nics() == fabric.initial, "a NIC moved although a claim of the pod was refused"
    finally:
        delete_and_wait(c, "two-claims")


def nic_selected(name: str, config: dict[str, Any], netdev: str) -> dict[str, Any]:
    """A one-NIC template whose NIC is the one with `netdev`."""
    t = template(name, {"nic-a": config}, gpus=False)
    [req] = t["spec"]["spec"]["devices"]["requests"]
    req["exactly"]["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].netdev == "{netdev}"'}}]
    return t


def _cmdline(pid: str) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:  # gone meanwhile
        return ""


def pause_processes(c: Cluster) -> list[str]:
    """The node's live pause processes (one per pod sandbox containerd runs)."""
    return [pid for pid in c.sb.members() if _cmdline(pid).split()[:1] == ["/pause"]]


def test_a_failed_attach_fails_the_sandbox_and_leaves_no_pause_process_behind(installed):
    """A failure only the attach can meet (here the NIC's netdev turned into a bridge after the slice
    was published: a bridge cannot leave its namespace) fails RunPodSandbox; containerd 2.2.6 and
    later stop the sandbox's pause container then (containerd issue 13355: 2.1 left one running per
    attempt). Deleting the pod leaves no pause process and the NIC as it was."""
    c, fabric = installed["c"], installed["fabric"]
    victim = fabric.netdevs[-1]
    before = sorted(pause_processes(c))
    fabric.sb.sh("ip", "link", "set", victim, "down")
    fabric.sb.sh("ip", "link", "set", victim, "name", f"{victim}x")
    fabric.sb.sh("ip", "link", "add", victim, "type", "bridge")
    try:
        c.apply(nic_selected("net-bridge", rail(0, 8), victim))
        c.apply(net_pod("attach-fails", "net-bridge"))
        with stage("attach into a bridge: RunPodSandbox failed (twice)"):
            def sandbox_failures():
                n = sum(e.get("count", 1) for e in events(c, "attach-fails") if e["reason"] == "FailedCreatePodSandBox"
                        and "NRI" in e["message"])
                return n >= 2 and n
            try:
                wait_for("attach-fails: RunPodSandbox failing through NRI, retried", sandbox_failures, 240)
            except TimeoutError as e:
                raise TimeoutError(f"{e}\n{diagnose(c, NS)}\n{c.sb.tail('containerd', 40)}\n{daemon_log(c)}") from None
        assert get_pod(c, "attach-fails")["status"]["phase"] == "Pending"
        with stage("attach-fails deleted"):
            delete_and_wait(c, "attach-fails")
        leaked = sorted(set(pause_processes(c)) - set(before))
        assert leaked == [], f"pause processes left by the failed sandboxes: {[(p, _cmdline(p)) for p in leaked]}"
    finally:
        fabric.sb.sh("ip", "link", "del", victim, check=False)
        fabric.sb.sh("ip", "link", "set", f"{victim}x", "name", victim)
        fabric.sb.sh("ip", "link", "set", victim, "up")
    assert fabric.nics() == fabric.initial


PODS = {"pa": 1, "pb": 2}  # pod -> its host number on both rails


def test_two_pods_get_exactly_their_configured_interfaces_on_pix_nics(installed):
    c, fabric, topo = installed["c"], installed["fabric"], installed["topology"]
    # The refused pods came and went (bad_pods): still no NIC moved.
    assert fabric.nics() == fabric.initial
    for pod, host in PODS.items():
        c.apply(template(f"net-{pod}", {"nic-a": rail(0, host), "nic-b": rail(1, host)}))
    with stage("2 pods (2 GPU + 2 configured NICs each) Running"):
        for pod in PODS:
            c.apply(net_pod(pod, f"net-{pod}"))
        for pod in PODS:
            wait_running(c, pod)
    installed["pods"] = {}
    for pod, host in PODS.items():
        claim = claim_of(c, get_pod(c, pod))
        got = results(claim)
        # The NICs are their GPUs' PIX pairs (one PCIe switch each).
        names = installed["device_names"]
        for g, n in (("gpu-a", "nic-a"), ("gpu-b", "nic-b")):
            assert topo.link(names[got[g]], names[got[n]]).label == "PIX", (got[g], got[n])
        nics = {f"rail{i}": installed["netdev"][got[req]] for i, req in enumerate(("nic-a", "nic-b"))}
        installed["pods"][pod] = {"claim": claim["metadata"]["name"], "nics": nics, "devices": got}
        # Wire each NIC's port to its rail (its subnet's bridge), as a rail-optimised fabric would.
        for i, netdev in enumerate(nics.values()):
            fabric.wire(netdev, i)
    taken = [n for p in installed["pods"].values() for n in p["nics"].values()]
    assert len(set(taken)) == 4
    # They left the node: the driver moved them, and only them.
    assert sorted(fabric.absent()) == sorted(taken)

    for pod, host in PODS.items():
        nics = installed["pods"][pod]["nics"]
        net = pod_network(c, pod)
        assert set(net["links"]) == {"lo", "eth0", "rail0", "rail1"}, net["links"]
        for i, (ifname, netdev) in enumerate(nics.items()):
            link = net["links"][ifname]
            assert (link.mtu, link.mac, link.up) == (9000, fabric.initial[netdev].mac, True), (pod, link)
            assert net["addrs"][ifname] == {f"192.168.5{i}.{host}/24"}
            assert net["routes"][ifname] == {(f"10.5{i}.0.0/16", f"192.168.5{i}.254"), (f"192.168.5{i}.0/24", None)}
        installed["pods"][pod]["identity"] = {ifname: link_identity(c, pod, ifname) for ifname in nics}


def test_an_address_a_running_pod_holds_is_refused_naming_it_and_its_claim(installed):
    """pa holds 192.168.50.1/24 on rail 0; a third pod asking for it is refused at prepare, with the
    address and pa's claim in the reason; pa's interfaces are untouched."""
    c, fabric = installed["c"], installed["fabric"]
    absent = sorted(fabric.absent())
    holder = installed["pods"]["pa"]["claim"]
    c.apply(template("net-dup", {"nic-a": rail(0, 1)}, gpus=False))
    c.apply(net_pod("dup", "net-dup"))
    try:
        with stage("an address pa holds: prepare failed naming it"):
            try:
                wait_for("dup: prepare failing, naming the address and pa's claim",
                         lambda: prepare_failures(c, "dup", "address 192.168.50.1/24 is already held by",
                                                  f"ResourceClaim {NS}/{holder}"), 180)
            except TimeoutError as e:
                raise TimeoutError(f"{e}\n{diagnose(c, NS)}\n{daemon_log(c)}") from None
        assert get_pod(c, "dup")["status"]["phase"] == "Pending"
        assert sorted(fabric.absent()) == absent
    finally:
        delete_and_wait(c, "dup")
    assert pod_network(c, "pa")["addrs"]["rail0"] == {"192.168.50.1/24"}


def network_data(c: Cluster, claim_name: str) -> dict[str, Any]:
    """Device name -> the networkData our driver wrote into the claim's status."""
    st = c.get("resourceclaim", claim_name, "-n", NS).get("status", {})
    return {d["device"]: d["networkData"] for d in st.get("devices") or [] if d.get("networkData")}


def test_claim_status_reports_the_attached_interfaces(installed):
    c, fabric = installed["c"], installed["fabric"]
    for pod, host in PODS.items():
        p = installed["pods"][pod]
        want = {}
        for i, req in enumerate(("nic-a", "nic-b")):
            netdev = p["nics"][f"rail{i}"]
            want[p["devices"][req]] = {"interfaceName": f"rail{i}", "ips": [f"192.168.5{i}.{host}/24"],
                                       "hardwareAddress": fabric.initial[netdev].mac}
        with stage(f"{pod}: networkData in the claim status"):
            got = wait_for(f"{pod}'s claim networkData", lambda: network_data(c, p["claim"]) == want
                           and network_data(c, p["claim"]), 60)
        assert got == want
        p["network_data"] = got


def check_pings(installed, count: int = 3) -> None:
    """pa pings pb on each rail out of that rail's interface, and back; the packets go through
    both pods' NICs of that rail (their ports' counters)."""
    c, fabric = installed["c"], installed["fabric"]
    for i in range(len(RAILS)):
        ports = {pod: installed["pods"][pod]["nics"][f"rail{i}"] for pod in PODS}
        before = {pod: fabric.port_counters(n) for pod, n in ports.items()}
        got = ping(c, "pa", f"rail{i}", f"192.168.5{i}.2", count) + ping(c, "pb", f"rail{i}", f"192.168.5{i}.1", count)
        assert got == 2 * count
        after = {pod: fabric.port_counters(n) for pod, n in ports.items()}
        for pod in PODS:
            # Requests out of one pod and replies to it: at least 2 * count packets each way per port.
            rx, tx = (a - b for a, b in zip(after[pod], before[pod]))
            assert rx >= 2 * count and tx >= 2 * count, (i, pod, rx, tx)


def test_the_two_pods_ping_each_other_over_their_attached_interfaces(installed):
    with stage("pings over both rails"):
        check_pings(installed)


def test_driver_restart_while_pods_run_loses_nothing_and_moves_nothing_twice(installed):
    c, fabric = installed["c"], installed["fabric"]
    absent = sorted(fabric.absent())
    syncs = nri_syncs(c)
    old = installed["daemon"]["metadata"]["uid"]
    with stage("driver pod deleted -> new pod Ready, NRI plugin connected again"):
        c.kubectl("delete", "pod", "-n", NAMESPACE, installed["daemon"]["metadata"]["name"], "--wait=true")
        installed["daemon"] = wait_daemon_ready(c, not_uid=old)
        # Reconnected and synchronized: the moment a driver that lost track would move again.
        wait_nri_synced(c, syncs)
    for pod, p in installed["pods"].items():
        assert get_pod(c, pod)["status"]["phase"] == "Running"
        # Same links, not moved or reconfigured again (ifindex and carrier changes unchanged).
        assert {ifname: link_identity(c, pod, ifname) for ifname in p["nics"]} == p["identity"], pod
        assert network_data(c, p["claim"]) == p["network_data"]
    assert sorted(fabric.absent()) == absent
    check_pings(installed)


def test_deleting_a_pod_gives_its_nics_back_to_the_node(installed):
    c, fabric = installed["c"], installed["fabric"]
    mine = sorted(installed["pods"]["pb"]["nics"].values())
    with stage("pb deleted -> its NICs back in the node"):
        delete_pod(c, "pb")
        wait_for("pb's NICs back", lambda: not set(mine) & set(fabric.absent()), 120)
    now = fabric.nics()
    for n in mine:
        assert now[n] == fabric.initial[n], (now[n], fabric.initial[n])  # name, MTU, MAC, up
    # pa keeps its own.
    assert sorted(fabric.absent()) == sorted(installed["pods"]["pa"]["nics"].values())
    assert set(pod_network(c, "pa")["links"]) == {"lo", "eth0", "rail0", "rail1"}


def test_driver_restart_while_a_pod_is_being_deleted_gives_its_nics_back(installed):
    c, fabric = installed["c"], installed["fabric"]
    mine = sorted(installed["pods"]["pa"]["nics"].values())
    in_pod(c, "pa", "sh", "-c", ": > /tmp/hold")
    c.kubectl("delete", "pod", "-n", NS, "pa", "--wait=false")
    with stage("pa terminating (held) -> driver restarted, NRI plugin connected again"):
        wait_for("pa's preStop hook running", lambda: in_pod(c, "pa", "test", "-e", "/tmp/terminating",
                                                               check=False).returncode == 0, 120)
        syncs = nri_syncs(c)
        old = installed["daemon"]["metadata"]["uid"]
        c.kubectl("delete", "pod", "-n", NAMESPACE, installed["daemon"]["metadata"]["name"], "--wait=true")
        installed["daemon"] = wait_daemon_ready(c, not_uid=old)
        wait_nri_synced(c, syncs)
    # Still being deleted, the sandbox alive: the NICs are still the pod's.
    assert get_pod(c, "pa")["metadata"].get("deletionTimestamp")
    assert sorted(fabric.absent()) == mine
    with stage("pa released -> gone, its NICs back in the node"):
        in_pod(c, "pa", "busybox", "rm", "/tmp/hold")
        wait_for("pa gone", lambda: not pod_exists(c, "pa"), 180)
        nics_back_as_before(installed)


def test_a_pod_stopped_while_the_driver_was_away_is_said_so_once_not_attached_to(installed):
    """Issue 35 (minor): the driver is away while a pod's sandbox stops (a restart during its teardown);
    when it comes back, NRI's synchronize still lists the stopped sandbox, whose network namespace is gone.
    The driver says once that the pod is stopped instead of trying to attach into it (`attaching a running
    pod's NICs failed ... No such file or directory`), and the NIC comes home when the pod goes."""
    c, fabric = installed["c"], installed["fabric"]
    c.apply(template("net-pc", {"nic-a": rail(0, 3)}, gpus=False))
    c.apply(net_pod("pc", "net-pc"))
    wait_running(c, "pc")
    [netdev] = fabric.absent()
    initial = fabric.initial[netdev]
    in_pod(c, "pc", "sh", "-c", ": > /tmp/hold")
    c.kubectl("delete", "pod", "-n", NS, "pc", "--wait=false")
    wait_for("pc's preStop hook running", lambda: in_pod(c, "pc", "test", "-e", "/tmp/terminating",
                                                         check=False).returncode == 0, 120)
    syncs = nri_syncs(c)
    with stage("driver away (no node matches), pc's sandbox stopped meanwhile"):
        helm_upgrade(c, {**values(installed), "nodeSelector": {"topo-e2e/nowhere": "true"}})
        wait_for("no driver pod", lambda: not daemon_pods(c), 180)
        in_pod(c, "pc", "busybox", "rm", "/tmp/hold")
        wait_for("pc's network namespace gone", lambda: c.sb.sh("ls", "-A", "/var/run/netns", check=False)
                 .stdout.split() == [], 180)
    # A physical NIC goes back to the node's namespace when the pod's namespace goes (the kernel moves it,
    # possibly under another name); a veth end is destroyed instead. Stand in for the kernel.
    fabric.sb.sh("ip", "link", "del", f"{netdev}sw", check=False)
    fabric.sb.sh("ip", "link", "add", "eth9", "address", initial.mac, "mtu", str(initial.mtu), "type", "veth",
                 "peer", "name", f"{netdev}sw", "mtu", "9000")
    fabric.sb.sh("ip", "link", "set", f"{netdev}sw", "master", RAILS[0], "up")
    with stage("driver back, NRI plugin connected again"):
        helm_upgrade(c, values(installed))
        installed["daemon"] = wait_daemon_ready(c)
        wait_nri_synced(c, syncs)
    log = c.kubectl("logs", "-n", NAMESPACE, installed["daemon"]["metadata"]["name"]).stdout
    assert log.count("pod is stopped (its network namespace is gone)") == 1, daemon_log(c)
    assert "attaching a running pod's NICs failed" not in log, daemon_log(c)
    with stage("pc gone, its NIC back under its name"):
        wait_for("pc gone", lambda: not pod_exists(c, "pc"), 180)
        nics_back_as_before(installed)


def test_helm_uninstall_then_the_node_is_as_before_the_first_pod(installed):
    c, fabric = installed["c"], installed["fabric"]
    with stage("helm uninstall"):
        c.helm("uninstall", "tdp", "-n", NAMESPACE, "--wait")
        wait_for("claims gone", lambda: not c.get("resourceclaims", "-n", NS)["items"], 120)
    assert fabric.nics() == fabric.initial
    assert sorted(fabric.ports_present()) == sorted(f"{n}sw" for n in fabric.netdevs)
    # No link left over or missing in the node's namespace (the CNI bridge came with the first pod),
    # and no pod network namespace left behind.
    links = {x["ifname"] for x in fabric.links()} - {"cni0"}
    assert links == installed["links_before"]
    assert c.sb.sh("ls", "-A", "/var/run/netns", check=False).stdout.split() == []


def test_teardown_stops_everything_and_leaves_nothing(installed):
    down_and_check_nothing_left(installed["c"])
