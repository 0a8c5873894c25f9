"""Fixtures of tests/netattach: `net`, a factory of real namespaces and veth pairs (netattach_testlib.py)."""

from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
# --import-mode=importlib does not put test directories on sys.path; netattach_testlib is a plain module.
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from netattach_testlib import net  # noqa: F401 (the fixture, shared with tests/dra)
