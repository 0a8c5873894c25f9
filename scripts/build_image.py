#!/usr/bin/env python3
"""Build the project's image from its unchanged Dockerfile without Docker, and cache it.

    python3 scripts/build_image.py                       # build (cached); print the archive and a size report
    python3 scripts/build_image.py --import-to SOCKET    # ... and import it into that containerd

How, and why this way (these machines have no Docker engine and no registry):

1. The base: Debian bookworm made here with `mmdebstrap` (variant `essential`, merged /usr,
   no docs/man pages/locales, no Python test suites), holding python3 and Debian's pip wheel.
   It is the `PYTHON_IMAGE` build argument, standing in for `python:3.11-slim-bookworm`.
   `pip` in it runs from Debian's pip wheel (python3-pip-whl), so the builder stage has pip
   while the final stage carries no installed pip, setuptools or wheel.
2. The image: Debian's `buildah bud` (vfs storage in a private directory, `--isolation chroot`,
   `--pull=never`) builds the Dockerfile on that base from exactly the context `docker build .`
   would send (.dockerignore). Package downloads in RUN steps go through this network's
   intercepting TLS proxy: the host CA bundle is mounted read-only for the build, never copied
   into a layer.
3. The result is an OCI archive (`buildah push oci-archive:`), imported into containerd with
   `ctr -n k8s.io images import` (containerd takes the name from the archive's index).

Both steps are cached under $TOPO_DP_CACHE_DIR/image (default ~/.cache/topo-device-plugin),
the base by a hash of its recipe below, the image by a hash of the base, the Dockerfile and
every file of the build context. Needs root (mmdebstrap and buildah as root); the Debian
packages it needs are installed through scripts/debian_packages.sh. Exit codes: 0 built,
3 a tool cannot exist here (the message says which), 1 the build failed.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import build_cache
import dockerignore

REPOSITORY = "localhost/topo-device-plugin"
BASE_REPOSITORY = "localhost/topo-device-plugin-base"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
TOOLS = {"mmdebstrap": "mmdebstrap", "buildah": "buildah"}

# The pip of the base: Debian's own pip wheel, run as a zip (pip supports running from its
# wheel), so no pip, setuptools or wheel is installed in the base or the final image.
PIP_WRAPPER = """#!/bin/sh
# pip from Debian's pip wheel (python3-pip-whl); see scripts/build_image.py.
for whl in /usr/share/python-wheels/pip-*.whl; do :; done
exec python3 "$whl/pip" "$@"
"""

#: Everything that decides the base. Its hash names the cached base.
BASE_RECIPE = {
    "suite": "bookworm",
    "variant": "essential",
    "sources": [
        "deb http://deb.debian.org/debian bookworm main",
        "deb http://deb.debian.org/debian bookworm-updates main",
        "deb http://deb.debian.org/debian-security bookworm-security main",
    ],
    # libstdc++6: grpcio's wheel links it (as every manylinux C++ extension does).
    "packages": ["python3", "python-is-python3", "python3-pip-whl", "libstdc++6"],
    # dpkg never unpacks these (fnmatch: `*` spans directories). Copyright files stay.
    "path_exclude": [
        "/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
        "/usr/share/lintian/*", "/usr/share/bash-completion/*", "/usr/lib/x86_64-linux-gnu/gconv/*",
    ],
    # Removed after installation: python3.11's postinst byte-compiles every file its package lists.
    "remove_after": ["/usr/lib/python3.11/test", "/usr/lib/python3.11/*/test", "/usr/lib/python3.11/*/tests",
                     "/usr/lib/python3.11/lib2to3/tests", "/usr/lib/python3.11/pydoc_data",
                     "/var/log/apt/*", "/var/log/dpkg.log", "/var/cache/debconf/*-old", "/var/lib/dpkg/*-old"],
    "path_include": ["/usr/share/doc/*/copyright"],
    "pip_wrapper": PIP_WRAPPER,
    "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
}


class Unavailable(RuntimeError):
    """A tool this build needs cannot exist here."""


def log(msg: str) -> None:
    print(f"[build-image] {msg}", file=sys.stderr, flush=True)


def default_cache() -> Path:
    return build_cache.subdir("image")


def _run(argv: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(["nice", "-n", "10", *argv], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {' '.join(argv)}\n"
                           f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def ensure_tools() -> None:
    if os.geteuid() != 0:
        raise Unavailable("building the image needs root (mmdebstrap and buildah run as root here)")
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if missing:
        proc = subprocess.run(["bash", str(HERE / "debian_packages.sh"), *missing], capture_output=True, text=True)
        if proc.returncode != 0:
            raise Unavailable(f"cannot install {', '.join(missing)}: {proc.stderr.strip()[-500:]}")
    if not os.path.exists(CA_BUNDLE):
        raise Unavailable(f"no CA bundle at {CA_BUNDLE} (Debian's ca-certificates) to mount into the build")


# ---- the base -----------------------------------------------------------------------------


def base_key() -> str:
    return build_cache.content_key(json.dumps(BASE_RECIPE, sort_keys=True).encode())


def base_rootfs(cache: Path) -> Path:
    """The base's root filesystem as a tarball, made by mmdebstrap (cached by its recipe)."""
    out = cache / f"base-{base_key()}.tar"
    if out.exists():
        return out
    r = BASE_RECIPE
    # mmdebstrap writes a tarball only to a name ending in .tar.
    tmp = out.with_name(f"{out.stem}.tmp{os.getpid()}.tar")
    hook = tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False)
    with hook:
        hook.write('set -e\nmkdir -p "$1/usr/local/bin"\ncat > "$1/usr/local/bin/pip" <<\'EOF\'\n'
                   + r["pip_wrapper"] + 'EOF\nchmod 0755 "$1/usr/local/bin/pip"\n'
                   'ln -s pip "$1/usr/local/bin/pip3"\n'
                   + "".join(f'rm -rf "$1"{p}\n' for p in r["remove_after"]))
    argv = ["mmdebstrap", f"--variant={r['variant']}", "--include=" + ",".join(r["packages"]),
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            # No device nodes in an image: the runtime makes /dev.
            "--skip=output/mknod",
            *[f"--dpkgopt=path-exclude={p}" for p in r["path_exclude"]],
            *[f"--dpkgopt=path-include={p}" for p in r["path_include"]],
            f"--customize-hook=sh {hook.name} \"$1\"",
            r["suite"], str(tmp), *r["sources"]]
    try:
        _run(argv, "mmdebstrap (the base)")
        os.replace(tmp, out)
    finally:
        os.unlink(hook.name)
        if tmp.is_dir():
            shutil.rmtree(tmp)
        elif tmp.exists():
            tmp.unlink()
    _prune(cache, "base-")
    return out


