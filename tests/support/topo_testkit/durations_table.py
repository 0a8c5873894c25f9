"""A pytest plugin: at the end of every run, seconds per top-level test directory.

Why: the suite's cost grew faster than the suite (issue 31), and `--durations`
names slow tests but not where the time goes as a whole. This table is printed
by every run (CI included: `tests/conftest.py` loads it), so a module that
makes a directory slower shows up in the next CI log, not months later. How
to read it: tests/README.md.

A test's seconds are its setup, call and teardown together, so a module- or
session-scoped fixture (a cluster brought up once per module) counts in the
test whose setup built it, in that test's directory. Time outside tests
(collection, the terminal) appears only in the wall-clock line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

#: The row for test files directly under the top-level test directory.
TOP_LEVEL_FILES = "*.py"


@dataclass
class _Row:
    seconds: float = 0.0
    tests: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)


def directory_of(nodeid: str) -> str:
    """`tests/dra/test_x.py::t` → `tests/dra`; `tests/test_docs.py::t` → `tests/*.py`."""
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) <= 2:
        return f"{parts[0]}/{TOP_LEVEL_FILES}" if len(parts) == 2 else TOP_LEVEL_FILES
    return f"{parts[0]}/{parts[1]}"


class DurationsTable:
    """Collects each test's phases by directory; prints the table in the terminal summary."""

    def __init__(self) -> None:
        self.rows: dict[str, _Row] = {}
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = self.rows.setdefault(directory_of(report.nodeid), _Row())
        row.seconds += report.duration
        row.tests.add(report.nodeid)
        if report.failed:
            row.failed.add(report.nodeid)

    @pytest.hookimpl(trylast=True)  # after --durations' list: the last table before pytest's final line
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.rows:
            return
        tr = terminalreporter
        total = sum(r.seconds for r in self.rows.values())
        width = max(len("directory"), *(len(d) for d in self.rows))
        tr.write_sep("=", "seconds per test directory (setup + call + teardown)")
        tr.write_line(f"{'directory':<{width}}  {'tests':>6}  {'failed':>6}  {'seconds':>9}  {'share':>6}")
        for name, row in sorted(self.rows.items(), key=lambda kv: (-kv[1].seconds, kv[0])):
            share = row.seconds / total if total else 0.0
            tr.write_line(f"{name:<{width}}  {len(row.tests):>6}  {len(row.failed):>6}  {row.seconds:>9.1f}  "
                          f"{share:>6.1%}")
        tests = sum(len(r.tests) for r in self.rows.values())
        failed = sum(len(r.failed) for r in self.rows.values())
        tr.write_line(f"{'total':<{width}}  {tests:>6}  {failed:>6}  {total:>9.1f}  "
                      f"(wall clock {time.monotonic() - self.started:.1f} s)")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(DurationsTable(), "topo-durations-table")
