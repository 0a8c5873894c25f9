"""A simulated GPU's driver facts (`driver:` in a node file) turned into health, through the real policy.

Why: on a node without NVML (the cluster e2e, a laptop) the only way to see what
an XID does was `health: Unhealthy`, which says nothing of the XID, its action or
what brings the GPU back. Here the file states what NVML would report of a GPU —
the XIDs it delivered, the recovery-action field, pending repairs, the volatile
ECC count, whether the GPU answers — and the node's boot ID, and
`plugin/health/policy.py` (the functions the NVML monitor uses: `on_fault`,
`observe`, `recovery`) decides health and reason. Nothing of the rules is
repeated here; this module only turns file edits into the monitor's inputs:

- `xids` is the driver's event log, oldest first: an entry beyond the length
  seen last is an event (at start every entry is one). Removing entries is no
  evidence of anything. What an XID does is `GpuHealthOptions.action` (the
  catalog and the config's overrides).
- The evidence fields are read at every load and every probe, like
  `EvidenceReader.read`; the quiet period counts from the last XID.

Faults live in memory only: a restarted daemon reads the list afresh (every
listed XID is a fault again until new evidence), and `health clear` does not
reach a simulated node (edit the file). NVLink XIDs change nothing here: a
simulated node has no link states to read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.topology import DeviceKind, NodeTopology

from ...health.catalog import Action, load_catalog
from ...health.options import GpuHealthOptions
from ...health.policy import Evidence, Fault, GpuHealth, driver_action, observe, on_fault, recovery

log = logging.getLogger(__name__)

__all__ = ["DriverFacts", "NodeDriverFacts", "SimulatedHealth", "driver_facts"]


@dataclass(frozen=True)
class DriverFacts:
    """What the simulated driver reports of one GPU."""

    #: The XIDs delivered so far, oldest first.
    xids: tuple[int, ...] = ()
    evidence: Evidence = Evidence()


@dataclass(frozen=True)
class NodeDriverFacts:
    """The node's boot ID and each GPU's facts (GPUs without a `driver:` block are absent)."""

    boot_id: str | None = None
    gpus: Mapping[str, DriverFacts] = field(default_factory=dict)


def driver_facts(data: Mapping[str, Any]) -> NodeDriverFacts:
    """The facts of a schema-validated node file (topoMatrix files name their GPUs; others may not)."""
    gpus: dict[str, DriverFacts] = {}
    for i, spec in enumerate(data.get("gpus") or []):
        drv = spec.get("driver")
        if drv is None:
            continue
        ev = Evidence(recovery_action=drv.get("recoveryAction"), remap_pending=drv.get("remapPending"),
                      remap_failed=drv.get("remapFailed"), retired_pending=drv.get("retiredPending"),
                      volatile_dbe=drv.get("volatileDbe"), answers=not drv.get("lost", False))
        gpus[spec.get("name") or f"GPU{i}"] = DriverFacts(tuple(drv.get("xids") or ()), ev)
    return NodeDriverFacts(data.get("bootId"), gpus)


class SimulatedHealth:
    """Faults per GPU across loads of one node file; `apply` gives the topology the servers should show."""

    def __init__(self, options: GpuHealthOptions | None = None, clock: Callable[[], float] = time.monotonic):
        self.options = options if options is not None else GpuHealthOptions()
        self.clock = clock
        self._faults: dict[str, Fault] = {}
        self._seen: dict[str, int] = {}
        self._waiting_logged: set[tuple[str, float]] = set()

    @property
    def faulted(self) -> bool:
        """Whether a GPU waits for evidence (the source then re-applies every `options.probe_every_s`)."""
        return bool(self._faults)

    def apply(self, topology: NodeTopology, facts: NodeDriverFacts) -> NodeTopology:
        if not self.options.enabled:
            return topology
        now = self.clock()
        gpus = [d.name for d in topology.devices if d.kind is DeviceKind.GPU]
        for name in gpus:
            f = facts.gpus.get(name, DriverFacts())
            seen = self._seen.get(name, 0)
            self._seen[name] = len(f.xids)
            for xid in f.xids[seen:]:
                self._event(name, xid, f.evidence, now, facts.boot_id)
            self._driver(name, f.evidence, now, facts.boot_id)
            self._evaluate(name, f.evidence, now, facts.boot_id)
        for name in set(self._faults) - set(gpus):  # the GPU left the file
            del self._faults[name]
            self._seen.pop(name, None)
        health = {n: GpuHealth.of(self._faults.get(n)) for n in gpus if n in self._faults}
        return topology.with_health({n: h.health for n, h in health.items()},
                                    {n: h.reason for n, h in health.items()})

    # -- the monitor's steps, fed from the file ---------------------------------
    def _fault(self, name: str, action: Action, cause: str, detail: str, now: float, boot_id: str | None,
               ev: Evidence) -> None:
        old = self._faults.get(name)
        new = self._faults[name] = on_fault(old, action, cause, detail, now, boot_id, ev)
        if old is None:
            log.warning("GPU marked Unhealthy", extra={"gpu": name, "reason": new.reason, "detail": new.detail,
                                                       "required_action": new.action.value, "simulated": True})
        elif old.action is not new.action:
            log.warning("GPU needs more than before", extra={"gpu": name, "reason": new.reason, "was": old.reason,
                                                            "required_action": new.action.value, "simulated": True})

    def _event(self, name: str, xid: int, ev: Evidence, now: float, boot_id: str | None) -> None:
        bucket, action = self.options.bucket(xid), self.options.action(xid)
        entry = load_catalog().get(xid)
        detail = f"XID {xid} ({entry.mnemonic if entry else 'not in the catalog'}, bucket {bucket.value})"
        log.warning("GPU health event", extra={"gpu": name, "cause": f"xid-{xid}", "detail": detail,
                                               "required_action": action.value, "simulated": True})
        if action.unhealthy:
            self._fault(name, action, f"xid-{xid}", detail, now, boot_id, ev)

    def _driver(self, name: str, ev: Evidence, now: float, boot_id: str | None) -> None:
        """As the monitor's `_check_driver`: the field asking for more than the GPU's fault is a fault."""
        drv = driver_action(ev.recovery_action)
        current = self._faults.get(name)
        if drv is not None and drv.unhealthy and (current is None or drv.rank > current.action.rank):
            self._fault(name, drv, "driver", f"the driver's recovery action reads {ev.recovery_action} "
                                             f"({drv.value})", now, boot_id, ev)

    def _evaluate(self, name: str, ev: Evidence, now: float, boot_id: str | None) -> None:
        fault = self._faults.get(name)
        if fault is None:
            return
        fault = self._faults[name] = observe(fault, ev)
        why = recovery(fault, ev, now, self.options.quiet_period_s, boot_id)
        if why is not None:
            del self._faults[name]
            self._waiting_logged = {k for k in self._waiting_logged if k[0] != name}
            log.warning("GPU Healthy again", extra={"gpu": name, "was": fault.reason, "evidence": why,
                                                    "simulated": True})
        elif now - fault.at >= self.options.quiet_period_s and (name, fault.at) not in self._waiting_logged:
            self._waiting_logged.add((name, fault.at))
            log.info("GPU still Unhealthy past its quiet period: no evidence of a recovery yet",
                     extra={"gpu": name, "reason": fault.reason, "simulated": True})

