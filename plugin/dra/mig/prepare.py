"""Dynamic MIG at prepare: create the claim's MIG instances, destroy them at unprepare, never leak or double one.

Why a book of its own (`<plugin dir>/mig-instances.json`) written before and after every NVML
step: creating an instance and recording the prepared claim cannot be one atomic act, and a
crash between them must neither leave an instance nobody will destroy nor make a retried
prepare create a second one. The rule, every step under the checkpoint's lock (so the other
instance of the driver during a rolling update never interleaves):

1. record the intent: (claim UID, slice device) -> GPU, profile, start, state `creating`;
2. create the GPU instance and its compute instance;
3. record the instance's IDs and UUID, state `created`;
4. then the caller writes the CDI spec and records the claim in the checkpoint.

A retried prepare finds `created` and reuses the instance. After a crash between 1 and 3,
`recover()` (at driver start) looks at the GPU: an instance at the recorded placement is
adopted (its IDs recorded, state `created`), none means the create never happened and the
intent is dropped. Unprepare destroys every instance the book has for the claim (an instance
already gone counts as destroyed) and drops the entries only after NVML said so: a crash in
between leaves the entry, and the kubelet's repeated unprepare finishes the job.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from allocator.topology import Device

from ...atomic_file import replace_file
from ...errors import InputError
from .instances import MigBackend, MigError, MigInstance
from ...sources.mig_profiles import Placement, table_for
from ...sources.nvml_mig import cap_minors, caps_attribute
from ..claims.prepared import Allocated
from .devices import DYNAMIC, START

log = logging.getLogger(__name__)

BOOK_VERSION = 1


class MigBookError(InputError):
    """The MIG instance book cannot be trusted; the message names the file and the fix."""


@dataclass
class BookEntry:
    claim: str
    device: str  # slice device name
    gpu: str  # the GPU's topology name
    profile: str
    start: int
    state: str  # creating | created
    gi: int | None = None
    ci: int | None = None
    uuid: str = ""


class MigBook:
    """The file of MIG instances made for claims; only read and written under the checkpoint's lock."""

    def __init__(self, path: str):
        self.path = path

    def load(self) -> list[BookEntry]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            raise MigBookError(f"MIG instance book {self.path}: unreadable ({e}); fix: compare it with the MIG "
                               "devices on the node (nvidia-smi -L) before moving it aside") from None
        if data.get("version") != BOOK_VERSION:
            raise MigBookError(f"MIG instance book {self.path}: version {data.get('version')!r} is not {BOOK_VERSION}")
        return [BookEntry(**e) for e in data.get("instances", [])]

    def save(self, entries: list[BookEntry]) -> None:
        body = {"version": BOOK_VERSION, "instances": [asdict(e) for e in entries]}
        replace_file(self.path, json.dumps(body, indent=1, sort_keys=True) + "\n", mode=0o600,
                     prefix=".mig-instances-", durable=True)


CapsFor = Callable[[Device, MigInstance], dict[str, str]]


def simulated_caps(gpu: Device, inst: MigInstance) -> dict[str, str]:
    """Capability nodes in NVIDIA's numbering (what a simulated node's static MIG devices get too)."""
    minor = gpu.minor if gpu.minor is not None else gpu.index
    return {"caps": caps_attribute(*cap_minors(minor, inst.gi, inst.ci))}


