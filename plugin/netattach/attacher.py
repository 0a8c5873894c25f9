"""NetAttacher: a pod's NICs into its network namespace and back, recorded so a restart loses nothing.

Why a ledger and not the kernel's state alone: once inside a pod's namespace a
NIC cannot be seen from the host, and a pod killed while we were down leaves
no trace of which NIC it held. So every step is recorded before it is taken
(ledger.py) and every step is repeatable (links.py): a restart at any point
finishes an attachment (`attach_pod` again, or `reconcile` for a live pod) or
undoes it (`detach_pod`, or `reconcile` for a pod that is gone), and never
moves an interface twice: an attached pod is answered from its record.

All netlink work is blocking and runs in a worker thread; one lock (an asyncio
lock for ordering, the ledger's file lock for the threads and for a second
driver instance) keeps two calls from interleaving on one interface.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from . import links
from .ledger import ATTACHED, ATTACHING, DETACHING, Entry, Ledger, PodRecord
from .spec import AttachError, Attached, DetachError, InterfaceSpec, Outcome

log = logging.getLogger(__name__)
T = TypeVar("T")


class NetAttacher:
    """The pods' attachments on this node, kept in the ledger file at `ledger_path`.

    `settle_s`: how long a detach waits for the kernel to return a device from a namespace that just died.
    `on_record(label)`: called after each durable ledger write (label "<pod>/<interface>/<step>" or
    "<pod>/<state>"); whatever it raises propagates as from a crash at that point (tests stop there).
    Raises LedgerError (naming the file and the fix) when the ledger cannot be read.
    """

    def __init__(self, ledger_path: str, *, settle_s: float = links.SETTLE_S,
                 on_record: Callable[[str], None] | None = None):
        self.ledger = Ledger(ledger_path)
        self.settle_s = settle_s
        self.on_record = on_record
        self._lock = asyncio.Lock()
        with self.ledger.locked():
            self._pods: dict[str, PodRecord] = self.ledger.load()

    # -- public, async -------------------------------------------------------------------------------
    async def attach_pod(self, pod_uid: str, netns: str, specs: Sequence[InterfaceSpec]) -> list[Attached]:
        """Attach `specs` into the pod's namespace `netns`, all or none (AttachError); the record if done."""
        return await self._run(self._attach_pod, pod_uid, netns, list(specs))

    async def detach_pod(self, pod_uid: str) -> dict[str, Outcome]:
        """Return the pod's interfaces to the host; host name → how each ended (LOST: destroyed with the
        namespace). Nothing recorded: {}. DetachError leaves the rest recorded for a retry."""
        return await self._run(self._detach_pod, pod_uid)

    async def reconcile(self, live: Mapping[str, str]) -> None:
        """`live`: pod uid → netns of the pods running now. Detach every other pod's interfaces (and those
        recorded for another namespace of a live pod); finish attachments a crash interrupted. Failures are
        logged per pod, never raised: one bad pod must not keep the others' NICs away."""
        await self._run(self._reconcile, dict(live))

    def attached(self, pod_uid: str) -> list[Attached]:
        """What is attached to the pod (as of the last change made or read here); [] if nothing is."""
        pod = self._pods.get(pod_uid)
        return [e.attached for e in pod.entries] if pod is not None and pod.state == ATTACHED else []

    # -- blocking work (in a worker thread, under the ledger's file lock) ----------------------------
    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        async with self._lock:
            return await asyncio.to_thread(self._locked, fn, *args)

    def _locked(self, fn: Callable[..., T], *args: object) -> T:
        with self.ledger.locked():
            self._pods = self.ledger.load()  # another instance may have changed it
            return fn(*args)

    def _save(self, label: str) -> None:
        self.ledger.save(self._pods)
        if self.on_record is not None:
            self.on_record(label)

    def _attach_pod(self, uid: str, netns: str, specs: list[InterfaceSpec]) -> list[Attached]:
        pod = self._pods.get(uid)
        if pod is not None and pod.state == ATTACHED and pod.netns == netns:
            return [e.attached for e in pod.entries]
        if pod is not None and (pod.state == DETACHING or pod.netns != netns):
            self._detach_pod(uid)  # an earlier sandbox's attachment: finish returning it first
            pod = None
        self._check_conflicts(uid, specs)
        if pod is None:
            pod = self._pods[uid] = PodRecord(netns=netns, state=ATTACHING, specs=list(specs))
            self._save(f"{uid}/{ATTACHING}")
        elif [s.to_json() for s in pod.specs] != [s.to_json() for s in specs]:
            pod.specs = list(specs)
            self._save(f"{uid}/{ATTACHING}")
        return self._finish_attach(uid, pod)

    def _check_conflicts(self, uid: str, specs: list[InterfaceSpec]) -> None:
        seen_host: set[str] = set()
        seen_pod: set[str] = set()
        for s in specs:
            if s.host_name in seen_host:
                raise AttachError("check", s.host_name, "named twice for one pod")
            if s.pod_name in seen_pod:
                raise AttachError("check", s.host_name, f"two interfaces would be called {s.pod_name} in the pod")
            seen_host.add(s.host_name)
            seen_pod.add(s.pod_name)
            for other, rec in self._pods.items():
                if other != uid and any(e.attached.spec.host_name == s.host_name for e in rec.entries):
                    raise AttachError("check", s.host_name, f"already attached to pod {other}")

    def _finish_attach(self, uid: str, pod: PodRecord) -> list[Attached]:
        """Attach every spec of `pod` not yet done (resuming from the recorded step); all or nothing."""
        wanted = {s.host_name: s for s in pod.specs}
        for stale in [e for e in pod.entries if wanted.get(e.attached.spec.host_name) != e.attached.spec]:
            self._undo_entry(uid, pod, stale)  # recorded for a spec no longer asked for
        try:
            for spec in pod.specs:
                entry = next((e for e in pod.entries if e.attached.spec.host_name == spec.host_name), None)
                if entry is None:
                    entry = Entry(links.prepare(spec, pod.netns))
                    pod.entries.append(entry)
                    self._save(f"{uid}/{spec.host_name}/prepared")
                if entry.step == "done":
                    continue

                def progress(step: str, entry: Entry = entry) -> None:
                    entry.step = step
                    self._save(f"{uid}/{entry.attached.spec.host_name}/{step}")

                links.apply(entry.attached, progress)
                entry.step = "done"
                self._save(f"{uid}/{spec.host_name}/done")
        except AttachError:
            self._undo_pod(uid, pod)
            raise
        pod.state = ATTACHED
        self._save(f"{uid}/{ATTACHED}")
        return [e.attached for e in pod.entries]

    def _undo_entry(self, uid: str, pod: PodRecord, entry: Entry) -> Outcome:
        outcome = links.detach(entry.attached, settle_s=self.settle_s)
        pod.entries.remove(entry)
        self._save(f"{uid}/{entry.attached.spec.host_name}/detached")
        return outcome

    def _undo_pod(self, uid: str, pod: PodRecord) -> None:
        """After a failed attachment: return what the pod got; the record goes once all is back."""
        try:
            for entry in reversed(list(pod.entries)):
                self._undo_entry(uid, pod, entry)
        except DetachError as e:  # keep the rest recorded: detach_pod or reconcile retries
            pod.state = DETACHING
            self._save(f"{uid}/{DETACHING}")
            log.error("undoing a failed attachment left interfaces behind", extra={"pod": uid, "error": str(e)})
            return
        del self._pods[uid]
        self._save(f"{uid}/removed")

    def _detach_pod(self, uid: str) -> dict[str, Outcome]:
        pod = self._pods.get(uid)
        if pod is None:
            return {}
        if pod.state != DETACHING:
            pod.state = DETACHING
            self._save(f"{uid}/{DETACHING}")
        outcomes: dict[str, Outcome] = {}
        for entry in reversed(list(pod.entries)):
            outcomes[entry.attached.spec.host_name] = self._undo_entry(uid, pod, entry)
        del self._pods[uid]
        self._save(f"{uid}/removed")
        log.info("detached pod", extra={"pod": uid, "outcomes": {k: v.value for k, v in outcomes.items()}})
        return outcomes

    def _reconcile(self, live: dict[str, str]) -> None:
        for uid in sorted(self._pods):
            pod = self._pods.get(uid)
            if pod is None:
                continue
            try:
                if live.get(uid) != pod.netns or pod.state == DETACHING:
                    self._detach_pod(uid)
                elif pod.state == ATTACHING:
                    self._finish_attach(uid, pod)
            except (AttachError, DetachError) as e:
                log.error("reconciling a pod's network attachments failed", extra={"pod": uid, "error": str(e)})
