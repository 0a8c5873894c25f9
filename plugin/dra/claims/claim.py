"""A ResourceClaim, parsed once into typed objects where prepare receives it, and passed down from there.

Why one parse: the claim the API server returns is a JSON-shaped dict, and
before this module four places read it on their own (the preparer's devices,
the time-slicing's results again for their subrequest names, the NIC plan's
config entries with rules of its own, the reserved pods). Each reader had to
agree with the others on tolerance (a missing `status`, `allocation` or
`results` is nothing allocated, not a crash) and on what a field means; now
`parse_claim` decides it once and the rest reads attributes.

What it keeps: the claim's identity, its requests with their subrequests
(`firstAvailable`, KEP-4816), every allocation result with the request and the
subrequest it came from (a result's `request` is `<request>` or
`<request>/<subrequest>`), the opaque configs of every driver (`opaque.py`, the
one reader of opaque config), and the pods the claim is reserved for. The parse
never raises: what is missing stays empty (or None, for a field whose absence a
check reports by value, such as the UID), and the checks that refuse a claim
stay with the preparer, worded as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .opaque import OpaqueConfig, read_opaque_configs

__all__ = ["AllocationResult", "Claim", "DeviceRequest", "parse_claim"]


@dataclass(frozen=True)
class DeviceRequest:
    """One `spec.devices.requests[]` entry: its name and, for a prioritized list, its subrequests' names."""

    name: str
    #: `firstAvailable[].name`, in the order the scheduler tries them; empty for an `exactly` request.
    subrequests: tuple[str, ...] = ()


@dataclass(frozen=True)
class AllocationResult:
    """One `status.allocation.devices.results[]` entry."""

    #: The request it was allocated for (the parent, for a subrequest of a prioritized list).
    request: str
    #: The subrequest of `request` that was satisfied; "" when the request has none.
    subrequest: str
    driver: str | None
    pool: str | None
    device: str | None
    #: Set when the device allows multiple allocations (consumable capacity, KEP-5075); "" otherwise.
    share_id: str = ""

    @property
    def request_path(self) -> str:
        """`<request>` or `<request>/<subrequest>`, as the API writes it (what opaque configs name)."""
        return f"{self.request}/{self.subrequest}" if self.subrequest else self.request


@dataclass(frozen=True)
class Claim:
    """What the driver reads of one ResourceClaim (see the module docstring)."""

    namespace: str | None
    name: str | None
    #: `metadata.uid`; None when absent (the preparer says so by comparing it with the kubelet's).
    uid: str | None
    requests: tuple[DeviceRequest, ...]
    results: tuple[AllocationResult, ...]
    #: Every opaque entry of `status.allocation.devices.config`, any driver, in API order.
    configs: tuple[OpaqueConfig, ...]
    #: UIDs of the pods in `status.reservedFor` (the kubelet prepares a claim only once it is reserved).
    reserved_pods: tuple[str, ...]

    def results_of(self, driver: str) -> tuple[AllocationResult, ...]:
        """The results of one driver, in API order."""
        return tuple(r for r in self.results if r.driver == driver)

    def opaque(self, driver: str, kinds: Sequence[str] | None = None) -> list[OpaqueConfig]:
        """The opaque configs for `driver` (only those of `kinds`, when given), in API order: later entries
        override earlier ones (`opaque.configs_for` ranks them for one request)."""
        return [c for c in self.configs if c.driver == driver and (kinds is None or c.kind in kinds)]


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(value: Any) -> list[Mapping[str, Any]]:
    """The objects of a list field (a missing field, or one that is not a list, is empty)."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        return []
    return [v for v in value if isinstance(v, Mapping)]


def _result(r: Mapping[str, Any]) -> AllocationResult:
    request, _, sub = str(r.get("request", "")).partition("/")
    driver, pool, device = r.get("driver"), r.get("pool"), r.get("device")
    return AllocationResult(request=request, subrequest=sub,
                            driver=None if driver is None else str(driver),
                            pool=None if pool is None else str(pool),
                            device=None if device is None else str(device),
                            share_id=str(r.get("shareID") or ""))


def _request(r: Mapping[str, Any]) -> DeviceRequest:
    subs = tuple(str(s.get("name")) for s in _items(r.get("firstAvailable")) if s.get("name"))
    return DeviceRequest(name=str(r.get("name", "")), subrequests=subs)


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    """The claim as the API server returned it (a dict), typed; never raises."""
    meta = _mapping(obj.get("metadata"))
    spec_devices = _mapping(_mapping(obj.get("spec")).get("devices"))
    status = _mapping(obj.get("status"))
    allocated = _mapping(_mapping(status.get("allocation")).get("devices"))
    uid = meta.get("uid")
    return Claim(
        namespace=meta.get("namespace"), name=meta.get("name"), uid=None if uid is None else str(uid),
        requests=tuple(_request(r) for r in _items(spec_devices.get("requests"))),
        results=tuple(_result(r) for r in _items(allocated.get("results"))),
        configs=read_opaque_configs(allocated.get("config") or []),
        reserved_pods=tuple(str(r["uid"]) for r in _items(status.get("reservedFor"))
                            if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid")))
