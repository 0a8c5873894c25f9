"""The chart on a kind cluster (tests/e2e/kind/run.sh), for anyone with Docker.

Where Docker (or kind, kubectl, helm) is not available the script prints the reason and
exits 77; this test then skips with that reason (visible with -rs, which the project's
pytest options include).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

RUN = pathlib.Path(__file__).with_name("run.sh")


def test_chart_on_kind():
    proc = subprocess.run(["bash", str(RUN)], capture_output=True, text=True, timeout=1800)
    if proc.returncode == 77:
        reason = next((line[len("SKIP: "):] for line in proc.stdout.splitlines() if line.startswith("SKIP: ")),
                      "run.sh skipped")
        print(f"\nSKIP (tests/e2e/kind): {reason}", file=sys.stderr)
        pytest.skip(f"kind e2e: {reason}")
    assert proc.returncode == 0, f"kind e2e failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
