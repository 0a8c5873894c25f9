"""The health policy, pure: faults and the driver's evidence in, the GPU's required action and health out.

Why pure: every rule of docs/gpu-discovery.md "Health" is one function here,
tested as a table (bucket × driver capability × event order) without threads,
NVML or time; the monitor only feeds it.

The rules:
- A fault (an XID whose bucket needs an action, a double-bit ECC error, the
  driver's recovery action reading other than none, a GPU NVML cannot reach)
  makes the GPU Unhealthy with a required action; a second fault keeps the more
  severe action and restarts the quiet period.
- Recovery needs evidence, and never comes before `quiet_period_s` after the
  last fault. For `reset GPU`: where the driver has the recovery-action field,
  the field reading none with no repair pending; where it lacks the field, an
  observed reset (`reset_evidence`). For `restart node` and `contact support`:
  a new boot ID (the node rebooted). The operator's clear ends any fault. NVML
  answering again is never enough by itself.
- A GPU the driver reports as needing an action is Unhealthy even without an XID.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from allocator.topology import HEALTHY, UNHEALTHY

from .catalog import Action

__all__ = [
    "DRIVER_ACTIONS",
    "Evidence",
    "Fault",
    "GpuHealth",
    "action_of_reason",
    "driver_action",
    "observe",
    "on_fault",
    "recovery",
    "taint_value",
]

#: NVML's nvmlDeviceGpuRecoveryAction_t (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230) → our action.
DRIVER_ACTIONS: dict[int, tuple[str, Action]] = {
    0: ("none", Action.NONE),
    1: ("GPU reset", Action.RESET_GPU),
    2: ("node reboot", Action.RESTART_NODE),
    3: ("drain P2P", Action.RESET_GPU),
    4: ("drain and reset", Action.RESET_GPU),
    5: ("recover IMEX domain", Action.CONTACT_SUPPORT),
    6: ("bus reset", Action.RESET_GPU),
    7: ("system reboot", Action.RESTART_NODE),
}


def driver_action(value: int | None) -> Action | None:
    """The field's value as our action (None: no field); an unknown value asks for a reset."""
    if value is None:
        return None
    return DRIVER_ACTIONS.get(value, ("unknown", Action.RESET_GPU))[1]


@dataclass(frozen=True)
class Evidence:
    """What NVML says of one GPU at one moment; None: this driver cannot say."""

    #: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (0 none ... 7 system reboot).
    recovery_action: int | None = None
    #: nvmlDeviceGetRemappedRows: a remap waits for a reset / a remap ever failed.
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    #: nvmlDeviceGetRetiredPagesPendingStatus: a page retirement waits for a reset.
    retired_pending: bool | None = None
    #: Volatile uncorrectable ECC errors (a reset sets them back to 0).
    volatile_dbe: int | None = None
    #: NVML answers for the GPU (a handle by UUID and a query); False: lost.
    answers: bool = True

    @property
    def pending_repair(self) -> bool | None:
        known = [v for v in (self.remap_pending, self.retired_pending) if v is not None]
        return any(known) if known else None

    @property
    def has_field(self) -> bool:
        return self.recovery_action is not None


@dataclass(frozen=True)
class Fault:
    """Why one GPU is Unhealthy, and what has been seen of a reset since."""

    action: Action
    #: Short, for logs and taints: `xid-48`, `ecc-dbe`, `driver`, `lost`.
    cause: str
    #: For people: `XID 48 (ROBUST_CHANNEL_GPU_ECC_DBE, bucket WORKFLOW_XID_48)`.
    detail: str
    #: When the last fault came (monotonic seconds).
    at: float
    #: The node's boot ID when it came (None: unknown).
    boot_id: str | None = None
    seen_lost: bool = False
    seen_pending: bool = False
    dbe_baseline: int | None = None
    reset_seen: str = ""

    @property
    def reason(self) -> str:
        """`xid-48: reset GPU`, what the kubelet's log, the DRA status and the metrics carry."""
        return f"{self.cause}: {self.action.value}"


