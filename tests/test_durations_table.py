"""Every pytest run ends with seconds per top-level test directory (topo_testkit.durations_table).

What a reader of a CI log notices: one row per directory with its test and
failure counts, the slowest first, and a total; the numbers are whatever the
run took (no timing is asserted, only that each directory is counted right).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from topo_testkit import SUPPORT_DIR
from topo_testkit.durations_table import TOP_LEVEL_FILES, directory_of


def test_a_test_belongs_to_its_top_level_directory():
    assert directory_of("tests/dra/test_x.py::test_y[a/b]") == "tests/dra"
    assert directory_of("tests/e2e/cluster/test_z.py::T::t") == "tests/e2e"
    assert directory_of("tests/test_docs.py::test_links") == f"tests/{TOP_LEVEL_FILES}"
    assert directory_of("test_alone.py::t") == TOP_LEVEL_FILES


def test_the_table_counts_tests_and_failures_per_directory(tmp_path: pathlib.Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for rel, text in {
        "tests/alpha/test_one.py": "def test_a(): pass\n\ndef test_b(): pass\n",
        "tests/alpha/deeper/test_two.py": "def test_c(): pass\n",
        "tests/beta/test_three.py": "def test_d(): assert False, 'fails on purpose'\n",
        "tests/test_top.py": "import pytest\n\n@pytest.mark.skip('skipped on purpose')\ndef test_e(): pass\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = {**os.environ, "PYTHONPATH": SUPPORT_DIR}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "topo_testkit.durations_table",
                          "-p", "no:cacheprovider", "tests"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    table = run.stdout.split("seconds per test directory", 1)[1]
    rows = {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(r"^(\S+)\s+(\d+)\s+(\d+)\s+\d+\.\d", table, re.M)}
    assert rows == {"tests/alpha": (3, 0), "tests/beta": (1, 1), f"tests/{TOP_LEVEL_FILES}": (1, 0),
                    "total": (5, 1)}, table
    # The table comes after the failure report (with --durations and -ra, before their lists end the run).
    assert run.stdout.index("fails on purpose") < run.stdout.index("seconds per test directory")