# ---- the image ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    archive: Path
    ref: str
    report: dict


#: Paths of the project's test doubles (tests/support); none may ship in the image.
TEST_DOUBLES = ("fake_nvml", "sysfs_fixture", "tm_cases", "topo_testkit", "plugin/testing/",
                "topologymanager/harness")
#: Bumped when size_report's output changes (a cached report is then recomputed from its archive).
REPORT_FORMAT = 3


def image_key(base: str, files: list[str]) -> str:
    """The base, the buildah steps (the source of `build`), the Dockerfile and every file of the context."""
    h = hashlib.sha256(base.encode() + inspect.getsource(build).encode())
    for rel in ["Dockerfile", ".dockerignore", *files]:
        h.update(rel.encode() + b"\0" + hashlib.sha256((ROOT / rel).read_bytes()).digest())
    return h.hexdigest()[:16]


def version() -> str:
    import re

    return re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)


def build(cache: Path | None = None) -> Built:
    """Build the image (or reuse the cached one); returns the OCI archive and the image name."""
    cache = cache or default_cache()
    files = dockerignore.context_files(ROOT)
    key = image_key(base_key(), files)
    ref = f"{REPOSITORY}:{version()}-{key}"
    archive = cache / f"topo-device-plugin-{key}.oci.tar"
    report_file = archive.with_suffix(".report.json")
    if archive.exists() and report_file.exists():
        report = json.loads(report_file.read_text())
        if report.get("format") != REPORT_FORMAT:
            report = {**size_report(archive, ref), "build_s": report.get("build_s")}
            report_file.write_text(json.dumps(report, indent=1))
        return Built(archive, ref, report)
    ensure_tools()
    t0 = time.monotonic()
    rootfs = base_rootfs(cache)
    t_base = time.monotonic() - t0
    work = Path(tempfile.mkdtemp(prefix="build-", dir=cache))
    storage = ["--root", str(work / "storage"), "--runroot", str(work / "run"), "--storage-driver", "vfs"]
    try:
        t1 = time.monotonic()
        # The base image: the rootfs tarball as one layer.
        bctx = work / "base"
        bctx.mkdir()
        os.link(rootfs, bctx / "rootfs.tar")
        env = " ".join(BASE_RECIPE["env"])
        (bctx / "Containerfile").write_text(f'FROM scratch\nADD rootfs.tar /\nENV {env}\nCMD ["python3"]\n')
        base_ref = f"{BASE_REPOSITORY}:{base_key()}"
        _run(["buildah", *storage, "bud", "--isolation", "chroot", "--pull=never", "--format", "oci",
              "-t", base_ref, "-f", str(bctx / "Containerfile"), str(bctx)], "buildah bud (the base)")
        # The project's image, from exactly the context `docker build .` sends.
        ctx = work / "context"
        ctx.mkdir()
        dockerignore.copy_context(ROOT, ctx)
        for f in ("Dockerfile", ".dockerignore"):
            shutil.copy2(ROOT / f, ctx / f)
        _run(["buildah", *storage, "bud", "--isolation", "chroot", "--pull=never", "--format", "oci",
              "--build-arg", f"PYTHON_IMAGE={base_ref}",
              "-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
              "-t", ref, "-f", str(ctx / "Dockerfile"), str(ctx)], "buildah bud (the Dockerfile)", cwd=ctx)
        tmp = archive.with_name(archive.name + f".tmp{os.getpid()}")
        _run(["buildah", *storage, "push", ref, f"oci-archive:{tmp}:{ref}"], "buildah push")
        t_build = time.monotonic() - t1
        report = size_report(tmp, ref)
        report["build_s"] = {"base": round(t_base, 1), "image": round(t_build, 1)}
        report_file.write_text(json.dumps(report, indent=1))
        os.replace(tmp, archive)
    finally:
        subprocess.run(["buildah", *storage, "rm", "--all"], capture_output=True)
        subprocess.run(["buildah", *storage, "rmi", "--all", "--force"], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    _prune(cache, "topo-device-plugin-")
    return Built(archive, ref, report)


def _prune(cache: Path, prefix: str, keep: int = 2) -> None:
    """Keep the newest `keep` outputs of one kind (an archive and its report share a stem)."""
    newest: dict[str, float] = {}
    for p in cache.glob(prefix + "*"):
        if ".tmp" not in p.name:
            stem = p.name.split(".")[0]
            newest[stem] = max(newest.get(stem, 0.0), p.stat().st_mtime)
    for stem in sorted(newest, key=newest.__getitem__, reverse=True)[keep:]:
        for p in cache.glob(stem + ".*"):
            p.unlink(missing_ok=True)


# ---- what is in it ---------------------------------------------------------------------------------


def _bucket(path: str) -> str:
    """Where a file's bytes are counted in the report."""
    p = path.lstrip("./")
    for prefix in ("opt/topo-device-plugin/lib/python3.11/site-packages/", "opt/topo-device-plugin/lib/"):
        if p.startswith(prefix):
            rest = p[len(prefix):].split("/", 1)[0]
            return "venv: " + rest.split("-", 1)[0]
    if p.startswith("usr/lib/python3"):
        return "python stdlib (" + ("bytecode" if p.endswith(".pyc") else "source, C modules") + ")"
    parts = p.split("/")
    return "/" + "/".join(parts[:3 if parts[0] == "usr" else 2])


def _read_blob(tf: tarfile.TarFile, digest: str):
    return tf.extractfile("blobs/sha256/" + digest.split(":", 1)[1])


def size_report(archive: Path, ref: str) -> dict:
    """Sizes from the OCI archive itself: per layer, total, and the largest parts."""
    out: dict = {"format": REPORT_FORMAT, "ref": ref, "archive_bytes": archive.stat().st_size, "layers": []}
    buckets: dict[str, int] = defaultdict(int)
    packages: dict[str, int] = {}
    files: set[str] = set()
    ca_bundles: list[str] = []
    with tarfile.open(archive) as tf:
        index = json.load(tf.extractfile("index.json"))
        manifest = json.load(_read_blob(tf, index["manifests"][0]["digest"]))
        config = json.load(_read_blob(tf, manifest["config"]["digest"]))
        out["config"] = {k: config["config"].get(k) for k in ("User", "Entrypoint", "Cmd", "Labels", "Env")}
        for layer in manifest["layers"]:
            raw = _read_blob(tf, layer["digest"])
            stream = gzip.GzipFile(fileobj=raw) if layer["mediaType"].endswith("gzip") else raw
            total = 0
            with tarfile.open(fileobj=stream, mode="r|") as lt:
                for m in lt:
                    files.add(m.name.lstrip("./"))
                    if m.isfile():
                        total += m.size
                        buckets[_bucket(m.name)] += m.size
                        name = m.name.lstrip("./")
                        if name == "var/lib/dpkg/status":
                            packages = _dpkg_sizes(lt.extractfile(m).read().decode())
                        elif name == CA_BUNDLE.lstrip("/"):
                            ca_bundles.append(hashlib.sha256(lt.extractfile(m).read()).hexdigest())
            out["layers"].append({"digest": layer["digest"], "compressed": layer["size"], "uncompressed": total})
    out["uncompressed_bytes"] = sum(x["uncompressed"] for x in out["layers"])
    out["largest"] = sorted(buckets.items(), key=lambda kv: -kv[1])[:15]
    out["largest_debian_packages"] = sorted(packages.items(), key=lambda kv: -kv[1])[:12]
    out["ca_bundles"] = ca_bundles
    out["venv_bin"] = sorted(f for f in files if f.startswith("opt/topo-device-plugin/bin/"))
    out["test_doubles"] = sorted(f for f in files if any(d in f + "/" for d in TEST_DOUBLES))
    return out


def _dpkg_sizes(status: str) -> dict[str, int]:
    sizes = {}
    for para in status.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in para.splitlines() if ": " in line and not line[0].isspace())
        if "Package" in fields and "Installed-Size" in fields:
            sizes[fields["Package"]] = int(fields["Installed-Size"]) * 1024
    return sizes


