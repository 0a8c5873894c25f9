"""`GpuConfig`: how a claim asks for GPU sharing (time-slicing) through opaque claim configuration.

The shape is NVIDIA's DRA driver's (k8s-dra-driver-gpu, `resource.nvidia.com/v1beta1`
`GpuConfig`), so a user who knows that driver writes the same thing:

    config:
    - requests: [gpu]
      opaque:
        driver: topo.dev
        parameters:
          apiVersion: gpu.topo-device-plugin.io/v1alpha1   # or resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing:
            strategy: TimeSlicing
            timeSlicingConfig: {interval: Short}            # Default | Short | Medium | Long

Why both apiVersions: the parameters of a claim written for NVIDIA's driver can
be copied under `driver: topo.dev` unchanged (the device class and the
`driver` field must name ours in any case; a config entry for `gpu.nvidia.com`
is NVIDIA's business and is never read here). Both mean the same.

What is refused, with the entry, the field and the fix (the claim is not
prepared; the kubelet shows the message in the pod's events): an unknown
apiVersion for `kind: GpuConfig`, unknown fields (a typo must not silently
mean "no sharing"), a strategy other than TimeSlicing or MPS, an interval
outside the four names, `mpsConfig` next to TimeSlicing and `timeSlicingConfig`
next to MPS. `strategy: MPS` and its `mpsConfig` are read by `plugin.dra.claims.mps`. Configs of other kinds are other parsers'
(e.g. NIC configs); this module reads `kind: GpuConfig` and `kind: MigDeviceConfig`.

`MigDeviceConfig` (NVIDIA's kind for MIG devices, `migconfig.go`) has the same
apiVersions and only `sharing` with `strategy` and `mpsConfig`, as NVIDIA's
`MigDeviceSharing`: `strategy: MPS` runs a control daemon for each MIG device
of its requests (`plugin.dra.claims.mps`); `strategy: TimeSlicing` is accepted
and changes nothing, as in NVIDIA's driver (a MIG device has no time-slice
setting of its own: its processes take turns already), and
`timeSlicingConfig` is refused with that fix. Which config applies to which
device follows NVIDIA's rule (`getConfigResultsMap`): a config for every
request applies only to devices of its kind (GpuConfig: full GPUs,
MigDeviceConfig: MIG devices), one that names a request whose device is of the
other kind is refused (`plugin.dra.claims.mps_claims`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .mps import MpsConfigError, MpsSettings, parse_mps_config
from .opaque import OpaqueConfig, configs_for

KIND = "GpuConfig"
#: NVIDIA's kind for MIG devices (static and dynamic MIG).
MIG_KIND = "MigDeviceConfig"
API_VERSION = "gpu.topo-device-plugin.io/v1alpha1"
#: NVIDIA's DRA driver's config API, accepted with the same meaning.
NVIDIA_API_VERSION = "resource.nvidia.com/v1beta1"
API_VERSIONS = (API_VERSION, NVIDIA_API_VERSION)

TIME_SLICING = "TimeSlicing"
MPS = "MPS"


class Interval(str, Enum):
    """The CUDA time-slice lengths `nvidia-smi compute-policy --set-timeslice` knows, by NVIDIA's names."""

    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"

    @property
    def code(self) -> int:
        """The value `nvidia-smi compute-policy --set-timeslice` takes (0: default ... 3: long)."""
        return list(Interval).index(self)


class GpuConfigError(ValueError):
    """A GpuConfig the driver cannot apply; the message names the config entry, the field and the fix."""


@dataclass(frozen=True)
class GpuConfig:
    """What one config entry asks of the GPUs of its requests."""

    #: The time-slice interval; None: no sharing asked (the GPU is left as it is).
    timeslice: Interval | None
    #: Where it came from, for messages.
    where: str
    #: `strategy: MPS`: the claim's MPS limits (None: not MPS).
    mps: MpsSettings | None = None
    #: `GpuConfig` (full GPUs) or `MigDeviceConfig` (MIG devices).
    kind: str = KIND


