"""The opaque configuration a ResourceClaim's allocation carries, read once for every driver and kind.

Why from `status.allocation.devices.config` and not from the claim's spec: the
scheduler copies there, at allocation, both the DeviceClass's configs
(`source: FromClass`) and the claim's own (`source: FromClaim`), in that order;
the kubelet gives the driver nothing else, and a class config the claim never
mentions must apply too. Entries of other drivers are kept (a claim may mix
drivers) and filtered by whoever asks (`Claim.opaque`).

Precedence, as the DRA API documents it for opaque config: later entries
override earlier ones, so a claim's config overrides its class's, and among a
claim's entries the last that names a request wins. This module is the one
reader of opaque config on purpose: it knows nothing of what the parameters say
(GpuConfig is checked in `gpu_config.py`, NicConfig in
`plugin/dra/network/nic_config.py`); every kind of our driver's config is read
through it, with the same precedence and the same names for where an entry is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OpaqueConfig", "configs_for", "read_opaque_configs"]


@dataclass(frozen=True)
class OpaqueConfig:
    """One `config[]` entry of the allocation with an opaque configuration."""

    #: `FromClass` or `FromClaim` (as the scheduler recorded it).
    source: str
    #: The requests it applies to (`<request>` or `<request>/<subrequest>`); empty: every request of the claim.
    requests: tuple[str, ...]
    #: `opaque.parameters`: the driver-defined object (apiVersion, kind, ...); as written, checked by its kind's parser.
    parameters: Any
    #: Its position in `status.allocation.devices.config`, to name it in errors.
    index: int
    #: `opaque.driver`: the driver it is for.
    driver: str = ""
    #: Where its author wrote it: `spec.devices.config[<n>]` (the claim's own entries, numbered as in its spec)
    #: or `config[<index>] from the DeviceClass`; empty when not known (built by hand), then `where` is used.
    authored: str = ""

    @property
    def where(self) -> str:
        return f"status.allocation.devices.config[{self.index}] ({self.source})"

    @property
    def authored_where(self) -> str:
        return self.authored or self.where

    @property
    def kind(self) -> str | None:
        """`parameters.kind`; None when the parameters are not an object or name no kind."""
        p = self.parameters
        k = p.get("kind") if isinstance(p, Mapping) else None
        return k if isinstance(k, str) else None

    def applies_to(self, request: str) -> bool:
        """True for a result of `request` (`parent/sub` of a prioritized list matches `parent` and itself)."""
        if not self.requests:
            return True
        parent = request.split("/", 1)[0]
        return request in self.requests or parent in self.requests


def read_opaque_configs(entries: Any) -> tuple[OpaqueConfig, ...]:
    """Every opaque entry of `status.allocation.devices.config` (any driver), in API order.

    Tolerant like the rest of the claim reading: an entry that is not an object, or has no `opaque`, is
    skipped (the API server validated the claim; a kind's parser checks the parameters it cares about).
    """
    out: list[OpaqueConfig] = []
    spec_index = 0
    for i, entry in enumerate(entries if isinstance(entries, Sequence) and not isinstance(entries, str) else ()):
        entry = entry if isinstance(entry, Mapping) else {}
        from_claim = entry.get("source") != "FromClass"
        authored = f"spec.devices.config[{spec_index}]" if from_claim else f"config[{i}] from the DeviceClass"
        spec_index += from_claim
        opaque = entry.get("opaque") or {}
        if not isinstance(opaque, Mapping) or not opaque:
            continue
        out.append(OpaqueConfig(source=str(entry.get("source", "")),
                                requests=tuple(str(r) for r in entry.get("requests") or ()),
                                parameters=opaque.get("parameters"), index=i,
                                driver=str(opaque.get("driver") or ""), authored=authored))
    return tuple(out)


def configs_for(configs: Sequence[OpaqueConfig], request: str) -> list[OpaqueConfig]:
    """The configs that apply to one request, lowest precedence first (class before claim, then API order)."""
    ranked = sorted(enumerate(configs), key=lambda p: (p[1].source == "FromClaim", p[0]))
    return [c for _, c in ranked if c.applies_to(request)]
