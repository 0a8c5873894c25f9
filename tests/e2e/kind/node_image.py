"""Build (and cache) a kind node image here, with no registry and no Docker engine.

`kind build node-image` cannot run offline (it pulls its base and six images from inside its
build container and drives the `docker` CLI), so this script assembles a kind-compatible node
image itself, from pieces the project can build or install:

* the kind CLI (`kindcli/go.mod`, sigs.k8s.io/kind pinned) and kubeadm + kube-proxy
  (`nodetools/go.mod`, the control plane's Kubernetes release);
* containerd v2 with ctr (scripts/device/containerd: one binary, ctr by its name) and the runc
  shim (tests/e2e/dra/containerd-shim);
* the node's root filesystem (mmdebstrap, bookworm: systemd 252) and a shared glibc layer for
  the component images (node_recipe.py);
* the component images (kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
  etcd, pause) under the exact names kubeadm expects, preloaded into the node's containerd;
* the node image itself in a private podman storage (`podman_env()`), named
  node_recipe.NODE_IMAGE.

Every output lands under $TOPO_DP_CACHE_DIR (default ~/.cache/topo-device-plugin)/kind, keyed
by a hash of its inputs, so a rerun with nothing changed builds nothing.

    python tests/e2e/kind/node_image.py build     # every stage, one line each with its time
    python tests/e2e/kind/node_image.py env       # the podman environment, as shell exports

Exit codes: 0 built, 3 something this needs cannot exist here (the message says what), 1 a
build failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "e2e" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "kubelet"))

import build_cache
import cluster_build
import kubelet_build
import component_images
import node_recipe
import podman_env

NODE_FILES = HERE / "node"
NODETOOLS_DIR = HERE / "nodetools"
KINDCLI_DIR = HERE / "kindcli"
#: What nodetools/go.mod builds, by the name kubeadm and the node expect.
NODETOOLS = {"kubeadm": "k8s.io/kubernetes/cmd/kubeadm", "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy"}


class Unavailable(RuntimeError):
    """Something the build needs cannot exist on this machine (not root, no Go, no podman)."""


def cache_dir() -> pathlib.Path:
    return build_cache.subdir("kind")


_key = build_cache.content_key


def _run(argv: list[str], what: str, env: dict[str, str] | None = None,
         input_bytes: bytes | None = None, timeout: float = 3600) -> str:
    proc = subprocess.run(["nice", "-n", "10", *argv], capture_output=True, env=env, input=input_bytes,
                          timeout=timeout)
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {' '.join(argv)}\n{out[-3000:]}\n{err[-5000:]}")
    return out


def _atomic(out: pathlib.Path, make: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """Make `out` through a temporary sibling, so an interrupted build leaves nothing half-made."""
    if out.exists():
        return out
    # mmdebstrap writes a tarball only to a name ending in .tar.
    tmp = out.with_name(f".{out.stem}.tmp{os.getpid()}.tar" if out.suffix == ".tar" else f".{out.name}.tmp{os.getpid()}")
    try:
        make(tmp)
        os.replace(tmp, out)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
    return out


# ---- root file systems (mmdebstrap) ---------------------------------------------------------


def _mmdebstrap(recipe: dict, name: str) -> pathlib.Path:
    """A tarball of `recipe`'s bookworm root filesystem, cached by the recipe's hash."""
    if os.geteuid() != 0:
        raise Unavailable("mmdebstrap and podman run as root here; run the build as root")
    if shutil.which("mmdebstrap") is None:
        raise Unavailable("mmdebstrap is not installed (Debian's mmdebstrap)")
    out = cache_dir() / f"{name}-{_key(json.dumps(recipe, sort_keys=True).encode())}.tar"

    def make(tmp: pathlib.Path) -> None:
        _run(["mmdebstrap", f"--variant={recipe['variant']}", "--include=" + ",".join(recipe["packages"]),
              "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", "--skip=output/mknod",
              *[f"--dpkgopt=path-exclude={p}" for p in recipe["path_exclude"]],
              recipe["suite"], str(tmp), *recipe["sources"]], f"mmdebstrap ({name})")

    return _atomic(out, make)


def rootfs() -> pathlib.Path:
    return _mmdebstrap(node_recipe.ROOTFS_RECIPE, "node-rootfs")


def component_base() -> pathlib.Path:
    return _mmdebstrap(node_recipe.COMPONENT_BASE_RECIPE, "component-base")


# ---- Go programs -----------------------------------------------------------------------------


def _go_build_cached(directory: pathlib.Path, name: str, package: str = ".") -> pathlib.Path:
    """A program built (and cached) by scripts/go_build_cached.sh, as the other e2e tools are."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "go_build_cached.sh"), str(directory), name, package],
                          capture_output=True, text=True, env={**os.environ, "NICE": "10"})
    if proc.returncode == 3:
        raise Unavailable(proc.stderr.strip()[-500:])
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"building {name} from {directory} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return pathlib.Path(proc.stdout.strip().splitlines()[-1])


