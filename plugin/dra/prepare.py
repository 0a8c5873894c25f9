"""Preparing and unpreparing ResourceClaims on this node: the logic behind the kubelet's DRA calls.

What "prepared" means here: the claim's devices (those the scheduler
allocated from our pool) have a CDI spec on disk, and the claim is recorded in
the checkpoint with the CDI device IDs the kubelet hands to the runtime.

Rules (kubelet DRA plugin contract, pkg/kubelet/cm/dra):
- idempotent per claim UID: the kubelet repeats NodePrepareResources after
  restarts; a recorded claim is answered from the checkpoint, never prepared
  twice, and its answer does not change while it stays prepared;
- unprepare of a claim we do not know succeeds (it may never have been
  prepared here, or was already unprepared);
- a failure is reported per claim (the `error` field), never by failing the
  whole RPC, so one bad claim does not block the others.

The ResourceClaim itself is read from the API server (the kubelet only sends
namespace, name and UID): its `status.allocation.devices.results` for our
driver say which devices of our pool to prepare.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from allocator.topology import Device, NodeTopology

from .cdi import ClaimCdi
from .checkpoint import ClaimCheckpoint, PreparedClaim, PreparedDevice
from .slices import SliceOptions, device_table

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


class PrepareError(Exception):
    """A claim cannot be prepared; the message goes to the kubelet (and the pod's events)."""


class ClaimPreparer:
    def __init__(self, *, options: SliceOptions, checkpoint: ClaimCheckpoint, cdi: ClaimCdi,
                 read_claim: ClaimReader, topology: Callable[[], NodeTopology]):
        self.options = options
        self.checkpoint = checkpoint
        self.cdi = cdi
        self.read_claim = read_claim
        self.topology = topology

    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """The prepared claim (from the checkpoint when already prepared); raises PrepareError."""
        _check_ref(ref)
        known = await self.checkpoint.update(lambda claims: claims.get(ref.uid))
        if known is not None:
            return known
        # Read the claim without holding the lock: another instance may prepare meanwhile.
        allocated = self._allocated_devices(ref, await self._read(ref))

        def record(claims: dict[str, PreparedClaim]) -> tuple[PreparedClaim, bool]:
            if ref.uid in claims:
                return claims[ref.uid], False
            ids = self.cdi.write_claim_spec(ref.uid, [(name, dev) for name, dev, _ in allocated])
            claims[ref.uid] = PreparedClaim(
                uid=ref.uid, namespace=ref.namespace, name=ref.name,
                devices=tuple(PreparedDevice(pool=self.options.pool, device=name, requests=tuple(reqs),
                                             cdi_device_ids=tuple(cdi))
                              for (name, _, reqs), cdi in zip(allocated, ids)),
            )
            return claims[ref.uid], True

        prepared, new = await self.checkpoint.update(record)
        if new:
            log.info("prepared claim", extra={"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid,
                                              "devices": [d.device for d in prepared.devices]})
        return prepared

    async def unprepare(self, ref: ClaimRef) -> None:
        _check_ref(ref)

        def drop(claims: dict[str, PreparedClaim]) -> PreparedClaim | None:
            known = claims.pop(ref.uid, None)
            # Also when unknown: a crash between writing the CDI spec and the checkpoint leaves a spec behind.
            self.cdi.remove_claim_spec(ref.uid)
            return known

        if await self.checkpoint.update(drop) is not None:
            log.info("unprepared claim", extra={"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid})

    async def _read(self, ref: ClaimRef) -> dict[str, Any]:
        try:
            return await self.read_claim(ref.namespace, ref.name)
        except Exception as e:  # noqa: BLE001 (API errors of any kind become a per-claim error)
            status = getattr(e, "status", None)
            if status == 404:
                raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} not found") from None
            raise PrepareError(f"reading ResourceClaim {ref.namespace}/{ref.name}: "
                               f"{status or type(e).__name__}: {getattr(e, 'reason', None) or e}") from None

    def _allocated_devices(self, ref: ClaimRef, claim: dict[str, Any]) -> list[tuple[str, Device, list[str]]]:
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        uid = claim.get("metadata", {}).get("uid")
        if uid != ref.uid:
            raise PrepareError(f"{where} has UID {uid}, the kubelet asked for {ref.uid} (deleted and created again?)")
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        ours = [r for r in results if r.get("driver") == self.options.driver_name]
        if not ours:
            raise PrepareError(f"{where} has no devices allocated from driver {self.options.driver_name}")
        table = device_table(self.topology(), self.options)
        out: dict[str, tuple[str, Device, list[str]]] = {}
        for r in ours:
            pool, name = r.get("pool"), r.get("device")
            if pool != self.options.pool:
                raise PrepareError(f"{where}: device {name} is from pool {pool}, this node serves pool "
                                   f"{self.options.pool}")
            dev = table.get(name)
            if dev is None:
                raise PrepareError(f"{where}: device {name} is not on this node any more")
            if not dev.healthy:
                raise PrepareError(f"{where}: device {name} ({dev.name}) is {dev.health}")
            request = str(r.get("request", "")).split("/", 1)[0]  # subrequests report their parent request
            entry = out.setdefault(name, (name, dev, []))
            if request and request not in entry[2]:
                entry[2].append(request)
        return list(out.values())


def _check_ref(ref: ClaimRef) -> None:
    missing = [f for f in ("namespace", "uid", "name") if not getattr(ref, f)]
    if missing:
        raise PrepareError(f"claim {ref.namespace}/{ref.name}: {', '.join(missing)} must be set")
