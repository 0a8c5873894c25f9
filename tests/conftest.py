"""Shared test fixtures: paths to the shared data, and the project root."""

from __future__ import annotations

import pathlib
import tempfile
from collections.abc import Iterator

import pytest
from topo_testkit import SHARED_DIR
from topo_testkit.short_dirs import short_tmp_dir

#: Seconds per top-level test directory at the end of every run (tests/README.md says how to read it), and the
#: figures e2e tests measure on the way (`record_property("measured: ...")`).
pytest_plugins = ["topo_testkit.durations_table", "topo_testkit.measured"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = SHARED_DIR
TOPOLOGIES = sorted((SHARED / "topologies").glob("*.txt"))


@pytest.fixture(scope="session")
def shared_topologies() -> list[pathlib.Path]:
    if not TOPOLOGIES:
        pytest.fail(f"no topology fixtures found under {SHARED / 'topologies'}; "
                    "the checkout needs ../shared beside it (or TOPO_DP_SHARED_DIR)")
    return TOPOLOGIES


@pytest.fixture
def short_tmp() -> Iterator[str]:
    """A fresh directory with a short path (`/tmp/tdp-XXXXXXXX`) for unix sockets, removed afterwards.

    Unix socket paths are limited to 107 bytes and pytest's `tmp_path` can be longer (topo_testkit.short_dirs)."""
    with short_tmp_dir() as d:
        yield d


@pytest.fixture(scope="session", autouse=True)
def private_cdi_spec_dir() -> Iterator[str]:
    """Every daemon a test starts (in-process or as a child) writes CDI specs to a private directory,
    never to the real /var/run/cdi: `--cdi-spec-dir` comes from TOPO_DP_CDI_SPEC_DIR unless a test passes it."""
    with tempfile.TemporaryDirectory(prefix="tdp-cdi-") as d, pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOPO_DP_CDI_SPEC_DIR", d)
        yield d


#: Directories whose files run longest (a cluster per module, a real kubelet), in that order. Under
#: pytest-xdist (scripts/test.sh runs `-n` workers with `--dist loadfile`) a file is one unit of work, handed
#: out in collection order: the long ones go first, so the short unit files fill the workers' tails instead
#: of one cluster module starting last and running alone.
LONG_FIRST = ("tests/e2e", "tests/kubelet", "tests/reliability", "tests/daemon")


def _weight(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    for i, top in enumerate(LONG_FIRST):
        if path.startswith(top + "/"):
            return i
    return len(LONG_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "dist", "no") == "no":
        return  # one process: keep pytest's own order
    items.sort(key=_weight)  # stable: each file's tests keep their order