def kind_cli() -> pathlib.Path:
    """The kind CLI at the version kindcli/go.mod pins."""
    return _go_build_cached(KINDCLI_DIR, "kind", "sigs.k8s.io/kind")


def nodetools() -> pathlib.Path:
    """A directory holding kubeadm and kube-proxy, built like the control plane (same flags, same cache)."""
    try:
        env = kubelet_build.go_env()
    except kubelet_build.BuildUnavailable as e:
        raise Unavailable(str(e)) from e
    version = node_recipe.KUBERNETES_VERSION
    ldflags = cluster_build.version_ldflags(version)
    key = kubelet_build._hash([NODETOOLS_DIR / "go.mod", NODETOOLS_DIR / "go.sum"],
                              kubelet_build._go_version(env) + ldflags + json.dumps(NODETOOLS))
    out = kubelet_build.cache_dir() / "bin" / f"nodetools-{version}-{key}"

    def make(tmp: pathlib.Path) -> None:
        tmp.mkdir(parents=True)
        _run([kubelet_build.find_go(), "build", "-C", str(NODETOOLS_DIR), "-trimpath", "-ldflags", ldflags,
              "-o", str(tmp) + "/", *NODETOOLS.values()], "building kubeadm and kube-proxy", env=env)
        missing = sorted(set(NODETOOLS) - {p.name for p in tmp.iterdir()})
        if missing:
            raise RuntimeError(f"the nodetools build produced no {', '.join(missing)}")

    return _atomic(out, make)


