"""Run tests/e2e/kind/run.sh through kind's podman provider, where no Docker engine exists.

    python tests/e2e/kind/kind_cluster.py run [--nodes 1|2]   # what run.sh calls by itself

It builds (cached) what the podman path needs: the node image (node_image.py), the project's
image (scripts/build_image.py) and a busybox image under the name the pod manifests use; then
it starts a namespace holder (podman_env.Holder: private mount, network and UTS namespaces, so
the `kind` bridge and its iptables rules stay off this machine's network), writes the kind
config for this host, and runs run.sh again inside the holder with KIND_PROVIDER=podman and
everything it needs in the environment. Afterwards it removes every container of the private
podman storage (they are all the cluster's) and kills the holder.

Exit codes are run.sh's: 0 pass, 1 fail, 77 skipped (the reason is printed as `SKIP: ...`).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests" / "kubelet"))
sys.path.insert(0, str(ROOT / "tests" / "e2e" / "cluster"))

import build_image
import kubelet_build
import node_image
import node_recipe
import podman_env

#: What this host needs on top of kind's own kubeadm config (each reason in the docs):
#: cgroup v1 (the 1.37 kubelet refuses it unless told; kubeadm's SystemVerification fails on
#: it), every image preloaded (never pull), no CoreDNS image (not built), no kindnetd (not
#: served by the module proxy: the runner writes a bridge CNI config per node instead).
KUBEADM_PATCHES = """kubeadmConfigPatches:
- |
  kind: InitConfiguration
  nodeRegistration:
    ignorePreflightErrors: [SystemVerification]
    imagePullPolicy: Never
- |
  kind: JoinConfiguration
  nodeRegistration:
    ignorePreflightErrors: [SystemVerification]
    imagePullPolicy: Never
- |
  kind: ClusterConfiguration
  dns:
    disabled: true
- |
  kind: KubeletConfiguration
  failCgroupV1: false
"""


def kind_config(nodes: int) -> str:
    """The kind config: run.sh's (kind-config.yaml) for two nodes, one labelled control plane for one."""
    head = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnetworking:\n  disableDefaultCNI: true\n"
    if nodes == 1:
        body = "nodes:\n  - role: control-plane\n    labels:\n      topo-e2e/gpu-node: \"true\"\n"
    else:
        text = (HERE / "kind-config.yaml").read_text()
        body = text[text.index("nodes:"):]
    return head + body + KUBEADM_PATCHES


def busybox_archive() -> pathlib.Path:
    """Debian's static busybox as `docker.io/library/busybox:1.36`, the name the pod manifests use."""
    out = node_image.cache_dir() / f"busybox-1.36-{node_image._key(kubelet_build.BUSYBOX.read_bytes())}.oci.tar"
    if not out.exists():
        pause = kubelet_build.pause_binary()
        with tempfile.TemporaryDirectory(dir=node_image.cache_dir()) as d:
            subprocess.run([sys.executable, str(ROOT / "tests/e2e/images/build_oci.py"), "--busybox",
                            str(kubelet_build.BUSYBOX), "--pause-bin", str(pause), "--busybox-name",
                            "docker.io/library/busybox:1.36", "--out", d], check=True, capture_output=True)
            os.replace(pathlib.Path(d) / "busybox.tar", out)
    return out


#: Debian packages the podman path needs (podman's network backend and its DNS for two nodes; the root filesystems).
PACKAGES = ("podman", "netavark", "aardvark-dns", "mmdebstrap")


def host_ready() -> None:
    """The project installs what it needs: the Debian packages, and the one host change the podman provider
    requires (an empty /lib/modules: kind bind-mounts it into every node and podman, unlike dockerd, does not
    create a missing bind source). Both only as root; without root the build says so (exit 77)."""
    if os.geteuid() != 0:
        return
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "debian_packages.sh"), *PACKAGES],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise node_image.Unavailable(f"installing {' '.join(PACKAGES)} failed:\n{proc.stderr[-2000:]}")
    if not os.path.isdir("/lib/modules"):
        os.mkdir("/lib/modules")
        print("[kind-node] created an empty /lib/modules (kind's podman provider bind-mounts it)", flush=True)


