"""The chart on a kind cluster (tests/e2e/kind/run.sh): with Docker, or here through podman.

With a Docker engine run.sh uses kind's own node image. Without one, with KIND_PODMAN=1 in the
environment (scripts/test.sh sets it; as root: the Debian packages and an empty /lib/modules are set up by
kind_cluster.py), it builds a node image here (node_image.py; cold about 15 minutes on 2 cores, cached afterwards)
and runs the same scenarios through kind's podman provider. Where neither can work the script
prints the reason and exits 77; this test then skips with that reason (visible with -rs, which
the project's pytest options include). Serialize it with the other cluster e2e
(`flock /tmp/topo-e2e.lock`).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

RUN = pathlib.Path(__file__).with_name("run.sh")


# A cold cache builds the node image inside this test (about 15 minutes on 2 cores): past the suite's 300 s.
@pytest.mark.timeout(3600)
def test_chart_on_kind():
    proc = subprocess.run(["bash", str(RUN)], capture_output=True, text=True, timeout=3600)
    if proc.returncode == 77:
        reason = next((line[len("SKIP: "):] for line in proc.stdout.splitlines() if line.startswith("SKIP: ")),
                      "run.sh skipped")
        print(f"\nSKIP (tests/e2e/kind): {reason}", file=sys.stderr)
        if os.environ.get("TOPO_DP_REQUIRE_KUBELET_E2E") == "1":
            pytest.fail(f"kind e2e required (TOPO_DP_REQUIRE_KUBELET_E2E=1, as in CI) but: {reason}")
        pytest.skip(f"kind e2e: {reason}")
    # The stage lines (with their times since the start) belong in the test's output either way.
    print("\n" + "\n".join(line for line in proc.stdout.splitlines()
                            if line.startswith(("== ", "[kind-node] "))), file=sys.stderr)
    assert proc.returncode == 0, f"kind e2e failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
