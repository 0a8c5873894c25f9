"""Our entries of a ResourceClaim's `status.devices`, kept as wanted in the background.

Why in the background: the pod-network side learns what to write while the
container runtime waits for its answer (RunPodSandbox through NRI, whose
default deadline is 2 s), and the claim status is information for people and
tools, not something the pod needs to start. So a change is queued and written
by one task: the latest wanted state per claim wins (a pod started and deleted
quickly writes once or twice, not a backlog), a failed write is retried with
growing, jittered delays (plugin.backoff.Backoff) and a claim that is gone (404) is
dropped. Each write is a server-side apply of all our entries of that claim
(`KubeApi.apply_claim_status`), so an empty list clears them.

Entries (resource.k8s.io/v1 AllocatedDeviceStatus): `driver`, `pool`,
`device`, `conditions` (metav1.Condition: type, status, reason, message,
lastTransitionTime) and, for an attached NIC, `networkData` (NetworkDeviceData:
`interfaceName`, `ips` in CIDR form, `hardwareAddress`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ...backoff import Backoff
from ...kube.errors import KubeNotFound

log = logging.getLogger(__name__)

#: metav1.Condition.message is at most 32768 characters.
MAX_MESSAGE = 32768


class ClaimStatusApi(Protocol):
    async def apply_claim_status(self, namespace: str, name: str, devices: list[dict[str, Any]],
                                 field_manager: str) -> None: ...


def condition(ready: bool, reason: str, message: str) -> dict[str, Any]:
    """A `Ready` condition (metav1.Condition)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"type": "Ready", "status": "True" if ready else "False", "reason": reason,
            "message": message[:MAX_MESSAGE], "lastTransitionTime": now}


def device_entry(driver: str, pool: str, device: str, conditions: Sequence[dict[str, Any]],
                 network: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"driver": driver, "pool": pool, "device": device, "conditions": list(conditions)}
    if network is not None:
        out["networkData"] = network
    return out


@dataclass(frozen=True)
class _Key:
    namespace: str
    name: str


class ClaimStatusWriter:
    """Writes the wanted `status.devices` entries of each claim, latest first-come, retried until done."""

    def __init__(self, api: ClaimStatusApi, driver: str, *, retry_initial_s: float = 0.5, retry_max_s: float = 30.0,
                 timeout_s: float = 10.0):
        self.api = api
        self.driver = driver
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.timeout_s = timeout_s
        self._wanted: dict[_Key, list[dict[str, Any]]] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None
        #: Writes done and failed attempts (tests, logs).
        self.written = 0
        self.failures = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="claim-status-writer")

    async def stop(self) -> None:
        """Stop writing; what is still queued is dropped (the next start's resync writes it again)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def set(self, namespace: str, name: str, devices: list[dict[str, Any]]) -> None:
        """Want exactly `devices` as our entries of the claim (`[]`: none)."""
        self._wanted[_Key(namespace, name)] = devices
        self._idle.clear()
        self._wake.set()

    async def flush(self) -> None:
        """Return once everything wanted so far is written (or dropped as gone)."""
        await self._idle.wait()

    async def _run(self) -> None:
        backoff = Backoff(self.retry_initial_s, self.retry_max_s)
        while True:
            if not self._wanted:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            key = next(iter(self._wanted))
            devices = self._wanted.pop(key)
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self.api.apply_claim_status(key.namespace, key.name, devices, self.driver)
            except asyncio.CancelledError:
                raise
            except KubeNotFound:
                log.info("claim gone; its status is not written", extra={"claim": f"{key.namespace}/{key.name}"})
                continue
            except Exception as e:  # noqa: BLE001 (any failure: retry later, never end the writer)
                self.failures += 1
                self._wanted.setdefault(key, devices)  # unless a newer state came meanwhile
                delay = backoff.next()
                log.warning("writing the claim status failed; retrying",
                            extra={"claim": f"{key.namespace}/{key.name}", "error": str(e) or type(e).__name__,
                                   "retry_in_s": round(delay, 2)})
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            self.written += 1