def _fields(obj: Any, where: str, allowed: Sequence[str]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise GpuConfigError(f"{where}: must be an object, not {type(obj).__name__}")
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        raise GpuConfigError(f"{where}: unknown field {unknown[0]!r} (fix: use only {', '.join(allowed)})")
    return obj


def _parameters(entry: OpaqueConfig, kind: str) -> tuple[dict[str, Any], str] | None:
    """The entry's parameters and where they are, when they are a `kind` of a version we know; None when they
    are another kind of config. Both kinds share the envelope: apiVersion, kind, sharing."""
    params = entry.parameters
    where = f"{entry.where}.opaque.parameters"
    if not isinstance(params, dict) or params.get("kind") != kind:
        return None
    api = params.get("apiVersion")
    if api not in API_VERSIONS:
        raise GpuConfigError(f"{where}.apiVersion: {api!r} is not a {kind} version this driver knows "
                             f"(fix: apiVersion: {API_VERSION}, or NVIDIA's {NVIDIA_API_VERSION})")
    return _fields(params, where, ("apiVersion", "kind", "sharing")), where


def parse_gpu_config(entry: OpaqueConfig) -> GpuConfig | None:
    """The entry's GpuConfig; None when it is another kind of config; raises `GpuConfigError`."""
    found = _parameters(entry, KIND)
    if found is None:
        return None
    params, where = found
    sharing = params.get("sharing")
    if sharing is None:
        return GpuConfig(timeslice=None, where=entry.where)
    sharing = _fields(sharing, f"{where}.sharing", ("strategy", "timeSlicingConfig", "mpsConfig"))
    strategy = sharing.get("strategy")
    if strategy == MPS:
        if sharing.get("timeSlicingConfig") is not None:
            raise GpuConfigError(f"{where}.sharing.timeSlicingConfig: cannot be used with strategy MPS "
                                 "(fix: remove timeSlicingConfig, or use strategy: TimeSlicing)")
        try:
            return GpuConfig(timeslice=None, where=entry.where,
                             mps=parse_mps_config(sharing.get("mpsConfig"), f"{where}.sharing.mpsConfig"))
        except MpsConfigError as e:
            raise GpuConfigError(str(e)) from None
    if strategy != TIME_SLICING:
        raise GpuConfigError(f"{where}.sharing.strategy: {strategy!r} is not a sharing strategy "
                             f"(fix: strategy: {TIME_SLICING} or {MPS})")
    if sharing.get("mpsConfig") is not None:
        raise GpuConfigError(f"{where}.sharing.mpsConfig: cannot be used with strategy TimeSlicing "
                             "(fix: remove mpsConfig)")
    ts = sharing.get("timeSlicingConfig")
    if ts is None:
        return GpuConfig(timeslice=Interval.DEFAULT, where=entry.where)
    ts = _fields(ts, f"{where}.sharing.timeSlicingConfig", ("interval",))
    raw = ts.get("interval", Interval.DEFAULT.value)
    try:
        interval = Interval(raw)
    except ValueError:
        raise GpuConfigError(f"{where}.sharing.timeSlicingConfig.interval: {raw!r} is not an interval "
                             f"(fix: one of {', '.join(i.value for i in Interval)})") from None
    return GpuConfig(timeslice=interval, where=entry.where)


def parse_mig_config(entry: OpaqueConfig) -> GpuConfig | None:
    """The entry's MigDeviceConfig (as a `GpuConfig` of `kind` MIG_KIND, never with a time-slice); None when
    it is another kind of config; raises `GpuConfigError` naming the field and the fix."""
    found = _parameters(entry, MIG_KIND)
    if found is None:
        return None
    params, where = found
    sharing = params.get("sharing")
    if sharing is None:
        return GpuConfig(timeslice=None, where=entry.where, kind=MIG_KIND)
    if isinstance(sharing, dict) and sharing.get("timeSlicingConfig") is not None:
        raise GpuConfigError(f"{where}.sharing.timeSlicingConfig: a MIG device has no time-slice setting of its "
                             "own (fix: remove timeSlicingConfig; strategy: TimeSlicing alone is accepted and "
                             "changes nothing, as in NVIDIA's driver)")
    sharing = _fields(sharing, f"{where}.sharing", ("strategy", "mpsConfig"))
    strategy = sharing.get("strategy")
    if strategy == MPS:
        try:
            return GpuConfig(timeslice=None, where=entry.where, kind=MIG_KIND,
                             mps=parse_mps_config(sharing.get("mpsConfig"), f"{where}.sharing.mpsConfig"))
        except MpsConfigError as e:
            raise GpuConfigError(str(e)) from None
    if strategy != TIME_SLICING:
        raise GpuConfigError(f"{where}.sharing.strategy: {strategy!r} is not a sharing strategy "
                             f"(fix: strategy: {MPS}, or {TIME_SLICING}, which changes nothing on a MIG device)")
    if sharing.get("mpsConfig") is not None:
        raise GpuConfigError(f"{where}.sharing.mpsConfig: cannot be used with strategy TimeSlicing "
                             "(fix: remove mpsConfig, or use strategy: MPS)")
    return GpuConfig(timeslice=None, where=entry.where, kind=MIG_KIND)


def gpu_configs(configs: Sequence[OpaqueConfig]) -> list[tuple[OpaqueConfig, GpuConfig]]:
    """Every GpuConfig among `configs`, each checked (raises `GpuConfigError` for the first bad one)."""
    out = []
    for c in configs:
        parsed = parse_gpu_config(c)
        if parsed is not None:
            out.append((c, parsed))
    return out


def mig_configs(configs: Sequence[OpaqueConfig]) -> list[tuple[OpaqueConfig, GpuConfig]]:
    """Every MigDeviceConfig among `configs`, each checked (raises `GpuConfigError` for the first bad one)."""
    out = []
    for c in configs:
        parsed = parse_mig_config(c)
        if parsed is not None:
            out.append((c, parsed))
    return out


def config_for_request(parsed: Sequence[tuple[OpaqueConfig, GpuConfig]],
                       request: str) -> tuple[OpaqueConfig, GpuConfig] | None:
    """The GpuConfig that decides for a request (`<request>` or `<request>/<subrequest>`), with its entry:
    the one of highest precedence that applies to it."""
    applicable = configs_for([c for c, _ in parsed], request)
    if not applicable:
        return None
    by_entry = {id(c): g for c, g in parsed}
    return applicable[-1], by_entry[id(applicable[-1])]
