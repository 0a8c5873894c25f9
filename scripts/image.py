#!/usr/bin/env python3
"""Build the plugin's image with whatever this machine has, and load it where the nodes run it.

    python3 scripts/image.py build                         # docker, podman or buildah: the first that works
    python3 scripts/image.py build --tool offline          # no registry: scripts/build_image.py's local base
    python3 scripts/image.py load kind [--name kind]       # into every node of a kind cluster
    python3 scripts/image.py load containerd [--address S] # into this machine's containerd (namespace k8s.io)
    python3 scripts/image.py load ssh HOST [HOST ...]      # copied to each node and imported into its containerd

Why one command: the chart's default image is `localhost/topo-device-plugin:<appVersion>`, an
image nobody publishes for you. Every path here ends with exactly that name in an OCI archive
(`topo-device-plugin-<version>.tar` in the checkout), so `helm install` with the chart's
defaults finds it on every node it was loaded into (the pull policy is IfNotPresent).

The tools, in the order `--tool auto` tries them: `docker` (when an engine answers
`docker info`), `podman`, `buildah`. All three build the unchanged Dockerfile from the same
context and pull `python:3.11-slim-bookworm`. `offline` is for machines that cannot pull it:
`scripts/build_image.py` makes a Debian base with mmdebstrap and builds on it with buildah
(root, Debian). podman and buildah mount the host's CA bundle read-only into the build, so
downloads through an intercepting TLS proxy work; it never lands in a layer. Exit codes: 0 done,
2 a bad argument or no tool found (the message says which to install), 1 the tool failed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPOSITORY = "localhost/topo-device-plugin"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
TOOLS = ("docker", "podman", "buildah")
REF_NAME = "org.opencontainers.image.ref.name"


class Failure(Exception):
    """A step failed; `code` is the exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def app_version() -> str:
    """The chart's appVersion: the tag the chart's default image has."""
    text = (ROOT / "charts" / "topo-device-plugin" / "Chart.yaml").read_text()
    m = re.search(r'^appVersion:\s*"?([^"\s]+)"?', text, re.M)
    if not m:
        raise Failure("charts/topo-device-plugin/Chart.yaml has no appVersion")
    return m.group(1)


def default_ref() -> str:
    return f"{REPOSITORY}:{app_version()}"


def default_archive() -> Path:
    return ROOT / f"topo-device-plugin-{app_version()}.tar"


#: What to do when a builder's build step fails: its own error is above; the usual first-day cause
#: is a machine that cannot pull the Dockerfile's base image.
BUILD_FIX = ("fix: read the builder's error above; if it could not pull python:3.11-slim-bookworm (no registry "
             "access), build on a local Debian base instead: sudo python3 scripts/image.py build --tool offline")


def run(cmd: list[str], what: str, cwd: Path | None = None, fix: str = "") -> None:
    print("+ " + " ".join(cmd), file=sys.stderr)
    proc = subprocess.run(cmd, cwd=cwd)
    if proc.returncode != 0:
        raise Failure(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}" + (f" ({fix})" if fix else ""))


def works(tool: str) -> bool:
    if shutil.which(tool) is None:
        return False
    if tool != "docker":
        return True
    # The docker client alone cannot build: an engine must answer.
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def pick_tool(wanted: str) -> str:
    if wanted != "auto":
        if wanted != "offline" and not works(wanted):
            raise Failure(f"--tool {wanted}: not usable here"
                          + (" (the docker client is installed but no engine answers `docker info`)"
                             if wanted == "docker" and shutil.which("docker") else " (not on PATH)"), 2)
        return wanted
    for tool in TOOLS:
        if works(tool):
            return tool
    raise Failure("no image builder here: install docker (with its engine), podman or buildah, or use "
                  "--tool offline on Debian as root (builds its own base, no registry needed)", 2)


def build_args() -> list[str]:
    revision = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    created = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return ["--build-arg", f"REVISION={revision or 'unknown'}", "--build-arg", f"CREATED={created}"]


def ca_mount() -> list[str]:
    return ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if os.path.exists(CA_BUNDLE) else []


