"""containerd v2 and its runc shim, built (cached) from their Go modules, for the e2e clusters.

Debian's containerd 1.6.20 can neither inject CDI devices nor host NRI plugins from outside;
containerd v2 (tests/e2e/dra/containerd, its shim in tests/e2e/dra/containerd-shim) does both.
Shared by the DRA e2e (tests/e2e/dra) and the network-attach e2e (tests/e2e/netpath).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import cluster_fixtures

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def _go_build(program: str, name: str) -> str:
    cmd = ["bash", str(ROOT / "scripts" / "go_build_cached.sh"), str(HERE / program), name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        cluster_fixtures.unavailable(f"cannot build {name} ({' '.join(cmd)} exited {proc.returncode}):\n{tail}")
    return proc.stdout.strip().splitlines()[-1]


def containerd_with_cdi(directory: pathlib.Path) -> str:
    """`directory`/containerd and `directory`/containerd-shim-runc-v2, built (cached) from containerd v2."""
    for program, name, as_name in (("containerd", "containerd-v2", "containerd"),
                                   ("containerd-shim", "containerd-shim-v2", "containerd-shim-runc-v2")):
        built = _go_build(program, name)
        try:
            os.link(built, directory / as_name)
        except OSError:  # another file system
            shutil.copy2(built, directory / as_name)
    return str(directory / "containerd")
