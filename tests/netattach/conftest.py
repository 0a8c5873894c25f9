"""Fixtures of tests/netattach: `net`, a factory of real namespaces and veth pairs (netattach_testlib.py)."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator

import pytest

HERE = pathlib.Path(__file__).resolve().parent
# --import-mode=importlib does not put test directories on sys.path; netattach_testlib is a plain module.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from netattach_testlib import Net, needs_root  # noqa: E402


@pytest.fixture
def net(tmp_path) -> Iterator[Net]:
    needs_root()
    n = Net(tmp_path)
    try:
        yield n
    finally:
        n.close()
