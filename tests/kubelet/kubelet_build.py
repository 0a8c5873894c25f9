"""Build (and cache) everything the real-kubelet tests need.

* the Go harness (`tests/kubelet/harness`: the kubelet's device manager + Topology
  Manager), once per Kubernetes line of `k8s_versions.json` ("current" and "race",
  each with its own go.mod and build tags, sharing the Go sources and Go's caches);
* the `kubelet` binary of the current line (for `tests/e2e` and the cluster tests);
* the e2e pod images (Debian's busybox-static and a local pause), as OCI archives.

Everything lands under the cache directory (`$TOPO_DP_CACHE_DIR`, default
`~/.cache/topo-device-plugin`): Go modules, Go's build cache, and the outputs, each
keyed by a hash of its inputs, so a rerun with nothing changed builds nothing.

Command line (used by scripts/kubelet_tests.sh; prints one line per stage with its
wall time):

    python tests/kubelet/kubelet_build.py modules|harness|kubelet|images|all
    python tests/kubelet/kubelet_build.py harness:race      # one line only
    python tests/kubelet/kubelet_build.py sync-gomod [LINE] # maintainers: rewrite a go.mod/go.sum
                                                            # from k8s_versions.json
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

import build_cache  # scripts/, put on the path just above

HARNESS_DIR = HERE / "harness"
HARNESS_PKG = "./cmd/harness"
IMAGES_DIR = ROOT / "tests" / "e2e" / "images"
GO_CANDIDATES = ("/usr/local/go/bin/go",)
#: The one place the Kubernetes versions are written down (a test checks every other mention).
VERSIONS_FILE = HERE / "k8s_versions.json"
LINES = ("current", "race")


@dataclass(frozen=True)
class Line:
    """One Kubernetes release line the harness is built against."""

    name: str
    #: The k8s.io/kubernetes module version, "v1.X.Y".
    kubernetes: str
    #: The matching staging modules' version (k8s.io/api, k8s.io/kubelet, ...), "v0.X.Y".
    staging: str
    #: This line's go.mod (the harness module's own go.mod for "current", an alternate
    #: one passed with -modfile otherwise; its go.sum sits next to it).
    gomod: pathlib.Path
    build_tags: str

    @property
    def gosum(self) -> pathlib.Path:
        return self.gomod.with_suffix(".sum")

    @property
    def minor(self) -> str:
        """"1.X" for v1.X.Y."""
        return ".".join(self.kubernetes.lstrip("v").split(".")[:2])

    def modfile_flags(self) -> list[str]:
        return [] if self.gomod == HARNESS_DIR / "go.mod" else [f"-modfile={self.gomod}"]

    def go_flags(self) -> list[str]:
        """Flags for `go build`: this line's go.mod and build tags."""
        return self.modfile_flags() + ([f"-tags={self.build_tags}"] if self.build_tags else [])


def versions() -> dict[str, Line]:
    """The lines of k8s_versions.json, checked for shape."""
    raw = json.loads(VERSIONS_FILE.read_text())
    out = {}
    for name in LINES:
        entry = raw.get(name)
        if not isinstance(entry, dict):
            raise ValueError(f"{VERSIONS_FILE}: no {name!r} line")
        k8s, staging = str(entry.get("kubernetes", "")), str(entry.get("staging", ""))
        m = re.fullmatch(r"v1\.(\d+)\.(\d+)", k8s)
        if not m or staging != f"v0.{m[1]}.{m[2]}":
            raise ValueError(f"{VERSIONS_FILE}: {name}: kubernetes {k8s!r} / staging {staging!r} "
                             "must look like v1.X.Y / v0.X.Y")
        out[name] = Line(name, k8s, staging, (HERE / str(entry["gomod"])).resolve(), str(entry.get("build_tags", "")))
    return out


def line(name: str = "current") -> Line:
    lines = versions()
    if name not in lines:
        raise ValueError(f"unknown Kubernetes line {name!r} (known: {', '.join(lines)})")
    return lines[name]


def cache_dir() -> pathlib.Path:
    return build_cache.root()


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


