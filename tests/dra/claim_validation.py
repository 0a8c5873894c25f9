"""The Kubernetes 1.37 API server's own check of a ResourceClaim status update (tests/dra/validate, claimstatus.go).

`api_server_accepts(validator, claim)` runs a claim as the stand-in API server holds it, with the
`status.devices` entries the driver wrote, through the registry's status strategy: decoding, defaulting,
field dropping, hand-written and declarative validation and the per-driver authorization. The `claim_validator`
fixture (conftest.py) builds the program once and caches it.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NODE = "node-a"


def build_validator() -> str:
    build = ROOT / "tests" / "dra" / "validate" / "build.sh"
    proc = subprocess.run(["bash", str(build)], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip().splitlines()[-1]
    reason = f"cannot build slice-validate ({build} exited {proc.returncode}): {proc.stderr.strip()[-800:]}"
    if "1" in (os.environ.get("TOPO_DP_REQUIRE_DRA_TOOLS"), os.environ.get("TOPO_DP_REQUIRE_KUBELET_E2E")):
        pytest.fail(reason)
    print(f"\nSKIP (claim status validation): {reason}", file=sys.stderr)
    pytest.skip(reason)


def run_validator(validator: str, claim: dict) -> subprocess.CompletedProcess:
    """The stand-in keeps a bare spec: the requests the allocation names are filled in, and the allocation is
    made local to NODE (as the scheduler's is for a node's own devices)."""
    c = copy.deepcopy(claim)
    alloc = c["status"]["allocation"]
    counts: dict[str, int] = {}
    for r in alloc["devices"]["results"]:
        counts[r["request"]] = counts.get(r["request"], 0) + 1
    c["spec"]["devices"]["requests"] = [{"name": r, "exactly": {"deviceClassName": f"{r}.topo.dev", "count": n}}
                                        for r, n in counts.items()]
    alloc["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
    return subprocess.run([validator], input=json.dumps(c), capture_output=True, text=True)


def api_server_accepts(validator: str, claim: dict) -> list[str]:
    """Assert the update is accepted; the authorization checks it asked for ("VERB RESOURCE/SUB NAME")."""
    proc = run_validator(validator, claim)
    assert proc.returncode == 0, f"the API server's validation refused our claim status:\n{proc.stderr}"
    [line] = proc.stdout.splitlines()
    return json.loads(line)["authorized"]
