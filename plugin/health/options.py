"""How GPU health is watched: `GpuHealthOptions`, from the config file's `gpus.health` or keywords.

Why the overrides stay: `ignoredXids` and `criticalXids` are what operators of
NVIDIA's plugin (and of this one before the catalog) wrote. They now override the
catalog: an ignored XID leaves the GPU Healthy, a critical one marks it Unhealthy
until a reset (or its own bucket's stronger action). `xidBuckets` sets one XID's
bucket outright and wins over both. A bucket name that is not one of the
catalog's is refused with the nearest name.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .catalog import Action, Bucket, action_of, load_catalog

__all__ = ["GpuHealthOptions", "parse_bucket"]


def parse_bucket(name: Any, where: str) -> Bucket:
    """`name` as a catalog bucket, or a ValueError naming `where`, the known names and the nearest one."""
    try:
        return Bucket(str(name).upper())
    except ValueError:
        known = [b.value for b in Bucket]
        near = difflib.get_close_matches(str(name).upper(), known, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"{where}: {name!r} is not a bucket of NVIDIA's XID catalog{hint}; "
                         f"one of {', '.join(known)}") from None


@dataclass(frozen=True)
class GpuHealthOptions:
    """How GPU health is watched. `from_config` reads the config file's `gpus.health`."""

    enabled: bool = True
    #: XIDs that never mark a GPU unhealthy (override the catalog).
    ignored_xids: frozenset[int] = frozenset()
    #: XIDs that always do, even when also in `ignored_xids` (at least a GPU reset).
    critical_xids: frozenset[int] = frozenset()
    #: XID → bucket, winning over the catalog and both lists.
    xid_buckets: Mapping[int, Bucket] = field(default_factory=dict)
    #: Double-bit ECC errors mark the GPU unhealthy (until a reset).
    double_bit_ecc: bool = True
    #: The least time after the last fault before a GPU may be Healthy again (evidence is needed too).
    quiet_period_s: float = 60.0
    #: `nvmlEventSetWait` timeout: also the longest `stop()` waits for the thread.
    wait_timeout_ms: int = 1000
    #: Backoff after a failing wait: initial, doubled each time, capped.
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    #: Rebuild the event set after this many failed waits in a row.
    rebuild_after_errors: int = 3
    #: How often an Unhealthy GPU's evidence is read again (default: min(quiet, 5 s)).
    probe_interval_s: float | None = None
    #: Where faults survive a daemon restart and the operator's clears arrive (None: memory only, no clears).
    state_directory: str | None = None
    #: Where the node's boot ID is read (`<proc_root>/sys/kernel/random/boot_id`).
    proc_root: str = "/proc"

    def __post_init__(self) -> None:
        if self.quiet_period_s < 0:
            raise ValueError("GPU health quiet period must be >= 0 seconds")
        if self.wait_timeout_ms <= 0:
            raise ValueError("GPU health wait timeout must be > 0 ms")
        if self.backoff_initial_s <= 0 or self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("GPU health backoff needs 0 < initial <= max")
        object.__setattr__(self, "ignored_xids", frozenset(int(x) for x in self.ignored_xids))
        object.__setattr__(self, "critical_xids", frozenset(int(x) for x in self.critical_xids))
        object.__setattr__(self, "xid_buckets", {int(k): parse_bucket(v, f"gpus.health.xidBuckets.{k}")
                                                 for k, v in dict(self.xid_buckets).items()})

    def bucket(self, xid: int) -> Bucket:
        """The bucket that decides this XID: the override map, the lists, then the catalog."""
        if xid in self.xid_buckets:
            return self.xid_buckets[xid]
        entry = load_catalog().get(xid)
        catalog = entry.bucket if entry is not None else Bucket.RESET_GPU
        if xid in self.critical_xids:
            return catalog if action_of(catalog).unhealthy else Bucket.RESET_GPU
        if xid in self.ignored_xids:
            return Bucket.IGNORE
        return catalog

    def action(self, xid: int) -> Action:
        return action_of(self.bucket(xid))

    def is_critical_xid(self, xid: int) -> bool:
        """The XID marks a GPU Unhealthy (kept for callers of the old rule)."""
        return self.action(xid).unhealthy

    @property
    def probe_every_s(self) -> float:
        if self.probe_interval_s is not None:
            return self.probe_interval_s
        return max(min(self.quiet_period_s, 5.0), self.wait_timeout_ms / 1000.0)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | None, **overrides: Any) -> GpuHealthOptions:
        """From the config file's `gpus.health` mapping (`disabled`, `ignoredXids`, `criticalXids`,
        `xidBuckets`, `recoveryQuietPeriodSeconds`, `stateDirectory`); keyword overrides win."""
        cfg = cfg or {}
        kw: dict[str, Any] = {}
        if "disabled" in cfg:
            kw["enabled"] = not bool(cfg["disabled"])
        if cfg.get("ignoredXids") is not None:
            kw["ignored_xids"] = frozenset(cfg["ignoredXids"])
        if cfg.get("criticalXids") is not None:
            kw["critical_xids"] = frozenset(cfg["criticalXids"])
        if cfg.get("xidBuckets") is not None:
            kw["xid_buckets"] = {int(k): v for k, v in dict(cfg["xidBuckets"]).items()}
        if cfg.get("recoveryQuietPeriodSeconds") is not None:
            kw["quiet_period_s"] = float(cfg["recoveryQuietPeriodSeconds"])
        if cfg.get("stateDirectory") is not None:
            kw["state_directory"] = str(cfg["stateDirectory"])
        kw.update(overrides)
        return cls(**kw)
