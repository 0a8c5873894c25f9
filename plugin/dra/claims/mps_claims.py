"""Which GPUs of a claim its GpuConfigs put under MPS, with the limits each asks (`plugin.dra.claims.mps` runs them).

Why its own module: it reads the claim's configs through `gpu_config`, which
itself imports `mps` for `mpsConfig`; kept apart, the two import one way.
The rules are time-slicing's (`plugin.dra.claims.sharing.GpuSharing.wanted`): the
config of highest precedence for each request decides; a config that names a
request which got no full GPU is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from allocator.topology import Device, DeviceKind

from .claim import Claim
from .gpu_config import GpuConfigError, config_for_request, gpu_configs
from .mps import MpsSettings


class MpsRefused(ValueError):
    """A claim's MPS config cannot be granted; the message names the config entry and the fix."""


def mps_wanted(claim: Claim, allocated: Sequence[tuple[str, Device, list[str]]],
               driver: str) -> dict[str, tuple[Device, MpsSettings]]:
    """{slice device name: (GPU, limits)} for the claim's GPUs whose request's GpuConfig says MPS."""
    try:
        parsed = gpu_configs(claim.opaque(driver))
    except GpuConfigError as e:
        raise MpsRefused(str(e)) from None
    out: dict[str, tuple[Device, MpsSettings]] = {}
    for name, dev, requests in allocated:
        for request in requests or [""]:
            found = config_for_request(parsed, request)
            if found is None or found[1].mps is None:
                continue
            entry, cfg = found
            if dev.kind is not DeviceKind.GPU:
                if entry.requests:
                    raise MpsRefused(f"{cfg.where}: GpuConfig with strategy MPS applies to request {request!r}, "
                                     f"which got {name} ({dev.kind.value}), not a full GPU (fix: list only GPU "
                                     "requests in its requests)")
                continue
            assert cfg.mps is not None
            out[name] = (dev, cfg.mps)
    return out
