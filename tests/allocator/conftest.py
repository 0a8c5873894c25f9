"""Allocator tests: make the local helper module (`alloc_testlib`) and `benchmarks/` importable.

The project runs pytest with `--import-mode=importlib`, which does not put
test directories on sys.path; the helpers are plain modules, not fixtures,
because hypothesis strategies and parametrisations need them at import time.
"""

from __future__ import annotations

import pathlib
import sys

_HERE = pathlib.Path(__file__).resolve().parent
for _p in (_HERE, _HERE.parent.parent / "benchmarks"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