def _atomic_build(out: pathlib.Path, build, keep_prefix: str) -> pathlib.Path:
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    build(tmp)
    os.replace(tmp, out)
    _prune(out, keep_prefix)
    return out


def _prune(out: pathlib.Path, prefix: str, keep: int = 2) -> None:
    """Keep the newest `keep` builds named `prefix*` (binaries are ~80 MB each; a build may be a directory)."""
    olds = sorted((p for p in out.parent.glob(prefix + "*") if p != out and ".tmp" not in p.name),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for p in olds[keep - 1:]:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def download_modules(name: str = "current") -> None:
    """Download the modules of one line's go.mod into GOMODCACHE (both lines share it)."""
    ln = line(name)
    _run([find_go(), "mod", "download", *ln.modfile_flags()], HARNESS_DIR, go_env(), f"go mod download ({name})")


def harness_binary_path(name: str = "current") -> pathlib.Path:
    """Where the harness of one line is cached (keyed by its sources, go.mod/go.sum and Go)."""
    ln = line(name)
    srcs = [ln.gomod, ln.gosum, *sorted((HARNESS_DIR / "cmd" / "harness").glob("*.go"))]
    # The line's go.mod is among `srcs` (hashed under its path relative to the checkout), so the
    # build tags are all the flags add; the flags themselves hold the checkout's absolute -modfile
    # path, which made every clone rebuild the race line (and prune another clone's build).
    key = _hash(srcs, f"{_go_version(go_env())} tags={ln.build_tags}")
    return cache_dir() / "bin" / f"harness-{name}-{ln.kubernetes}-{key}"


def harness_binary(name: str = "current") -> pathlib.Path:
    """The harness built against one line (`-modfile`/`-tags` from k8s_versions.json)."""
    ln = line(name)
    env = go_env()
    out = harness_binary_path(name)

    def build(tmp: pathlib.Path) -> None:
        _run([find_go(), "build", *ln.go_flags(), "-trimpath", "-o", str(tmp), HARNESS_PKG], HARNESS_DIR, env,
             f"building the harness ({name}, {ln.kubernetes})")

    return _atomic_build(out, build, f"harness-{name}-")


def kubelet_binary_path() -> pathlib.Path:
    ln = line("current")
    key = _hash([ln.gomod, ln.gosum], _go_version(go_env()))
    return cache_dir() / "bin" / f"kubelet-current-{ln.kubernetes}-{key}"


def kubelet_binary() -> pathlib.Path:
    """The kubelet of the current line (the `tool` of harness/go.mod), stamped with its version."""
    ln = line("current")
    env = go_env()
    out = kubelet_binary_path()
    major, minor = ln.minor.split(".")
    ldflags = " ".join([
        "-s", "-w",
        f"-X k8s.io/component-base/version.gitVersion={ln.kubernetes}",
        f"-X k8s.io/component-base/version.gitMajor={major}",
        f"-X k8s.io/component-base/version.gitMinor={minor}",
        "-X k8s.io/component-base/version.gitTreeState=clean",
    ])

    def build(tmp: pathlib.Path) -> None:
        _run([find_go(), "build", *ln.go_flags(), "-trimpath", "-ldflags", ldflags, "-o", str(tmp),
              "k8s.io/kubernetes/cmd/kubelet"], HARNESS_DIR, env, f"building the kubelet ({ln.kubernetes})")

    return _atomic_build(out, build, "kubelet-current-")


def pause_binary() -> pathlib.Path:
    env = go_env()
    env["CGO_ENABLED"] = "0"
    src = IMAGES_DIR / "pause"
    key = _hash([src / "main.go", src / "go.mod"], _go_version(env))
    out = cache_dir() / "bin" / f"pause-{key}"

    def build(tmp: pathlib.Path) -> None:
        _run([find_go(), "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), "."], src, env, "building pause")

    return _atomic_build(out, build, "pause-")


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


# ---------------------------------------------------------------- maintainers: go.mod from the versions file

def _build_constraint_ok(src: str, tags: set[str]) -> bool:
    """Whether a Go file's `//go:build` line (only `TAG` / `!TAG` are used here) selects it."""
    m = re.search(r"^//go:build (\S+)$", src, re.M)
    if not m:
        return True
    expr = m[1]
    return expr[1:] not in tags if expr.startswith("!") else expr in tags


def sync_gomod(name: str) -> None:
    """Rewrite one line's go.mod/go.sum for the versions in k8s_versions.json.

    k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
    ./staging/...; a consumer replaces each with the release's staging version. The list,
    the `go` and `godebug` directives come from that release's own go.mod. `go mod tidy`
    runs on a copy of the sources holding only the files this line's build tags select
    (tidy reads every file whatever its tags, and the lines import different packages).
    """
    ln = line(name)
    env = go_env()
    env["GOFLAGS"] = "-mod=mod -buildvcs=false"
    go = find_go()
    info = json.loads(subprocess.run([go, "mod", "download", "-json", f"k8s.io/kubernetes@{ln.kubernetes}"],
                                     env=env, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir()
                                     ).stdout)
    upstream = pathlib.Path(info["GoMod"]).read_text()
    staging = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", upstream, re.M)))
    go_directive = re.search(r"^go (\S+)$", upstream, re.M)[1]
    godebug = re.search(r"^godebug (\S+)$", upstream, re.M)
    module = re.search(r"^module (\S+)$", (HARNESS_DIR / "go.mod").read_text(), re.M)[1]
    tools = "\n// The real kubelet binary for tests/e2e is built from this same pinned release.\n" \
            "tool k8s.io/kubernetes/cmd/kubelet\n" if name == "current" else ""
    text = (f"// Kubernetes {ln.kubernetes} ({name} line of tests/kubelet/k8s_versions.json),\n"
            f"// written by `python tests/kubelet/kubelet_build.py sync-gomod {name}`.\n"
            f"module {module}\n\ngo {go_directive}\n\n"
            + (f"// Same GODEBUG defaults as the pinned release builds with.\ngodebug {godebug[1]}\n" if godebug else "")
            + tools
            + f"\nrequire k8s.io/kubernetes {ln.kubernetes}\n\nreplace (\n"
            + "".join(f"\t{m} => {m} {ln.staging}\n" for m in staging) + ")\n")
    tags = set(filter(None, ln.build_tags.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        t = pathlib.Path(tmp)
        pkg = t / "cmd" / "harness"
        pkg.mkdir(parents=True)
        for f in sorted((HARNESS_DIR / "cmd" / "harness").glob("*.go")):
            src = f.read_text()
            if _build_constraint_ok(src, tags):
                (pkg / f.name).write_text(src)
        (t / "go.mod").write_text(text)
        _run([go, "mod", "tidy"], t, env, f"go mod tidy ({name})")
        ln.gomod.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(t / "go.mod", ln.gomod)
        shutil.copy(t / "go.sum", ln.gosum)
    print(f"[kubelet-build] wrote {ln.gomod.relative_to(ROOT)} and {ln.gosum.name} for {ln.kubernetes}", flush=True)


def main(argv: list[str]) -> int:
    what = argv[1:] or ["all"]
    if what[0] == "sync-gomod":
        for name in what[1:] or LINES:
            sync_gomod(name)
        return 0
    if what == ["all"]:
        what = ["modules", "harness", "kubelet", "images"]
    steps = {"modules": download_modules, "harness": harness_binary, "kubelet": lambda _: kubelet_binary(),
             "images": lambda _: e2e_images()}
    results = {}
    for w in what:
        step, _, only = w.partition(":")
        # modules and harness run per line (every line unless one is named); the rest once.
        names = ([only] if only else list(LINES)) if step in ("modules", "harness") else [""]
        for name in names:
            label = f"{step}:{name}" if name else step
            t0 = time.monotonic()
            try:
                r = steps[step](name or "current")
            except BuildUnavailable as e:
                print(f"[kubelet-build] {label}: UNAVAILABLE: {e}", flush=True)
                return 3
            if isinstance(r, dict):
                r = {k: str(v) for k, v in r.items()}
            elif r is not None:
                r = str(r)
            results[label] = r
            print(f"[kubelet-build] {label}: {time.monotonic() - t0:.1f}s {'' if r is None else r}", flush=True)
    print(json.dumps({k: v for k, v in results.items() if v is not None}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
