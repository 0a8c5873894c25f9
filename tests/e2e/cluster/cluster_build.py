"""Build (and cache) what the local-cluster e2e (tests/e2e/cluster) needs.

* the control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
  kubectl, built from the Kubernetes release the kubelet is built from, in a go.mod of its
  own (`controlplane/go.mod`: the harness's go.mod pins what the harness links);
* the kubelet binary of that release;
* the project's image (scripts/build_image.py: Debian's buildah on a mmdebstrap base);
* the Debian packages the cluster runs on (containerd, runc, the CNI plugins).

Outputs land under the shared cache directory (`$TOPO_DP_CACHE_DIR`, default
`~/.cache/topo-device-plugin`), keyed by a hash of their inputs: a rerun with nothing
changed builds nothing.

    python tests/e2e/cluster/cluster_build.py packages|controlplane|kubelet|image|prepare

prints one line per stage with its wall time, then a JSON object of the outputs.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
CONTROLPLANE_DIR = HERE / "controlplane"
sys.path.insert(0, str(ROOT / "tests" / "kubelet"))
sys.path.insert(0, str(ROOT / "scripts"))

import build_image
import kubelet_build
from kubelet_build import BuildUnavailable

#: The control-plane programs and the Go packages they are built from.
PROGRAMS = {
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
}
#: What the cluster runs on and the image is built with (Debian bookworm packages).
PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iproute2", "openssl", "util-linux",
            "busybox-static", *build_image.TOOLS.values())
CNI_BIN_DIRS = ("/usr/lib/cni", "/usr/libexec/cni", "/opt/cni/bin")


def controlplane_version() -> str:
    """The `k8s.io/kubernetes` version controlplane/go.mod requires."""
    m = re.search(r"^(?:require)?\s*k8s\.io/kubernetes (v[0-9][^\s/]*)", (CONTROLPLANE_DIR / "go.mod").read_text(), re.M)
    if not m:
        raise RuntimeError(f"{CONTROLPLANE_DIR / 'go.mod'} does not require k8s.io/kubernetes")
    return m.group(1)


def version_ldflags(version: str) -> str:
    """What `kubectl version` and the API server's /version report (as release builds set them)."""
    major, minor = version.lstrip("v").split(".")[:2]
    return " ".join([
        "-s", "-w",
        f"-X k8s.io/component-base/version.gitVersion={version}",
        f"-X k8s.io/component-base/version.gitMajor={major}",
        f"-X k8s.io/component-base/version.gitMinor={minor}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
        # kubectl reads its own copy of the version variables.
        f"-X k8s.io/client-go/pkg/version.gitVersion={version}",
        f"-X k8s.io/client-go/pkg/version.gitMajor={major}",
        f"-X k8s.io/client-go/pkg/version.gitMinor={minor}",
    ])


def _go_build(packages: list[str], out_dir: pathlib.Path, version: str, what: str) -> None:
    # The kubelet's build environment and flags (-trimpath, cgo as the toolchain defaults): the
    # packages both link (most of k8s.io/kubernetes, client-go, apiserver) come from Go's
    # build cache instead of being compiled twice.
    env = kubelet_build.go_env()
    kubelet_build._run([kubelet_build.find_go(), "build", "-trimpath", "-ldflags", version_ldflags(version),
                        "-o", str(out_dir) + "/", *packages], CONTROLPLANE_DIR, env, what)


def controlplane() -> pathlib.Path:
    """A directory holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl."""
    env = kubelet_build.go_env()
    version = controlplane_version()
    key = kubelet_build._hash([CONTROLPLANE_DIR / "go.mod", CONTROLPLANE_DIR / "go.sum"],
                              kubelet_build._go_version(env) + version_ldflags(version) + json.dumps(PROGRAMS))
    out = kubelet_build.cache_dir() / "bin" / f"controlplane-{version}-{key}"

    def build(tmp: pathlib.Path) -> None:
        tmp.mkdir(parents=True)
        _go_build(list(PROGRAMS.values()), tmp, version, "building the control plane")
        built = {p.name for p in tmp.iterdir()}
        # `go build` names the etcd binary after its module path ("server" of .../server/v3).
        if "etcd" not in built and "server" in built:
            os.replace(tmp / "server", tmp / "etcd")
        missing = sorted(set(PROGRAMS) - {p.name for p in tmp.iterdir()})
        if missing:
            raise RuntimeError(f"the control-plane build produced no {', '.join(missing)}")

    return kubelet_build._atomic_build(out, build, "controlplane-")


def kubelet() -> pathlib.Path:
    """The kubelet the real-kubelet tests build (tests/kubelet/kubelet_build.py), at the control plane's release."""
    version = controlplane_version()
    built = kubelet_build.line("current").kubernetes
    if built != version:
        raise RuntimeError(f"the kubelet is built at {built} (tests/kubelet), the control plane at {version} "
                           f"({CONTROLPLANE_DIR / 'go.mod'}): make them agree")
    return kubelet_build.kubelet_binary()


def packages() -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "debian_packages.sh"), *PACKAGES],
                          capture_output=True, text=True)
    if proc.returncode == 3:
        raise BuildUnavailable(proc.stderr.strip())
    if proc.returncode != 0:
        raise RuntimeError(f"installing {' '.join(PACKAGES)} failed:\n{proc.stdout}\n{proc.stderr}")


def cni_bin_dir() -> pathlib.Path:
    for d in CNI_BIN_DIRS:
        if all(os.access(os.path.join(d, p), os.X_OK) for p in ("bridge", "host-local", "loopback")):
            return pathlib.Path(d)
    raise BuildUnavailable("no CNI plugins (bridge, host-local, loopback) in " + ", ".join(CNI_BIN_DIRS)
                           + ": install Debian's containernetworking-plugins")


def helm() -> pathlib.Path:
    """The helm the project builds (scripts/install_helm.sh), shared with tests/chart."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install_helm.sh")], capture_output=True, text=True)
    if proc.returncode == 3:
        raise BuildUnavailable(proc.stderr.strip())
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"scripts/install_helm.sh failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return pathlib.Path(proc.stdout.strip().splitlines()[-1])


def image() -> dict[str, str]:
    result = build_image.build(build_image.default_cache())
    return {"archive": str(result.archive), "ref": result.ref}


def main(argv: list[str]) -> int:
    what = argv[1:] or ["prepare"]
    if what == ["prepare"]:
        what = ["packages", "controlplane", "kubelet", "helm", "image"]
    steps = {"packages": packages, "controlplane": controlplane, "kubelet": kubelet, "helm": helm, "image": image}
    results = {}
    for w in what:
        t0 = time.monotonic()
        try:
            r = steps[w]()
        except (BuildUnavailable, build_image.Unavailable) as e:
            print(f"[cluster-build] {w}: UNAVAILABLE: {e}", flush=True)
            return 3
        results[w] = None if r is None else (r if isinstance(r, dict) else str(r))
        print(f"[cluster-build] {w}: {time.monotonic() - t0:.1f}s {'' if r is None else results[w]}", flush=True)
    print(json.dumps({k: v for k, v in results.items() if v is not None}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
