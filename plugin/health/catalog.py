"""NVIDIA's XID catalog as a table: every XID's resolution bucket, and what each bucket makes us do.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (deploy docs, Ampere and
newer GPUs; https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html),
column "Resolution Bucket (Immediate Action)". The stored copy of that page read
for this table (2026-12-01) names no revision or date; its rows 1–8 agree with the
table here. The rows 9–162 were taken from NVIDIA's machine-readable copy of the
same column in NVIDIA/NVSentinel (`distros/kubernetes/nvsentinel/charts/gpu-health-monitor/
xiderrorsmapping.csv`, commit 6f8b0fcfa8e502bdda78fabf96facef729a9285b), which spells
CONTACT_SUPPORT as UNEXPECTED_ERR_REPORT_ISSUE. The data is in `xid_catalog.tsv`
beside this module; overrides go in the config file, never in the table.

What a bucket makes the plugin do (`Action`), in our words:
- `IGNORE`, `RESTART_APP` and the application-side entries (`WORKFLOW_XID_45`,
  `CHECK_UVM`): the GPU is fine; the XID is logged and counted, the GPU stays Healthy.
- `RESET_GPU` and `WORKFLOW_XID_48` (an uncorrectable ECC error: the catalog's
  workflow ends in a reset when a row remap is pending): Unhealthy until the driver
  evidences a reset (docs: "Health").
- `RESTART_BM`, `RESTART_VM`: Unhealthy until the node reboots (a new boot ID) or an
  operator clears it.
- `CONTACT_SUPPORT`, `CHECK_MECHANICALS`, `UPDATE_SWFW`: Unhealthy until an operator
  clears it (or the node reboots): nothing the driver reports can prove these fixed.
- `WORKFLOW_NVLINK_ERR`, `WORKFLOW_NVLINK5_ERR` (XID 74, 144–150): a link problem; the
  GPU stays Healthy, its NVLinks are read again and a dead one leaves the topology.
- `XID_154` (the recovery action changed): read the driver's recovery action now.
XIDs the table does not know are taken as `RESET_GPU` (the old rule marked them
Unhealthy too; a reset is the least that can prove the GPU fine).
"""

from __future__ import annotations

import enum
import functools
import os

__all__ = [
    "CATALOG_SOURCE",
    "OLD_APPLICATION_XIDS",
    "Action",
    "Bucket",
    "CatalogEntry",
    "action_of",
    "load_catalog",
]

CATALOG_SOURCE = ("NVIDIA, Analyzing Xid Errors with the Xid Catalog (Ampere and newer), immediate-action "
                  "column; read 2026-12-01, no revision named on the page")
#: NVIDIA's device plugin's hard-coded "application error" list (the old default here too).
OLD_APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
_TABLE = os.path.join(os.path.dirname(__file__), "xid_catalog.tsv")


class Bucket(str, enum.Enum):
    """The catalog's immediate-action buckets (its own spellings)."""

    IGNORE = "IGNORE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"
    RESTART_VM = "RESTART_VM"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    UPDATE_SWFW = "UPDATE_SWFW"
    CHECK_UVM = "CHECK_UVM"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    XID_154 = "XID_154"


class Action(str, enum.Enum):
    """What a GPU needs before work placed on it can succeed; the value is what operators read.

    Ordered by severity (`rank`): a GPU that needs a reset and then gets an XID asking for a
    reboot needs the reboot."""

    NONE = "none"
    RESET_GPU = "reset GPU"
    RESTART_NODE = "restart node"
    CONTACT_SUPPORT = "contact support"
    #: Not a GPU state: the XID is about a link (the GPU stays Healthy).
    CHECK_LINKS = "check NVLinks"
    #: Not a GPU state: read the driver's recovery action.
    READ_DRIVER = "read driver"

    @property
    def rank(self) -> int:
        return _RANK.get(self, 0)

    @property
    def unhealthy(self) -> bool:
        return self.rank > 0

    @property
    def slug(self) -> str:
        """The action as a Kubernetes label value's words (`reset-gpu`)."""
        return self.value.lower().replace(" ", "-")


_RANK = {Action.RESET_GPU: 1, Action.RESTART_NODE: 2, Action.CONTACT_SUPPORT: 3}

#: The policy table: bucket → action.
BUCKET_ACTION: dict[Bucket, Action] = {
    Bucket.IGNORE: Action.NONE,
    Bucket.RESTART_APP: Action.NONE,
    Bucket.CHECK_UVM: Action.NONE,
    Bucket.WORKFLOW_XID_45: Action.NONE,
    Bucket.RESET_GPU: Action.RESET_GPU,
    Bucket.WORKFLOW_XID_48: Action.RESET_GPU,
    Bucket.RESTART_BM: Action.RESTART_NODE,
    Bucket.RESTART_VM: Action.RESTART_NODE,
    Bucket.CONTACT_SUPPORT: Action.CONTACT_SUPPORT,
    Bucket.CHECK_MECHANICALS: Action.CONTACT_SUPPORT,
    Bucket.UPDATE_SWFW: Action.CONTACT_SUPPORT,
    Bucket.WORKFLOW_NVLINK_ERR: Action.CHECK_LINKS,
    Bucket.WORKFLOW_NVLINK5_ERR: Action.CHECK_LINKS,
    Bucket.XID_154: Action.READ_DRIVER,
}


def action_of(bucket: Bucket) -> Action:
    return BUCKET_ACTION[bucket]


class CatalogEntry(tuple[int, Bucket, str]):
    """(xid, bucket, mnemonic)."""

    @property
    def xid(self) -> int:
        return self[0]

    @property
    def bucket(self) -> Bucket:
        return self[1]

    @property
    def mnemonic(self) -> str:
        return self[2]


@functools.cache
def load_catalog(path: str = _TABLE) -> dict[int, CatalogEntry]:
    """The table as {xid: entry}; a malformed row is an error naming the file and line (a packaging bug)."""
    out: dict[int, CatalogEntry] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line or line.startswith(("#", "xid\t")):
                continue
            parts = line.split("\t")
            try:
                xid, bucket, mnemonic = int(parts[0]), Bucket(parts[1]), parts[2]
            except (IndexError, ValueError) as e:
                raise ValueError(f"{path}:{n}: not 'xid<TAB>bucket<TAB>mnemonic' with a known bucket: {e}") from e
            if xid in out:
                raise ValueError(f"{path}:{n}: XID {xid} listed twice")
            out[xid] = CatalogEntry((xid, bucket, mnemonic))
    return out