def render_report(r: dict) -> str:
    mb = 1e6
    lines = [f"image {r['ref']}: {r['uncompressed_bytes'] / mb:.1f} MB uncompressed, "
             f"{r['archive_bytes'] / mb:.1f} MB as an OCI archive (gzip layers)"]
    for i, layer in enumerate(r["layers"]):
        lines.append(f"  layer {i}: {layer['uncompressed'] / mb:6.1f} MB ({layer['compressed'] / mb:.1f} MB gzip)")
    lines.append("  largest parts:")
    lines += [f"    {b / mb:6.1f} MB  {name}" for name, b in r["largest"]]
    lines.append("  largest Debian packages (Installed-Size, before the path excludes):")
    lines += [f"    {b / mb:6.1f} MB  {name}" for name, b in r["largest_debian_packages"]]
    return "\n".join(lines)


def import_into(address: str, archive: Path) -> None:
    """`ctr images import` into the containerd at `address` (namespace k8s.io, the CRI's)."""
    _run(["ctr", "--address", address, "-n", "k8s.io", "images", "import", str(archive)], "ctr images import")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--import-to", metavar="SOCKET", help="containerd socket to import the image into")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        result = build()
    except Unavailable as e:
        log(f"UNAVAILABLE: {e}")
        return 3
    except RuntimeError as e:
        log(str(e))
        return 1
    log(f"image ready in {time.monotonic() - t0:.1f}s: {result.archive}")
    if a.import_to:
        import_into(a.import_to, result.archive)
        log(f"imported {result.ref} into {a.import_to}")
    if a.json:
        print(json.dumps({"archive": str(result.archive), "ref": result.ref, "report": result.report}))
    else:
        print(f"{result.ref}\n{result.archive}")
        print(render_report(result.report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