@dataclass(frozen=True)
class GpuHealth:
    """One GPU as the servers see it."""

    health: str = HEALTHY
    reason: str = ""
    action: Action = Action.NONE

    @classmethod
    def of(cls, fault: Fault | None) -> GpuHealth:
        if fault is None:
            return cls()
        return cls(UNHEALTHY, f"{fault.reason} ({fault.detail})", fault.action)


def on_fault(current: Fault | None, action: Action, cause: str, detail: str, now: float,
             boot_id: str | None, evidence: Evidence | None = None) -> Fault:
    """A new fault on a GPU: the more severe action wins (the first one on a tie); the quiet period restarts.

    Keeping the first cause on a tie keeps a storm of XIDs from rewriting the reason (and the saved
    state) on every event."""
    if current is not None and current.action.rank >= action.rank:
        fault = replace(current, at=now, reset_seen="")
    else:
        fault = Fault(action, cause, detail, now, boot_id if current is None else current.boot_id or boot_id,
                      seen_lost=current.seen_lost if current else False,
                      seen_pending=current.seen_pending if current else False,
                      dbe_baseline=current.dbe_baseline if current else None)
    return observe(fault, evidence) if evidence is not None else fault


def observe(fault: Fault, ev: Evidence) -> Fault:
    """Record what `ev` shows of a reset since the fault: lost then back, a pending repair done, counters reset."""
    seen = fault.reset_seen
    lost, pending, base = fault.seen_lost, fault.seen_pending, fault.dbe_baseline
    if not ev.answers:
        return replace(fault, seen_lost=True)
    if lost and not seen:
        seen = "the GPU came back after NVML lost it"
    if ev.pending_repair:
        pending = True
    elif pending and ev.pending_repair is False and not seen:
        seen = "a pending row remap or page retirement was applied"
    if ev.volatile_dbe is not None:
        if base is not None and ev.volatile_dbe < base and not seen:
            seen = "the volatile ECC error counters were reset"
        base = ev.volatile_dbe if base is None or seen else max(base, ev.volatile_dbe)
    return replace(fault, seen_lost=lost and not seen, seen_pending=pending and not seen,
                   dbe_baseline=base, reset_seen=seen)


def recovery(fault: Fault, ev: Evidence, now: float, quiet_s: float, boot_id: str | None) -> str | None:
    """Why the GPU is Healthy again, or None while it is not (see the module docstring)."""
    if now - fault.at < quiet_s or not ev.answers:
        return None
    if ev.pending_repair:
        return None
    drv = driver_action(ev.recovery_action)
    if drv is not None and drv.unhealthy:
        return None
    if boot_id and fault.boot_id and boot_id != fault.boot_id:
        return "the node rebooted (new boot ID)"
    if fault.action is not Action.RESET_GPU:
        return None
    if drv is Action.NONE:
        return "the driver's recovery action reads none and no repair is pending"
    if fault.reset_seen:
        return f"a GPU reset was observed: {fault.reset_seen}"
    return None


_LABEL_BAD = re.compile(r"[^A-Za-z0-9_.-]+")


def taint_value(reason: str) -> str:
    """`xid-48: reset GPU (...)` as a Kubernetes label value (taint values must be one): `xid-48.reset-gpu`."""
    short = reason.split(" (", 1)[0]
    cause, _, action = short.partition(": ")
    text = f"{cause}.{action}" if action else cause
    text = _LABEL_BAD.sub("-", text.lower()).strip("-_.")
    return text[:63].rstrip("-_.") or "unhealthy"


def action_of_reason(reason: str) -> Action:
    """The action a `GpuHealth.reason` names (`xid-48: reset GPU (...)` → reset GPU); an Unhealthy device
    without one (a simulated node's `health: Unhealthy`, a lost GPU at discovery) needs a reset at least."""
    words = reason.split(" (", 1)[0].partition(": ")[2]
    for a in Action:
        if a.value == words:
            return a
    return Action.RESET_GPU
