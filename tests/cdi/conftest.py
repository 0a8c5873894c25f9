"""Fixtures for the CDI tests: the CDI project's own Go validation library, built once.

`tests/cdi/validate` is a small Go program around tags.cncf.io/container-device-interface
(the library containerd 2.x uses) and its v0.5.4 ancestor (containerd 1.7.0-1.7.13, with its
JSON schema). build.sh caches the binary under ~/.cache/topo-device-plugin. Without a Go
toolchain or a module proxy the validating tests skip and say why; in CI
(TOPO_DP_REQUIRE_CDI_TOOLS=1, set by .ci/run) that is a failure.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# --import-mode=importlib does not put test directories on sys.path; cdi_nodes is a plain module.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@dataclass
class Validation:
    """What the CDI library said about one spec directory."""

    returncode: int
    report: dict[str, Any]
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def file(self, name: str) -> dict[str, Any]:
        found = [f for f in self.report["files"] if pathlib.Path(f["path"]).name == name]
        assert len(found) == 1, f"{name} not validated: {[f['path'] for f in self.report['files']]}"
        return found[0]


@dataclass
class Validator:
    binary: str

    def run(self, spec_dir: pathlib.Path, inject: Sequence[Sequence[str]] = ()) -> Validation:
        cmd = [self.binary]
        for names in inject:
            cmd += ["-inject", ",".join(names)]
        cmd.append(str(spec_dir))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode in (0, 1), f"cdi-validate failed to run ({proc.returncode}): {proc.stderr}"
        return Validation(proc.returncode, json.loads(proc.stdout), proc.stderr)


@pytest.fixture(scope="session")
def cdi_validator() -> Validator:
    cmd = ["bash", str(HERE / "validate" / "build.sh")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode == 0 and proc.stdout.strip():
        return Validator(proc.stdout.strip().splitlines()[-1])
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    reason = f"cannot build the CDI validator ({' '.join(cmd)} exited {proc.returncode}):\n{tail}"
    print(reason, file=sys.stderr)
    if os.environ.get("TOPO_DP_REQUIRE_CDI_TOOLS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)