def prepare() -> dict[str, str]:
    """Everything run.sh's podman path needs, as environment variables."""
    host_ready()
    built = node_image.main_stages(["kind", "node"])
    kind = pathlib.Path(str(built["kind"]))
    img = build_image.build(build_image.default_cache())
    helm = node_image.cluster_build.helm()
    cp = node_image.controlplane()
    tools = pathlib.Path(tempfile.mkdtemp(prefix="kind-tools-", dir=node_image.cache_dir()))
    for name, src in (("kind", kind), ("kubectl", cp / "kubectl"), ("helm", helm)):
        os.symlink(src, tools / name)
    return {"KIND_TOOLS": str(tools), "KIND_NODE_IMAGE": node_recipe.NODE_IMAGE,
            "KIND_IMAGE_ARCHIVE": str(img.archive), "KIND_IMAGE": img.ref,
            "KIND_BUSYBOX_ARCHIVE": str(busybox_archive())}


def run(nodes: int) -> int:
    """Build, then run run.sh in a holder; one run at a time (the podman storage is shared)."""
    lock = node_image.cache_dir() / ".run.lock"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        return _run_locked(nodes)


def _run_locked(nodes: int) -> int:
    t0 = time.monotonic()
    try:
        env = prepare()
    except (node_image.Unavailable, build_image.Unavailable, kubelet_build.BuildUnavailable) as e:
        print(f"SKIP: the podman path of the kind e2e cannot be built here: {e}", flush=True)
        return 77
    print(f"== built (cached) the node image and tools (+{time.monotonic() - t0:.0f}s)", flush=True)
    if not os.path.isdir("/lib/modules"):
        print("SKIP: /lib/modules does not exist: kind's podman provider bind-mounts it into every node "
              "(create it: mkdir /lib/modules)", flush=True)
        return 77
    pm = node_image.podman()
    work = pathlib.Path(tempfile.mkdtemp(prefix="kind-run-", dir=node_image.cache_dir()))
    cfg = work / "kind-config.yaml"
    cfg.write_text(kind_config(nodes))
    holder = podman_env.Holder()
    holder.start()
    try:
        # A HOME and KUBECONFIG of the run's own: kind would otherwise write its context into
        # ~/.kube/config, and kubectl its discovery cache under ~/.kube, on this machine.
        (work / "home").mkdir()
        full = {**pm.env(), **env, "KIND_PROVIDER": "podman", "KIND_CONFIG": str(cfg), "KIND_NODES": str(nodes),
                "KUBECONFIG_FILE": str(work / "kubeconfig"), "KUBECONFIG": str(work / "kubeconfig"),
                "HOME": str(work / "home"),
                "PATH": f"{env['KIND_TOOLS']}:{os.environ.get('PATH', '')}"}
        # KEEP_CLUSTER=1 keeps the failed cluster's nodes long enough to export their logs.
        proc = subprocess.run([*holder.enter(), "bash", str(HERE / "run.sh")],
                              env={**os.environ, **full, "KEEP_CLUSTER": "1"})
        if proc.returncode not in (0, 77):
            logs = node_image.cache_dir() / "last-failure-logs"
            subprocess.run(["rm", "-rf", str(logs)], check=False)
            holder.sh(["kind", "export", "logs", str(logs), "--name", os.environ.get("KIND_CLUSTER", "topo-dp-e2e")],
                      env=full, check=False, timeout=600)
            print(f"the nodes' logs (kind export logs): {logs}", flush=True)
        holder.sh(["kind", "delete", "cluster", "--name", os.environ.get("KIND_CLUSTER", "topo-dp-e2e")],
                  env=full, check=False, timeout=600)
        return proc.returncode
    finally:
        # Every container in the private storage is this cluster's node: remove them all.
        holder.sh(["podman", "rm", "-f", "-a", "-v"], env=pm.env(), check=False, timeout=300)
        holder.sh(["podman", "volume", "prune", "-f"], env=pm.env(), check=False, timeout=300)
        holder.close()
        subprocess.run(["rm", "-rf", str(work), env["KIND_TOOLS"]], check=False)
        print(f"== removed the cluster's containers, volumes and holder ({time.monotonic() - t0:.0f}s in all)", flush=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="build (cached), then run run.sh inside a holder through podman")
    r.add_argument("--nodes", type=int, choices=(1, 2), default=int(os.environ.get("KIND_NODES", "2")),
                   help="2 (default): run.sh's kind-config.yaml, a control plane and a worker; 1: one node")
    a = ap.parse_args(argv[1:])
    return run(a.nodes)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
