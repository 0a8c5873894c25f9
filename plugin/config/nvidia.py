"""NVIDIA's `flags:` keys in our config file: what an operator switching from NVIDIA's plugin brings along.

Why: NVIDIA's config file (`version: v1`, `flags`, `sharing`, `resources`,
`imex`) must work unchanged. NVIDIA's own reader ignores keys it does not
know; ours refuses unknown keys (a typo must not pass silently), so every
NVIDIA key is named here with one of three fates, chosen as an operator
would expect (docs/sharing.md, "NVIDIA compatibility"):

- **mapped**: the same setting under our name (`flags.plugin.deviceIDStrategy`
  -> `deviceIdStrategy`); `migStrategy` and `failOnInitError` are our own
  keys already. Giving both spellings with different values is an error.
- **accepted where the value means what we do, refused otherwise** with the
  field and the fix (`nvidiaDriverRoot: /` yes, another root no; the
  GPUDirect switches off yes, on no; `volume-mounts` no).
- **NVIDIA's `imex:`** (`channelIDs: [0]`, `required`): honoured as NVIDIA's plugin does
  (plugin/model/imex.py), `channelIDs` checked here as NVIDIA checks it.
- **ignored with a warning**: settings of NVIDIA's own machinery that have no
  effect here (`nvidiaCTKPath`, ...), and NVIDIA's `resources`
  renaming, which NVIDIA itself ignores with a warning. The `gfd` section
  belongs to gpu-feature-discovery, which shares the file: logged at info.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import yaml

from ..inputs.yamlpath import line_of

log = logging.getLogger(__name__)

#: NVIDIA's device list strategies (ours are a subset: no `volume-mounts`).
_NVIDIA_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
_LIST = {"enum": list(_NVIDIA_LIST_STRATEGIES)}

#: NVIDIA-only keys of `flags:` (added to the generated `flags` schema).
FLAG_PROPERTIES: dict[str, Any] = {
    "nvidiaDriverRoot": {"type": "string"},
    "nvidiaDevRoot": {"type": "string"},
    "gdrcopyEnabled": {"type": "boolean"},
    "gdsEnabled": {"type": "boolean"},
    "mofedEnabled": {"type": "boolean"},
    "useNodeFeatureAPI": {"type": "boolean"},
    "deviceDiscoveryStrategy": {"enum": ["auto", "nvml", "tegra"]},
    "plugin": {
        "type": "object",
        "additionalProperties": False,
        "description": "NVIDIA's plugin flags (docs/sharing.md, NVIDIA compatibility).",
        "properties": {
            "passDeviceSpecs": {"type": "boolean"},
            "deviceListStrategy": {"oneOf": [_LIST, {"type": "array", "minItems": 1, "items": _LIST}]},
            "deviceIDStrategy": {"enum": ["uuid", "index"]},
            "cdiAnnotationPrefix": {"type": "string", "minLength": 1},
            "nvidiaCTKPath": {"type": "string"},
            "containerDriverRoot": {"type": "string"},
            "sharedDevicesAllocationPolicy": {"enum": ["distributed", "packed"]},
        },
    },
    "gfd": {"type": "object", "description": "gpu-feature-discovery's flags: not ours, ignored."},
}

#: NVIDIA key under `flags.plugin` -> our `flags:` key.
_MAPPED = {"deviceListStrategy": "deviceListStrategy", "deviceIDStrategy": "deviceIdStrategy",
           "cdiAnnotationPrefix": "cdiAnnotationPrefix", "passDeviceSpecs": "passDeviceSpecs"}
_IGNORED = {
    ("plugin", "nvidiaCTKPath"): "our CDI specs need no NVIDIA hook",
    ("plugin", "containerDriverRoot"): "our CDI specs mount no driver files",
    ("useNodeFeatureAPI",): "it is a gpu-feature-discovery setting",
}


class NvidiaFlagError(ValueError):
    """An NVIDIA setting we cannot honour: (field path, message, fix)."""

    def __init__(self, path: list[str], message: str, fix: str):
        super().__init__(message)
        self.path = path
        self.message = message
        self.fix = fix


def _refuse(path: list[str], message: str, fix: str) -> NvidiaFlagError:
    return NvidiaFlagError(["flags", *path], message, fix)


def _check_values(flags: Mapping[str, Any]) -> None:
    for key in ("nvidiaDriverRoot", "nvidiaDevRoot"):
        value = flags.get(key)
        if value not in (None, "", "/"):
            raise _refuse([key], f"{value!r} is not supported: device nodes are read from devRoot",
                          f"remove {key} and set flags.devRoot to where this container sees {value.rstrip('/')}/dev")
    for key in ("gdrcopyEnabled", "gdsEnabled", "mofedEnabled"):
        if flags.get(key):
            raise _refuse([key], "GPUDirect RDMA/Storage and MOFED injection are not supported",
                          f"remove {key} or set it to false")
    if flags.get("deviceDiscoveryStrategy") == "tegra":
        raise _refuse(["deviceDiscoveryStrategy"], "Tegra devices are not supported (GPUs are found through NVML)",
                      "remove the key or set it to auto or nvml")
    plugin = flags.get("plugin") or {}
    if plugin.get("sharedDevicesAllocationPolicy") == "packed":
        raise _refuse(["plugin", "sharedDevicesAllocationPolicy"],
                      "'packed' is not supported: replicas go to the most distinct, least-loaded GPUs first "
                      "(NVIDIA's 'distributed', topology-aware)", "remove the key or set it to distributed")
    listed = plugin.get("deviceListStrategy")
    listed = [listed] if isinstance(listed, str) else list(listed or ())
    if "volume-mounts" in listed:
        raise _refuse(["plugin", "deviceListStrategy"], "the volume-mounts strategy is not supported",
                      "use envvar, cdi-cri or cdi-annotations (docs/sharing.md)")


def translate(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Our `flags:` from a schema-checked `flags:` that may hold NVIDIA's keys.

    Raises `NvidiaFlagError` for an NVIDIA value we cannot honour or a key
    given in both spellings with different values; logs what is ignored.
    """
    _check_values(flags)
    out = {k: v for k, v in flags.items() if k not in FLAG_PROPERTIES}
    plugin = flags.get("plugin") or {}
    for theirs, ours in _MAPPED.items():
        if theirs not in plugin:
            continue
        value = plugin[theirs]
        if ours in out and _norm(out[ours]) != _norm(value):
            raise _refuse(["plugin", theirs], f"{value!r} contradicts flags.{ours}: {out[ours]!r}",
                          f"keep one of flags.plugin.{theirs} and flags.{ours}")
        out[ours] = value
    for path, why in _IGNORED.items():
        section: Any = flags
        for part in path:
            section = section.get(part) if isinstance(section, Mapping) else None
        if section is not None:
            log.warning("NVIDIA setting ignored", extra={"field": "flags." + ".".join(path), "reason": why})
    if flags.get("gfd") is not None:
        log.info("flags.gfd ignored: it configures gpu-feature-discovery, which shares NVIDIA's config file")
    return out