def build(tool: str, ref: str, archive: Path) -> None:
    """Build the Dockerfile as `ref` and write it to `archive` (docker's save format, or OCI)."""
    if tool == "docker":
        run(["docker", "build", "-t", ref, *build_args(), "."], "docker build", cwd=ROOT, fix=BUILD_FIX)
        run(["docker", "save", ref, "-o", str(archive)], "docker save")
    elif tool == "podman":
        run(["podman", "build", "-t", ref, *build_args(), *ca_mount(), "."], "podman build", cwd=ROOT, fix=BUILD_FIX)
        run(["podman", "save", "--format", "oci-archive", "-o", str(archive), ref], "podman save")
    elif tool == "buildah":
        run(["buildah", "bud", "-t", ref, *build_args(), *ca_mount(), "."], "buildah bud", cwd=ROOT, fix=BUILD_FIX)
        run(["buildah", "push", ref, f"oci-archive:{archive}:{ref}"], "buildah push")
    else:
        sys.path.insert(0, str(HERE))
        import build_image

        try:
            built = build_image.build()
        except build_image.Unavailable as e:
            raise Failure(f"--tool offline: {e}", 2) from None
        except RuntimeError as e:
            raise Failure(str(e)) from None
        retag(built.archive, archive, ref)


def retag(src: Path, dst: Path, ref: str) -> None:
    """Copy the OCI archive `src` to `dst` with its image named `ref` (what `ctr import` and kind read)."""
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    with tarfile.open(src) as tin, tarfile.open(tmp, "w") as tout:
        for member in tin:
            data = tin.extractfile(member) if member.isfile() else None
            if member.name.lstrip("./") == "index.json" and data is not None:
                index = json.load(data)
                for m in index.get("manifests", []):
                    m.setdefault("annotations", {})[REF_NAME] = ref
                body = json.dumps(index).encode()
                member.size = len(body)
                tout.addfile(member, io.BytesIO(body))
            else:
                tout.addfile(member, data)
    os.replace(tmp, dst)


def load(target: str, archive: Path, name: str, address: str, hosts: list[str]) -> None:
    if not archive.exists():
        raise Failure(f"{archive}: no such archive (fix: run `python3 scripts/image.py build` first)", 2)
    if target == "kind":
        if shutil.which("kind") is None:
            raise Failure("kind is not on PATH (fix: install kind, https://kind.sigs.k8s.io)", 2)
        run(["kind", "load", "image-archive", str(archive), "--name", name], "kind load image-archive")
    elif target == "containerd":
        run(["ctr", "--address", address, "-n", "k8s.io", "images", "import", str(archive)], "ctr images import")
    else:
        if not hosts:
            raise Failure("load ssh: name at least one node (fix: python3 scripts/image.py load ssh node1 node2)", 2)
        remote = f"/tmp/{archive.name}"
        for host in hosts:
            run(["scp", "-q", str(archive), f"{host}:{remote}"], f"copy to {host}")
            run(["ssh", host, f"sudo ctr -n k8s.io images import {remote} && rm -f {remote}"],
                f"import on {host}")


def parser() -> argparse.ArgumentParser:
    """The command line (a function of its own so the tests can check every option's help)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the image and write it to an archive")
    b.add_argument("--tool", choices=("auto", *TOOLS, "offline"), default="auto",
                   help="auto (default): docker if its engine answers, else podman, else buildah; "
                        "offline: no registry needed (Debian, root)")
    b.add_argument("--tag", default=None, help="image name (default: the chart's, %s:<appVersion>)" % REPOSITORY)
    b.add_argument("--output", type=Path, default=None, help="archive path (default: ./topo-device-plugin-<ver>.tar)")
    ld = sub.add_parser("load", help="load the archive into kind, this machine's containerd, or nodes over ssh")
    ld.add_argument("target", choices=("kind", "containerd", "ssh"),
                    help="kind: every node of a kind cluster; containerd: this machine's; ssh: the named hosts'")
    ld.add_argument("hosts", nargs="*", help="ssh: the nodes")
    ld.add_argument("--archive", type=Path, default=None,
                    help="the archive `build` wrote (default: ./topo-device-plugin-<ver>.tar)")
    ld.add_argument("--name", default="kind", help="kind: the cluster's name")
    ld.add_argument("--address", default="/run/containerd/containerd.sock", help="containerd: its socket")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    try:
        if a.command == "build":
            tool = pick_tool(a.tool)
            ref = a.tag or default_ref()
            archive = (a.output or default_archive()).resolve()
            print(f"building {ref} with {tool}", file=sys.stderr)
            build(tool, ref, archive)
            print(f"{ref}\n{archive}")
        else:
            if a.target != "ssh" and a.hosts:
                ap.error(f"load {a.target} takes no hosts")
            load(a.target, (a.archive or default_archive()).resolve(), a.name, a.address, a.hosts)
            print(f"loaded {(a.archive or default_archive()).name} ({a.target})", file=sys.stderr)
    except Failure as e:
        print(f"image.py: {e}", file=sys.stderr)
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
