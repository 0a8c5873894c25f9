"""Build (and cache) everything the real-kubelet tests need.

* the Go harness (`tests/kubelet/harness`, the kubelet's device manager + Topology
  Manager at the release pinned in its go.mod);
* the `kubelet` binary of that same release (for `tests/e2e`);
* the e2e pod images (Debian's busybox-static and a local pause), as OCI archives.

Everything lands under the cache directory (`$TOPO_DP_CACHE_DIR`, default
`~/.cache/topo-device-plugin`): Go modules, Go's build cache, and the outputs, each
keyed by a hash of its inputs, so a rerun with nothing changed builds nothing.

Command line (used by scripts/kubelet_tests.sh; prints one line per stage with its
wall time):

    python tests/kubelet/kubelet_build.py harness|kubelet|images|all
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HARNESS_DIR = HERE / "harness"
IMAGES_DIR = ROOT / "tests" / "e2e" / "images"
GO_CANDIDATES = ("/usr/local/go/bin/go",)
# The release the harness and the kubelet binary are built from (must match go.mod).
K8S_VERSION = "v1.32.10"


def cache_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("TOPO_DP_CACHE_DIR")
                     or pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "topo-device-plugin")
    d.mkdir(parents=True, exist_ok=True)
    return d


class BuildUnavailable(RuntimeError):
    """A tool the build needs cannot exist here (the message says which and why)."""


def find_go() -> str:
    go = shutil.which("go")
    if go:
        return go
    for c in GO_CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    raise BuildUnavailable("no Go toolchain (`go` not on PATH, not at /usr/local/go/bin/go)")


def go_env() -> dict[str, str]:
    c = cache_dir()
    env = dict(os.environ)
    go = find_go()
    env["PATH"] = str(pathlib.Path(go).parent) + os.pathsep + env.get("PATH", "")
    env.update(
        GOMODCACHE=str(c / "gomod"),
        GOCACHE=str(c / "gobuild"),
        GOTOOLCHAIN="local",
        # go.sum is committed; never edit it during a build.
        GOFLAGS="-mod=readonly -buildvcs=false",
    )
    return env


def _go_version(env: dict[str, str]) -> str:
    return subprocess.run([find_go(), "version"], env=env, capture_output=True, text=True, check=True).stdout.strip()


def _hash(paths: list[pathlib.Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for p in sorted(paths):
        h.update(str(p.relative_to(ROOT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _run(cmd: list[str], cwd: pathlib.Path, env: dict[str, str], what: str) -> None:
    nice = ["nice", "-n", "15"] if shutil.which("nice") else []
    proc = subprocess.run(nice + cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(cmd)}):\n{proc.stdout}\n{proc.stderr}")


def _atomic_build(out: pathlib.Path, build) -> pathlib.Path:
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    build(tmp)
    os.replace(tmp, out)
    _prune(out)
    return out


def _prune(out: pathlib.Path, keep: int = 2) -> None:
    """Keep the newest `keep` builds of this kind (binaries are ~80 MB each)."""
    prefix = out.name.rsplit("-", 1)[0] + "-"
    olds = sorted((p for p in out.parent.glob(prefix + "*") if p != out and ".tmp" not in p.name),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for p in olds[keep - 1:]:
        try:
            p.unlink()
        except OSError:
            pass


def download_modules() -> None:
    """`go mod download` of what the harness and the kubelet import (cached in GOMODCACHE)."""
    env = go_env()
    _run([find_go(), "mod", "download"], HARNESS_DIR, env, "go mod download")


def harness_binary() -> pathlib.Path:
    env = go_env()
    srcs = [HARNESS_DIR / "go.mod", HARNESS_DIR / "go.sum", *sorted((HARNESS_DIR / "cmd" / "harness").glob("*.go"))]
    key = _hash(srcs, _go_version(env))
    out = cache_dir() / "bin" / f"harness-{key}"

    def build(tmp: pathlib.Path) -> None:
        _run([find_go(), "build", "-trimpath", "-o", str(tmp), "./cmd/harness"], HARNESS_DIR, env, "building the harness")

    return _atomic_build(out, build)


def kubelet_binary() -> pathlib.Path:
    env = go_env()
    key = _hash([HARNESS_DIR / "go.mod", HARNESS_DIR / "go.sum"], _go_version(env))
    out = cache_dir() / "bin" / f"kubelet-{K8S_VERSION}-{key}"
    major, minor = K8S_VERSION.lstrip("v").split(".")[:2]
    ldflags = " ".join([
        "-s", "-w",
        f"-X k8s.io/component-base/version.gitVersion={K8S_VERSION}",
        f"-X k8s.io/component-base/version.gitMajor={major}",
        f"-X k8s.io/component-base/version.gitMinor={minor}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
    ])

    def build(tmp: pathlib.Path) -> None:
        _run([find_go(), "build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp), "k8s.io/kubernetes/cmd/kubelet"],
             HARNESS_DIR, env, "building the kubelet")

    return _atomic_build(out, build)


def pause_binary() -> pathlib.Path:
    env = go_env()
    env["CGO_ENABLED"] = "0"
    src = IMAGES_DIR / "pause"
    key = _hash([src / "main.go", src / "go.mod"], _go_version(env))
    out = cache_dir() / "bin" / f"pause-{key}"

    def build(tmp: pathlib.Path) -> None:
        _run([find_go(), "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), "."], src, env, "building pause")

    return _atomic_build(out, build)


BUSYBOX = pathlib.Path("/bin/busybox")


def e2e_images() -> dict[str, pathlib.Path]:
    """OCI archives of the busybox and pause images (busybox-static must be installed)."""
    if not BUSYBOX.exists():
        raise BuildUnavailable(f"{BUSYBOX} missing: install Debian's busybox-static (scripts/kubelet_tests.sh does)")
    pause = pause_binary()
    builder = IMAGES_DIR / "build_oci.py"
    key = _hash([builder], hashlib.sha256(BUSYBOX.read_bytes() + pause.read_bytes()).hexdigest())
    out = cache_dir() / "images" / key
    if not (out / "busybox.tar").exists() or not (out / "pause.tar").exists():
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(builder), "--busybox", str(BUSYBOX), "--pause-bin", str(pause),
                        "--out", str(out)], check=True, capture_output=True, text=True)
    return {"busybox": out / "busybox.tar", "pause": out / "pause.tar"}


def main(argv: list[str]) -> int:
    what = argv[1:] or ["all"]
    if what == ["all"]:
        what = ["modules", "harness", "kubelet", "images"]
    steps = {"modules": download_modules, "harness": harness_binary, "kubelet": kubelet_binary, "images": e2e_images}
    results = {}
    for w in what:
        t0 = time.monotonic()
        try:
            r = steps[w]()
        except BuildUnavailable as e:
            print(f"[kubelet-build] {w}: UNAVAILABLE: {e}", flush=True)
            return 3
        if isinstance(r, dict):
            r = {k: str(v) for k, v in r.items()}
        elif r is not None:
            r = str(r)
        results[w] = r
        print(f"[kubelet-build] {w}: {time.monotonic() - t0:.1f}s {'' if r is None else r}", flush=True)
    print(json.dumps({k: v for k, v in results.items() if v is not None}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