def _norm(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else (value,) if isinstance(value, str) else value


#: What NVIDIA's device plugin accepts in `imex.channelIDs` (`AssertChannelIDsValid`): none, or channel 0.
IMEX_CHANNEL_IDS: tuple[tuple[int, ...], ...] = ((), (0,))


def imex_of(data: Mapping[str, Any]) -> tuple[tuple[int, ...], bool]:
    """NVIDIA's `imex:` section (schema-checked) as (channel IDs, required): the channels every GPU container
    gets (plugin/model/imex.py) and whether the start fails without them."""
    imex = data.get("imex") or {}
    return tuple(imex.get("channelIDs") or ()), bool(imex.get("required"))


def check_top_level(data: Mapping[str, Any]) -> None:
    """NVIDIA's `resources:` (ignored, as NVIDIA does) and `imex:` (NVIDIA's rule: channelIDs [] or [0])."""
    if data.get("resources"):
        log.warning("Customizing the 'resources' field is not supported in the config; ignoring it "
                    "(NVIDIA's plugin ignores it too)")
    ids, _ = imex_of(data)
    if ids not in IMEX_CHANNEL_IDS:
        raise NvidiaFlagError(["imex", "channelIDs"], f"channelIDs must be [] or [0] (NVIDIA's device plugin "
                              f"accepts no other); found {list(ids)}", "set channelIDs: [0], or remove it")


def error_line(root: yaml.Node | None, e: NvidiaFlagError) -> int | None:
    return line_of(root, e.path)
