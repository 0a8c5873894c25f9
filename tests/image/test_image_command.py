"""`scripts/image.py`: one command builds the image with what the machine has and loads it onto the nodes.

The builders are stood in for by recording scripts on PATH (no engine is needed to check which tool is
chosen and what it is told); the offline path's real build and import are in test_built_image.py.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import image

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
if [ "$(basename "$0") $1" = "docker info" ]; then exit "${DOCKER_INFO_RC:-1}"; fi
exit 0
"""


def _tools(tmp: Path, *names: str) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        (bin_dir / name).write_text(RECORDER)
        (bin_dir / name).chmod(0o755)
    for name in ("git", "sh", "basename"):  # what the script and the recorder need besides the builders
        real = subprocess.run(["sh", "-c", f"command -v {name}"], capture_output=True, text=True).stdout.strip()
        if real and not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(real)
    return bin_dir


def _run(tmp: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = tmp / "calls"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "image.py"), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": str(tmp / "bin"), "CALLS": str(calls), **env})
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_without_a_docker_engine_podman_builds_the_charts_default_image(tmp_path):
    _tools(tmp_path, "docker", "podman", "buildah")
    proc, calls = _run(tmp_path, "build", "--output", str(tmp_path / "x.tar"))
    assert proc.returncode == 0, proc.stderr
    ref = image.default_ref()
    assert proc.stdout.split() == [ref, str(tmp_path / "x.tar")]
    build = next(c for c in calls if c.startswith("podman build"))
    assert f"-t {ref}" in build and "--build-arg REVISION=" in build
    if os.path.exists(image.CA_BUNDLE):
        assert f"-v {image.CA_BUNDLE}:{image.CA_BUNDLE}:ro" in build
    assert f"podman save --format oci-archive -o {tmp_path / 'x.tar'} {ref}" in calls
    assert not any(c.startswith(("docker build", "buildah")) for c in calls)


def test_a_docker_engine_that_answers_is_preferred(tmp_path):
    _tools(tmp_path, "docker", "podman")
    proc, calls = _run(tmp_path, "build", "--output", str(tmp_path / "x.tar"), DOCKER_INFO_RC="0")
    assert proc.returncode == 0, proc.stderr
    assert any(c.startswith(f"docker build -t {image.default_ref()}") for c in calls)
    assert f"docker save {image.default_ref()} -o {tmp_path / 'x.tar'}" in calls


def test_no_builder_says_what_to_install(tmp_path):
    _tools(tmp_path, "docker")  # the client only: `docker info` fails
    proc, _ = _run(tmp_path, "build")
    assert proc.returncode == 2
    assert "no image builder here: install docker (with its engine), podman or buildah" in proc.stderr
    assert "--tool offline" in proc.stderr


def test_a_build_that_cannot_pull_its_base_names_the_offline_build(tmp_path):
    # A machine without registry access: podman's build fails (as it does here, exit 125) and the
    # message says what to do next, not only which command failed.
    _tools(tmp_path, "podman")
    (tmp_path / "bin" / "podman").write_text('#!/bin/sh\necho "Error: pinging container registry" >&2\nexit 125\n')
    proc, _ = _run(tmp_path, "build", "--output", str(tmp_path / "x.tar"))
    assert proc.returncode == 1
    assert "podman build failed (exit 125)" in proc.stderr
    assert "sudo python3 scripts/image.py build --tool offline" in proc.stderr


def test_every_option_of_the_command_says_what_it_does():
    subcommands = next(a for a in image.parser()._actions if isinstance(a, argparse._SubParsersAction))
    bare = [f"{name} {a.option_strings or a.dest}" for name, sub in subcommands.choices.items()
            for a in sub._actions if not a.help]
    assert bare == [], f"options without help in `image.py <command> --help`: {bare}"


def test_load_kind_and_ssh(tmp_path):
    _tools(tmp_path, "kind", "scp", "ssh")
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"")
    proc, calls = _run(tmp_path, "load", "kind", "--name", "dev", "--archive", str(archive))
    assert proc.returncode == 0, proc.stderr
    assert f"kind load image-archive {archive} --name dev" in calls
    proc, calls = _run(tmp_path, "load", "ssh", "n1", "n2", "--archive", str(archive))
    assert proc.returncode == 0, proc.stderr
    remote = [c for c in calls if c.startswith(("scp", "ssh"))]
    assert remote == [f"scp -q {archive} n1:/tmp/a.tar", "ssh n1 sudo ctr -n k8s.io images import /tmp/a.tar && rm -f /tmp/a.tar",
                      f"scp -q {archive} n2:/tmp/a.tar", "ssh n2 sudo ctr -n k8s.io images import /tmp/a.tar && rm -f /tmp/a.tar"]


def test_load_without_an_archive_or_hosts_names_the_fix(tmp_path):
    _tools(tmp_path, "kind")
    proc, _ = _run(tmp_path, "load", "kind", "--archive", str(tmp_path / "none.tar"))
    assert proc.returncode == 2 and "run `python3 scripts/image.py build` first" in proc.stderr
    (tmp_path / "a.tar").write_bytes(b"")
    proc, _ = _run(tmp_path, "load", "ssh", "--archive", str(tmp_path / "a.tar"))
    assert proc.returncode == 2 and "name at least one node" in proc.stderr


def test_retag_renames_the_image_in_an_oci_archive(tmp_path):
    src, dst = tmp_path / "src.tar", tmp_path / "dst.tar"
    index = {"schemaVersion": 2, "manifests": [{"digest": "sha256:" + "0" * 64,
                                                 "annotations": {image.REF_NAME: "localhost/x:1-abc"}}]}
    with tarfile.open(src, "w") as t:
        for name, body in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", json.dumps(index).encode()),
                           ("blobs/sha256/" + "0" * 64, b"blob")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            t.addfile(info, io.BytesIO(body))
    image.retag(src, dst, "localhost/topo-device-plugin:0.1.0")
    with tarfile.open(dst) as t:
        names = t.getnames()
        out = json.load(t.extractfile("index.json"))
        blob = t.extractfile("blobs/sha256/" + "0" * 64).read()
    assert names == ["oci-layout", "index.json", "blobs/sha256/" + "0" * 64] and blob == b"blob"
    assert out["manifests"][0]["annotations"][image.REF_NAME] == "localhost/topo-device-plugin:0.1.0"
