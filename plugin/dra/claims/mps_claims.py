"""Which devices of a claim its configs put under MPS, with the limits each asks (`plugin.dra.claims.mps` runs them).

Why its own module: it reads the claim's configs through `gpu_config`, which
itself imports `mps` for `mpsConfig`; kept apart, the two import one way.

Two kinds of config ask for MPS, as in NVIDIA's driver: `GpuConfig` for full
GPUs and `MigDeviceConfig` for MIG devices (static and dynamic MIG). Which
config decides for a device is NVIDIA's rule (`getConfigResultsMap`): the
configs that apply to its request are walked from the highest precedence down;
one that names the request decides and must be of the device's kind (else the
claim is refused, naming the entry and the fix); one for every request decides
only for devices of its kind and is passed over for the others (so a claim-wide
GpuConfig and a claim-wide MigDeviceConfig each reach their own devices).
A mismatch is refused here when the config asks for MPS or is a
MigDeviceConfig; a time-slicing GpuConfig naming a MIG or NIC request is
refused by time-slicing's own rules (`plugin.dra.claims.sharing`).
"""

from __future__ import annotations

from collections.abc import Sequence

from allocator.topology import Device, DeviceKind

from .claim import Claim
from .gpu_config import KIND, MIG_KIND, GpuConfig, GpuConfigError, gpu_configs, mig_configs
from .mps import MpsSettings
from .opaque import OpaqueConfig, configs_for

#: The config kind of each device kind that has one.
_KIND_OF = {DeviceKind.GPU: KIND, DeviceKind.MIG: MIG_KIND}
_WHAT = {KIND: "a full GPU", MIG_KIND: "a MIG device"}


class MpsRefused(ValueError):
    """A claim's MPS config cannot be granted; the message names the config entry and the fix."""


def _deciding(parsed: Sequence[tuple[OpaqueConfig, GpuConfig]], request: str, name: str,
              dev: Device) -> GpuConfig | None:
    """The config that decides for `dev` (allocated for `request`) by NVIDIA's rule (module docstring)."""
    by_entry = {id(c): g for c, g in parsed}
    want = _KIND_OF.get(dev.kind)
    for entry in reversed(configs_for([c for c, _ in parsed], request)):
        cfg = by_entry[id(entry)]
        if cfg.kind == want:
            return cfg
        if entry.requests:  # it names this request, and the device is not of its kind
            if cfg.mps is None and cfg.kind == KIND:
                return None  # a GpuConfig without MPS: time-slicing's rules say whether that is wrong
            strategy = " with strategy MPS" if cfg.mps is not None else ""
            other = _KIND_OF.get(dev.kind)
            fix = (f"kind: {other} for {_WHAT[other]}, or list only the requests of its kind" if other else
                   f"list only the requests that got {_WHAT[cfg.kind]} in its requests")
            raise MpsRefused(f"{cfg.where}: {cfg.kind}{strategy} applies to request {request!r}, which got {name} "
                             f"({dev.kind.value}), not {_WHAT[cfg.kind]} (fix: {fix})")
    return None


def mps_wanted(claim: Claim, allocated: Sequence[tuple[str, Device, list[str]]],
               driver: str) -> dict[str, tuple[Device, MpsSettings]]:
    """{slice device name: (GPU or MIG device, limits)} for the claim's devices whose deciding config says MPS."""
    try:
        configs = claim.opaque(driver, kinds=(KIND, MIG_KIND))
        parsed = [*gpu_configs(configs), *mig_configs(configs)]  # configs_for ranks them
    except GpuConfigError as e:
        raise MpsRefused(str(e)) from None
    if not parsed:
        return {}
    out: dict[str, tuple[Device, MpsSettings]] = {}
    for name, dev, requests in allocated:
        for request in requests or [""]:
            cfg = _deciding(parsed, request, name, dev)
            if cfg is not None and cfg.mps is not None:
                out[name] = (dev, cfg.mps)
    return out