class MigPreparer:
    """Creates and destroys the MIG instances of claims (see the module docstring); called under the lock."""

    def __init__(self, backend: MigBackend, book_path: str, gpus: Callable[[], dict[str, Device]],
                 caps: CapsFor = simulated_caps):
        self.backend = backend
        self.book = MigBook(book_path)
        self.gpus = gpus
        self.caps = caps

    def _gpu(self, name: str) -> Device:
        gpu = self.gpus().get(name)
        if gpu is None:
            raise MigError(f"GPU {name} is not on this node any more")
        return gpu

    def prepare(self, claim: str, allocated: Allocated) -> Allocated:
        """The allocated devices with each placement replaced by the MIG device made for it (raises MigError;
        then nothing of this claim is left: instances made so far are destroyed)."""
        if not any(d.attributes.get(DYNAMIC) for _, d, _ in allocated):
            return allocated
        entries = self.book.load()
        out: Allocated = []
        try:
            for name, dev, reqs in allocated:
                if dev.attributes.get(DYNAMIC):
                    dev = self._instance(claim, name, dev, entries)
                out.append((name, dev, reqs))
        except Exception:
            self.release(claim)
            raise
        return out

    def _instance(self, claim: str, name: str, dev: Device, entries: list[BookEntry]) -> Device:
        gpu = self._gpu(dev.parent or "")
        entry = next((e for e in entries if e.claim == claim and e.device == name), None)
        if entry is None or entry.state != "created":
            table = table_for(gpu.model, gpu.memory_mib)
            profile = table.profile(dev.attributes["profile"]) if table else None
            if profile is None:
                raise MigError(f"{gpu.name}: no MIG profile {dev.attributes['profile']} for {gpu.model}")
            if entry is None:
                entry = BookEntry(claim=claim, device=name, gpu=gpu.name, profile=profile.name,
                                  start=int(dev.attributes[START]), state="creating")
                entries.append(entry)
                self.book.save(entries)  # 1. the intent, before NVML is touched
            try:
                inst = self.backend.create(gpu, Placement(profile, entry.start))
            except MigError:
                entries.remove(entry)
                self.book.save(entries)
                raise
            entry.state, entry.gi, entry.ci, entry.uuid = "created", inst.gi, inst.ci, inst.uuid
            self.book.save(entries)  # 3. what was made
            log.info("MIG instance created", extra={"claim_uid": claim, "device": name, "gpu": gpu.name,
                                                    "profile": inst.profile, "gi": inst.gi, "ci": inst.ci})
        inst = MigInstance(gpu=gpu.name, profile=entry.profile, start=entry.start, size=0, gi=entry.gi or 0,
                           ci=entry.ci or 0, uuid=entry.uuid)
        return replace(dev, uuid=entry.uuid,
                       attributes={**dev.attributes, "gi": str(inst.gi), "ci": str(inst.ci),
                                   "index": f"{gpu.index}:{inst.gi}", **self.caps(gpu, inst)})

    def release(self, claim: str) -> None:
        """Destroy the claim's instances (raises MigError when NVML refuses; the entries then stay)."""
        entries = self.book.load()
        mine = [e for e in entries if e.claim == claim]
        for e in mine:
            gpu = self._gpu(e.gpu)
            if e.state == "created" and e.gi is not None:
                self.backend.destroy(gpu, e.gi, e.ci or 0)
            else:  # an intent: an instance at its placement may exist (crash during the create)
                for inst in self.backend.instances(gpu):
                    if inst.start == e.start and inst.profile == e.profile:
                        self.backend.destroy(gpu, inst.gi, inst.ci)
            entries.remove(e)
            self.book.save(entries)
            log.info("MIG instance destroyed", extra={"claim_uid": claim, "device": e.device, "gpu": e.gpu,
                                                      "gi": e.gi, "ci": e.ci})

    def recover(self, _claims: Any = None) -> list[BookEntry]:
        """At start: settle intents a crash left (adopt the instance found at the placement, or drop the
        intent); returns the entries adopted or dropped."""
        entries = self.book.load()
        settled = []
        for e in [e for e in entries if e.state == "creating"]:
            gpu = self.gpus().get(e.gpu)
            found = None
            if gpu is not None:
                found = next((i for i in self.backend.instances(gpu)
                              if i.start == e.start and i.profile == e.profile
                              and not any(o.state == "created" and o.gpu == e.gpu and o.gi == i.gi for o in entries)),
                             None)
            if found is not None:
                e.state, e.gi, e.ci, e.uuid = "created", found.gi, found.ci, found.uuid
                log.info("MIG instance of an interrupted prepare adopted", extra={"claim_uid": e.claim, "gi": e.gi})
            else:
                entries.remove(e)
                log.info("MIG instance intent dropped: the create never happened", extra={"claim_uid": e.claim})
            settled.append(e)
        if settled:
            self.book.save(entries)
        return settled

    def instances(self) -> list[BookEntry]:
        return self.book.load()
