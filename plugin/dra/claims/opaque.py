"""The opaque configuration a ResourceClaim's allocation carries for our driver, and which request each applies to.

Why from `status.allocation.devices.config` and not from the claim's spec: the
scheduler copies there, at allocation, both the DeviceClass's configs
(`source: FromClass`) and the claim's own (`source: FromClaim`), in that order;
the kubelet gives the driver nothing else, and a class config the claim never
mentions must apply too. Entries of other drivers are left alone (a claim may
mix drivers).

Precedence, as the DRA API documents it for opaque config: later entries
override earlier ones, so a claim's config overrides its class's, and among a
claim's entries the last that names a request wins. This module is generic on
purpose: it knows nothing of what the parameters say (GPU sharing lives in
`gpu_config.py`); any kind of our driver's config can be read through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OpaqueConfig:
    """One `config[]` entry of the allocation for our driver."""

    #: `FromClass` or `FromClaim` (as the scheduler recorded it).
    source: str
    #: The requests it applies to (`<request>` or `<request>/<subrequest>`); empty: every request of the claim.
    requests: tuple[str, ...]
    #: `opaque.parameters`: the driver-defined object (apiVersion, kind, ...); as written, checked by its kind's parser.
    parameters: Any
    #: Its position in `status.allocation.devices.config`, to name it in errors.
    index: int

    @property
    def where(self) -> str:
        return f"status.allocation.devices.config[{self.index}] ({self.source})"

    def applies_to(self, request: str) -> bool:
        """True for a result of `request` (`parent/sub` of a prioritized list matches `parent` and itself)."""
        if not self.requests:
            return True
        parent = request.split("/", 1)[0]
        return request in self.requests or parent in self.requests


def opaque_configs(claim: dict[str, Any], driver: str) -> list[OpaqueConfig]:
    """The allocation's opaque configs for `driver`, in API order (later ones override earlier ones)."""
    allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    out: list[OpaqueConfig] = []
    for i, entry in enumerate(allocation.get("config") or []):
        opaque = (entry or {}).get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        out.append(OpaqueConfig(source=str(entry.get("source", "")),
                                requests=tuple(str(r) for r in entry.get("requests") or ()),
                                parameters=opaque.get("parameters"), index=i))
    return out


def configs_for(configs: Sequence[OpaqueConfig], request: str) -> list[OpaqueConfig]:
    """The configs that apply to one request, lowest precedence first (class before claim, then API order)."""
    ranked = sorted(enumerate(configs), key=lambda p: (p[1].source == "FromClaim", p[0]))
    return [c for _, c in ranked if c.applies_to(request)]
