"""The NetAttacher's ledger: which pod holds which interfaces, and how far each attachment got.

Why a file of intents: a NIC moved into a pod's namespace is invisible from the
host, so the driver must know where it put each one even after a crash. Every
step is written (durably, through a temp file and a rename) before it is taken;
the restarted driver reads where each attachment stopped and finishes it or
undoes it. The lock file next to the ledger serialises every change, between
the threads of one driver and between two drivers during a rolling update.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..atomic_file import replace_file
from ..errors import InputError
from .spec import Attached, InterfaceSpec

FORMAT_VERSION = 1
#: A pod's states: its interfaces being attached, all attached, being returned to the host.
ATTACHING, ATTACHED, DETACHING = "attaching", "attached", "detaching"


class LedgerError(InputError):
    """The ledger file cannot be trusted; the message names it and the fix."""


@dataclass
class Entry:
    """One interface of a pod: what attaching it does, and the last step begun ("prepared" … "done")."""

    attached: Attached
    step: str = "prepared"


@dataclass
class PodRecord:
    netns: str
    state: str
    #: Everything asked for, so that a restart can finish an attachment it had not yet begun for all of them.
    specs: list[InterfaceSpec] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"netns": self.netns, "state": self.state, "specs": [s.to_json() for s in self.specs],
                "interfaces": [{"attached": e.attached.to_json(), "step": e.step} for e in self.entries]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PodRecord:
        state = str(d["state"])
        if state not in (ATTACHING, ATTACHED, DETACHING):
            raise ValueError(f"unknown state {state!r}")
        return cls(netns=str(d["netns"]), state=state,
                   specs=[InterfaceSpec.from_json(s) for s in d.get("specs", ())],
                   entries=[Entry(Attached.from_json(e["attached"]), str(e["step"])) for e in d["interfaces"]])


class Ledger:
    """The ledger file at `path` (created on the first change) and its lock file `path + '.lock'`."""

    def __init__(self, path: str):
        self.path = path
        self.lock_path = path + ".lock"
        #: Times the file was written (each a full rewrite with fsyncs): benchmarks and tests.
        self.writes = 0

    def load(self) -> dict[str, PodRecord]:
        try:
            with open(self.path, encoding="utf-8") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        fix = ("the ledger says which NICs are inside which pod's network namespace: check with `ip link` "
               "on the node and in each pod, return interfaces by hand if needed, then move the file "
               "aside and restart the driver")
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if data.get("version") != FORMAT_VERSION:
                raise LedgerError(f"network attachment ledger {self.path}: format version "
                                  f"{data.get('version')!r} is not {FORMAT_VERSION} (written by another "
                                  f"release?); {fix}")
            return {str(uid): PodRecord.from_json(p) for uid, p in data["pods"].items()}
        except LedgerError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise LedgerError(f"network attachment ledger {self.path}: not a valid ledger ({e}); {fix}") from None

    def save(self, pods: dict[str, PodRecord]) -> None:
        body = {"version": FORMAT_VERSION, "pods": {uid: p.to_json() for uid, p in sorted(pods.items())}}
        replace_file(self.path, json.dumps(body, sort_keys=True) + "\n", mode=0o600, prefix=".netattach-",
                     durable=True)
        self.writes += 1

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the exclusive lock (blocking): a fresh open file each time, so threads exclude each other too."""
        os.makedirs(os.path.dirname(self.lock_path) or ".", exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
