"""Faults that outlive a daemon restart, and the operator's clears: two small JSON files in one directory.

Why a file: a reboot is the evidence `restart node` faults wait for, and the
daemon does not survive one; a daemon restart (upgrade, crash) must not turn a
GPU that needs a reset Healthy either (NVIDIA's plugin forgets, #189). So each
fault is written to `<dir>/gpu-health.json` with the node's boot ID: on start, a
fault from this boot is restored (its quiet period restarted), one from an
earlier boot is dropped, the reboot being its evidence.

The clear: `topo-device-plugin health clear --gpu GPU-<uuid>|GPU3|all` adds an
entry with a fresh ID to `<dir>/gpu-health-clear.json` (atomically); the daemon
watches that file (inotify, plugin/watch/filewatch.py) and ends the named GPUs'
faults at once. Entries it has applied, and those already there when it started,
are not applied again; the command drops entries older than an hour so the file
stays small.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..atomic_file import replace_file
from .catalog import Action

log = logging.getLogger(__name__)

__all__ = ["CLEAR_FILE", "STATE_FILE", "Clear", "SavedFault", "add_clear", "load_faults", "read_clears",
           "restorable", "save_faults"]

STATE_FILE = "gpu-health.json"
CLEAR_FILE = "gpu-health-clear.json"
_KEEP_CLEARS_S = 3600.0


@dataclass(frozen=True)
class SavedFault:
    uuid: str
    action: Action
    cause: str
    detail: str
    boot_id: str | None


@dataclass(frozen=True)
class Clear:
    id: str
    gpu: str  # a UUID, a GPU name (GPU3) or "all"
    at: float


def save_faults(directory: str, faults: Mapping[str, SavedFault]) -> None:
    """Write every fault (keyed by UUID); an unwritable directory is logged, never raised."""
    doc = {"version": 1, "faults": [{"uuid": f.uuid, "action": f.action.value, "cause": f.cause,
                                     "detail": f.detail, "bootId": f.boot_id} for f in faults.values()]}
    try:
        os.makedirs(directory, exist_ok=True)
        replace_file(os.path.join(directory, STATE_FILE), json.dumps(doc, indent=1) + "\n", mode=0o644,
                     prefix=".gpu-health.", durable=True)
    except OSError as e:
        log.warning("cannot keep GPU faults across restarts", extra={"dir": directory, "reason": str(e)})


def load_faults(directory: str) -> dict[str, SavedFault]:
    """The faults saved by the last daemon; a missing or unreadable file is none (logged when unreadable)."""
    path = os.path.join(directory, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        out = {}
        for e in doc.get("faults", ()):
            out[str(e["uuid"])] = SavedFault(str(e["uuid"]), Action(e["action"]), str(e["cause"]),
                                             str(e.get("detail", "")), e.get("bootId"))
        return out
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("saved GPU faults unreadable; starting without them", extra={"file": path, "reason": str(e)})
        return {}


def read_clears(directory: str) -> list[Clear]:
    path = os.path.join(directory, CLEAR_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            doc: Any = json.load(f)
        return [Clear(str(e["id"]), str(e["gpu"]), float(e.get("at", 0))) for e in doc.get("clears", ())]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        log.warning("the GPU health clear file is unreadable; ignored", extra={"file": path, "reason": str(e)})
        return []


def add_clear(directory: str, gpus: list[str], now: float | None = None) -> list[Clear]:
    """Append one clear per GPU (IDs fresh), keep the last hour's; returns the new entries."""
    now = time.time() if now is None else now
    kept = [c for c in read_clears(directory) if now - c.at < _KEEP_CLEARS_S]
    new = [Clear(uuidlib.uuid4().hex, g, now) for g in gpus]
    doc = {"version": 1, "clears": [{"id": c.id, "gpu": c.gpu, "at": c.at} for c in kept + new]}
    os.makedirs(directory, exist_ok=True)
    replace_file(os.path.join(directory, CLEAR_FILE), json.dumps(doc, indent=1) + "\n", mode=0o644,
                 prefix=".gpu-health-clear.", durable=True)
    return new


def restorable(directory: str, boot_id: str | None, uuids: Mapping[str, str]) -> dict[str, SavedFault]:
    """{GPU name: fault} saved in this boot for the GPUs `uuids` ({name: UUID}) names: what the source
    serves as Unhealthy from its first answer, before the monitor thread runs."""
    by_uuid = {u: n for n, u in uuids.items()}
    return {by_uuid[u]: f for u, f in load_faults(directory).items()
            if u in by_uuid and not (f.boot_id and boot_id and f.boot_id != boot_id)}