def controlplane() -> pathlib.Path:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (tests/e2e/cluster's build)."""
    if cluster_build.controlplane_version() != node_recipe.KUBERNETES_VERSION:
        raise RuntimeError(f"tests/e2e/cluster/controlplane builds {cluster_build.controlplane_version()}, "
                           f"node_recipe.KUBERNETES_VERSION is {node_recipe.KUBERNETES_VERSION}: make them agree")
    return cluster_build.controlplane()


# ---- containerd, kubelet, pause ---------------------------------------------------------------


def containerd() -> dict[str, str]:
    """containerd v2 with ctr in one binary (ctr by name), and its runc shim."""
    return {"containerd": str(_go_build_cached(ROOT / "scripts" / "device" / "containerd", "containerd-ctr-v2")),
            "shim": str(_go_build_cached(ROOT / "tests" / "e2e" / "dra" / "containerd-shim", "containerd-shim-v2"))}


def kubelet() -> pathlib.Path:
    try:
        return cluster_build.kubelet()
    except kubelet_build.BuildUnavailable as e:
        raise Unavailable(str(e)) from e


# ---- component images -----------------------------------------------------------------------


def kubeadm_images(kubeadm: pathlib.Path) -> list[str]:
    """The images kubeadm will ask the node's containerd for (`kubeadm config images list`)."""
    out = _run([str(kubeadm), "config", "images", "list", "--kubernetes-version", node_recipe.KUBERNETES_VERSION],
               "kubeadm config images list")
    return [line.strip() for line in out.splitlines() if line.strip()]


def _component_for(image: str, cp: pathlib.Path, tools: pathlib.Path, pause: pathlib.Path) -> component_images.Component | None:
    repo = image.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    if repo in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
        return component_images.Component(image, {repo: cp / repo})
    if repo == "kube-proxy":
        return component_images.Component(image, {repo: tools / repo})
    if repo == "pause":
        return component_images.Component(image, {"pause": pause}, entrypoint=["/usr/local/bin/pause"],
                                          with_base=False)
    return None  # CoreDNS: not built; the cluster runs with dns.disabled


def images() -> dict[str, object]:
    """One OCI archive with every image kubeadm names (but CoreDNS) plus containerd's sandbox pause."""
    cp, tools, base = controlplane(), nodetools(), component_base()
    try:
        pause = kubelet_build.pause_binary()
    except kubelet_build.BuildUnavailable as e:
        raise Unavailable(str(e)) from e
    wanted = kubeadm_images(tools / "kubeadm")
    if node_recipe.SANDBOX_IMAGE not in wanted:
        wanted.append(node_recipe.SANDBOX_IMAGE)
    comps = [c for c in (_component_for(i, cp, tools, pause) for i in wanted) if c is not None]
    skipped = sorted(set(wanted) - {c.name for c in comps})
    key = _key(base.name.encode(), cp.name.encode(), tools.name.encode(), pause.name.encode(),
               json.dumps(wanted).encode(), (HERE / "component_images.py").read_bytes())
    out = cache_dir() / f"components-{key}.oci.tar"

    def make(tmp: pathlib.Path) -> None:
        work = pathlib.Path(tempfile.mkdtemp(dir=cache_dir()))
        try:
            component_images.write_archive(tmp, base, comps, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    _atomic(out, make)
    _prune("components-", out)
    return {"archive": str(out), "images": [c.name for c in comps], "not_built": skipped}


def _prune(prefix: str, keep: pathlib.Path) -> None:
    for p in cache_dir().glob(prefix + "*"):
        if p != keep and not p.name.startswith("."):
            p.unlink()


# ---- the node image -------------------------------------------------------------------------

#: systemd units the node must not start (a container has no udev, gettys or binfmt to set up),
#: removed from the rootfs as kind's base image removes them.
UNWANTED = ("etc/systemd/system/*.wants/*", "usr/lib/systemd/system/multi-user.target.wants/*",
            "usr/lib/systemd/system/local-fs.target.wants/*", "usr/lib/systemd/system/sockets.target.wants/*udev*",
            "usr/lib/systemd/system/sockets.target.wants/*initctl*", "usr/lib/systemd/system/basic.target.wants/*",
            "usr/lib/systemd/system/sysinit.target.wants/systemd-tmpfiles-setup.service")
ENTRYPOINT = '["/usr/local/bin/entrypoint", "/sbin/init"]'


def podman() -> podman_env.PodmanEnv:
    if shutil.which("podman") is None:
        raise Unavailable("podman is not installed (Debian's podman, netavark, aardvark-dns)")
    return podman_env.PodmanEnv(cache_dir() / "podman")


def _node_files_key() -> bytes:
    h = hashlib.sha256()
    for p in sorted(NODE_FILES.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(NODE_FILES)).encode() + b"\0" + p.read_bytes())
    return h.digest()


def _preload(holder: podman_env.Holder, ctrd: dict[str, str], root: pathlib.Path, archive: pathlib.Path) -> None:
    """Import `archive` into the containerd store of the node's /var/lib/containerd.

    The store is written by this machine's build of the node's containerd (same binary, same
    schema), run in the holder; inside a podman container the snapshotter would sit on overlay.
    """
    state = "/run/topo-kind/preload"
    sock = f"{state}/containerd.sock"
    cfg = cache_dir() / "preload-containerd.toml"
    cfg.write_text(f'version = 2\nroot = "{root / "var/lib/containerd"}"\nstate = "{state}"\n'
                   f'[grpc]\n  address = "{sock}"\n')
    holder.sh(["mkdir", "-p", state])
    daemon = subprocess.Popen([*holder.enter(), ctrd["containerd"], "--config", str(cfg)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    ctr = pathlib.Path(state) / "ctr"
    holder.sh(["ln", "-sf", ctrd["containerd"], str(ctr)])
    try:
        deadline = time.monotonic() + 120
        while holder.sh([str(ctr), "--address", sock, "version"], check=False).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                err = daemon.stderr.read().decode(errors="replace") if daemon.stderr else ""
                raise RuntimeError(f"the preload containerd did not come up:\n{err[-3000:]}")
            time.sleep(0.5)
        # As kind's node-image builder imports: every platform, no unpacking, pinned against GC.
        holder.sh(["nice", "-n", "10", str(ctr), "--address", sock, "-n", "k8s.io", "images", "import",
                   "--all-platforms", "--no-unpack", "--digests", "--label", "io.cri-containerd.pinned=pinned",
                   str(archive)], timeout=1800)
    finally:
        daemon.terminate()
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(30)


def node() -> dict[str, str]:
    """The node image in the private podman storage, tagged node_recipe.NODE_IMAGE."""
    pm = podman()
    base, imgs, ctrd, klet, cp, tools = rootfs(), images(), containerd(), kubelet(), controlplane(), nodetools()
    archive = pathlib.Path(str(imgs["archive"]))
    key = _key(base.name.encode(), archive.name.encode(), json.dumps(ctrd, sort_keys=True).encode(),
               klet.name.encode(), cp.name.encode(), tools.name.encode(), _node_files_key(),
               json.dumps([UNWANTED, ENTRYPOINT]).encode(), (HERE / "node_image.py").read_bytes())
    tag = f"{node_recipe.NODE_IMAGE}-{key}"
    holder = podman_env.Holder()
    holder.start()
    try:
        env = pm.env()
        if holder.sh(["podman", "image", "exists", tag], env=env, check=False).returncode != 0:
            work = pathlib.Path(tempfile.mkdtemp(prefix="node-", dir=cache_dir()))
            try:
                tree = work / "rootfs"
                tree.mkdir()
                _run(["tar", "-xf", str(base), "-C", str(tree), "--numeric-owner"], "unpacking the node rootfs")
                _run(["cp", "-a", f"{NODE_FILES}/.", str(tree)], "adding the node's files")
                for name, src in (("kubelet", klet), ("kubeadm", tools / "kubeadm"), ("kubectl", cp / "kubectl")):
                    shutil.copy2(src, tree / "usr/bin" / name)
                shutil.copy2(ctrd["containerd"], tree / "usr/local/bin/containerd")
                os.symlink("containerd", tree / "usr/local/bin/ctr")
                shutil.copy2(ctrd["shim"], tree / "usr/local/bin/containerd-shim-runc-v2")
                # The CNI plugins where containerd's config (and kind) look for them.
                (tree / "opt/cni").mkdir(parents=True, exist_ok=True)
                os.symlink("/usr/lib/cni", tree / "opt/cni/bin")
                for d in ("etc/kubernetes/manifests", "etc/cni/net.d", "kind"):
                    (tree / d).mkdir(parents=True, exist_ok=True)
                (tree / "kind/version").write_text(node_recipe.KUBERNETES_VERSION + "\n")
                for pattern in UNWANTED:
                    for p in tree.glob(pattern):
                        p.unlink()
                with open(tree / "etc/systemd/journald.conf", "a") as f:
                    f.write("ReadKMsg=no\n")
                _run(["systemctl", f"--root={tree}", "enable", "containerd.service", "kubelet.service"],
                     "enabling containerd and the kubelet")
                _run(["systemctl", f"--root={tree}", "mask", "systemd-binfmt.service"], "masking systemd-binfmt")
                _preload(holder, ctrd, tree, archive)
                # Nothing of this machine's run-time state goes into the image.
                shutil.rmtree(tree / "var/lib/containerd/io.containerd.snapshotter.v1.overlayfs", ignore_errors=True)
                holder.sh(["sh", "-c", f"tar -C {tree} --numeric-owner -cf - . | nice -n 10 podman import "
                           f"--change 'ENTRYPOINT {ENTRYPOINT}' --change 'ENV container=docker' "
                           f"--change 'STOPSIGNAL SIGRTMIN+3' - {tag}"], env=env, timeout=1800)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        holder.sh(["podman", "tag", tag, node_recipe.NODE_IMAGE], env=env)
        # Node images of older inputs: only the newest is kept (each is about 1 GB).
        listed = holder.sh(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"], env=env).stdout.decode()
        stale = [t for t in listed.split() if t.startswith(node_recipe.NODE_IMAGE + "-") and t != tag]
        if stale:
            holder.sh(["podman", "rmi", *stale], env=env, check=False)
    finally:
        holder.close()
    return {"image": node_recipe.NODE_IMAGE, "tag": tag}


STAGES: dict[str, Callable[[], object]] = {
    "kind": kind_cli,
    "controlplane": controlplane,
    "nodetools": nodetools,
    "containerd": containerd,
    "kubelet": kubelet,
    "rootfs": rootfs,
    "component-base": component_base,
    "images": images,
    "node": node,
}


def main_stages(what: list[str]) -> dict[str, object]:
    """Run `what` (stage names) in order, one line each with its wall time; return their outputs."""
    results: dict[str, object] = {}
    for w in what:
        t0 = time.monotonic()
        r = STAGES[w]()
        results[w] = r if isinstance(r, (dict, str)) or r is None else str(r)
        print(f"[kind-node] {w}: {time.monotonic() - t0:.1f}s {'' if r is None else results[w]}", flush=True)
    return results


def main(argv: list[str]) -> int:
    what = argv[1:] or ["build"]
    if what == ["build"]:
        what = list(STAGES)
    unknown = [w for w in what if w not in STAGES]
    if unknown:
        print(f"unknown stage {unknown[0]!r}; stages: build, {', '.join(STAGES)}", file=sys.stderr)
        return 2
    try:
        results = main_stages(what)
    except Unavailable as e:
        print(f"[kind-node] UNAVAILABLE: {e}", flush=True)
        return 3
    except RuntimeError as e:
        print(f"[kind-node] FAILED: {e}", flush=True)
        return 1
    print(json.dumps({k: v for k, v in results.items() if v is not None}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
