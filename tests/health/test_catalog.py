"""The XID table: NVIDIA's catalog as data, what each bucket makes the plugin do, and the docs saying the same."""

from __future__ import annotations

import logging
import re

import pytest
from topo_testkit.fake_nvml import FakeNvml

from plugin.health.catalog import (
    BUCKET_ACTION,
    OLD_APPLICATION_XIDS,
    Action,
    Bucket,
    load_catalog,
)
from plugin.health.evidence import EvidenceReader
from plugin.sources import load_simulated
from tests.conftest import ROOT


def test_the_catalog_names_every_xid_from_1_to_162_once_with_a_known_bucket():
    c = load_catalog()
    assert sorted(c) == list(range(1, 163))
    assert set(BUCKET_ACTION) == set(Bucket)
    # Spot checks against NVIDIA's page: the unused FIFO errors, a GPU stopped processing, the ones
    # the issue names.
    assert {c[x].bucket for x in range(1, 8)} == {Bucket.CONTACT_SUPPORT} and c[8].bucket is Bucket.RESTART_APP
    assert c[109].bucket is Bucket.RESET_GPU and c[79].bucket is Bucket.RESTART_BM
    assert [c[x].bucket for x in (64, 95, 119, 120)] == [Bucket.RESET_GPU] * 4
    assert c[48].bucket is Bucket.WORKFLOW_XID_48 and BUCKET_ACTION[Bucket.WORKFLOW_XID_48] is Action.RESET_GPU


def _ranges(text: str) -> set[int]:
    out: set[int] = set()
    for part in re.findall(r"\d+(?:–\d+)?", text):
        a, _, b = part.partition("–")
        out |= set(range(int(a), int(b or a) + 1))
    return out


def test_the_docs_bucket_table_lists_exactly_the_catalogs_xids():
    doc = (ROOT / "docs" / "gpu-discovery.md").read_text()
    section = doc.split("## Health (`plugin/health/`)", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    c = load_catalog()
    listed: dict[int, Action] = {}
    for row in rows:
        cells = row.split(" | ")
        if len(cells) < 5:
            continue
        named = {Bucket(b) for b in re.findall(r"`([A-Z_0-9]+)`", cells[0]) if b in Bucket.__members__}
        xids = _ranges(cells[1]) | {int(x) for x in re.findall(r"`[A-Z_0-9]+` (\d+)", cells[0])}
        for x in xids:
            assert c[x].bucket in named, f"docs put XID {x} under {cells[0]}; the catalog says {c[x].bucket.value}"
            listed[x] = BUCKET_ACTION[c[x].bucket]
    assert sorted(listed) == sorted(c), sorted(set(c) - set(listed))
    # The disagreements with NVIDIA's old list, as the docs state them.
    healthy = {x for x, e in c.items() if not BUCKET_ACTION[e.bucket].unhealthy}
    para = section.split("These are Healthy buckets", 1)[1].split("\n\n", 1)[0]
    assert _ranges(para.split("so the old rule marked the GPU Unhealthy:", 1)[1]) == healthy - OLD_APPLICATION_XIDS
    assert {x for x in OLD_APPLICATION_XIDS if x not in healthy} == {109}


@pytest.mark.parametrize("missing", [("nvmlDeviceGetFieldValues", "nvmlDeviceGetRemappedRows",
                                      "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetTotalEccErrors")])
def test_a_driver_without_the_calls_gives_no_facts_and_one_log_line_per_call(missing, caplog):
    fake = FakeNvml(load_simulated("dgx-a100"), missing_functions=set(missing))
    fake.nvmlInit()
    reader = EvidenceReader(fake)
    with caplog.at_level(logging.INFO, logger="plugin.health.evidence"):
        for _ in range(3):
            for g in fake.gpus:
                ev = reader.read(g.uuid)
                assert ev.answers and (ev.recovery_action, ev.remap_pending, ev.retired_pending, ev.volatile_dbe) == (
                    None, None, None, None)
    lines = [r for r in caplog.records if r.name == "plugin.health.evidence"]
    assert sorted(r.call for r in lines) == sorted(missing)  # type: ignore[attr-defined]
