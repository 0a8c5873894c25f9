"""Figures the e2e tests measure on their way (a rollout's gap, a stage's time), shown at the end of the run.

Why: pass/fail tests never assert timings, but some figures only exist on a real cluster and the docs
quote them. A test reports one with pytest's `record_property("measured: <what>", "<figure>")`; this
plugin prints every such property in the terminal summary, so CI's log carries them whatever the
capture mode (a print inside a passing test is swallowed).
"""

from __future__ import annotations

from typing import Any

PREFIX = "measured: "


def pytest_terminal_summary(terminalreporter: Any) -> None:
    rows: list[tuple[str, str, str]] = []
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if getattr(rep, "when", None) != "call":
                continue
            for key, value in getattr(rep, "user_properties", ()):
                if isinstance(key, str) and key.startswith(PREFIX):
                    rows.append((rep.nodeid, key[len(PREFIX):], str(value)))
    if not rows:
        return
    terminalreporter.section("measured on the way (reported, never asserted)")
    for nodeid, what, value in sorted(rows):
        terminalreporter.write_line(f"{what}: {value}   [{nodeid}]")
