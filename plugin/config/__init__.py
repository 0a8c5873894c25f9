"""The daemon's YAML config file (`--config`), validated before anything starts.

Why validate up front with a schema: a typo in a ConfigMap must stop the
pod with a message naming the file, the field and the fix, not surface later
as a resource that silently never appears. Precedence of option values:
flag > TOPO_DP_<OPTION> environment > this file's `flags:` > default. The
schema of `flags:` comes from the option declarations (`flags.py`), the rest
from `config-v1.json`. Reading is bounded (`plugin.inputs.yaml_input`): 1 MiB, no
aliases, limited nesting.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

from ..inputs import yaml_input
from ..errors import InputError
from . import nvidia
from .flags import OPTIONS, flags_schema
from .sharing import TimeSlicing, parse_sharing
from .suggest import unknown_keys_fix


class ConfigError(InputError):
    """An unusable config file; the message names file, field and fix."""


@dataclass(frozen=True)
class Config:
    path: str | None = None
    flags: dict[str, Any] = field(default_factory=dict)
    gpu_health: dict[str, Any] = field(default_factory=dict)
    nic_resource_list: list[Any] = field(default_factory=list)
    #: NVIDIA's `sharing.timeSlicing` (None: no GPU is shared).
    time_slicing: TimeSlicing | None = None
    #: NVIDIA's `imex.channelIDs` (`[]` or `[0]`) and `imex.required`: the IMEX channels every GPU container gets.
    imex_channel_ids: tuple[int, ...] = ()
    imex_required: bool = False


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    data = json.loads(resources.files("plugin.config").joinpath("config-v1.json").read_text())
    flags = flags_schema()
    # NVIDIA's own keys, so NVIDIA's config files load unchanged (`nvidia.translate` decides their fate).
    flags["properties"].update(nvidia.FLAG_PROPERTIES)
    data["properties"]["flags"] = flags
    return data


def schema() -> dict[str, Any]:
    """The whole config file's JSON schema (a copy: callers may not change the cached one)."""
    return copy.deepcopy(_schema())


def _error(path: str, problem: yaml_input.YamlProblem) -> ConfigError:
    where = f"{path}:{problem.line}" if problem.line else path
    return ConfigError(f"{where}: {problem.message}" + (f" (fix: {problem.fix})" if problem.fix else ""))


def _option_fix(path: list[Any]) -> str | None:
    """The fix its declaration gives for a bad `flags.<key>` value (an absolute path, a resource name)."""
    if len(path) == 2 and path[0] == "flags":
        return next((o.fix for o in OPTIONS if o.key == path[1]), None)
    return None


def _bucket_fix(data: Any, path: list[Any]) -> str | None:
    """Did-you-mean for a `gpus.health.xidBuckets` value: the nearest of NVIDIA's XID catalog buckets."""
    if len(path) != 4 or path[:3] != ["gpus", "health", "xidBuckets"]:
        return None
    import difflib  # noqa: PLC0415 - only on this error path

    known = _schema()["properties"]["gpus"]["properties"]["health"]["properties"]["xidBuckets"][
        "additionalProperties"]["enum"]
    value = str(data["gpus"]["health"]["xidBuckets"][path[3]]).upper()
    near = difflib.get_close_matches(value, known, n=1)
    return (f"did you mean {near[0]}? " if near else "") + f"a bucket of NVIDIA's XID catalog: {', '.join(known)}"


def parse_config(text: str, path: str) -> Config:
    try:
        data, root = yaml_input.load(text)
        if data is None:
            data = {"version": "v1"}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping starting with `version: v1`")
        bad = yaml_input.first_schema_error(_schema(), data, root)
    except yaml_input.YamlProblem as e:
        raise _error(path, e) from None
    if bad is not None:
        hint = (unknown_keys_fix(_schema(), data, bad.path) if bad.validator == "additionalProperties"
                else _option_fix(bad.path) or _bucket_fix(data, bad.path) or "see docs/configuration.md")
        raise ConfigError(f"{path}:{bad.line}: field {bad.field}: {bad.message} (fix: {hint})")
    try:
        nvidia.check_top_level(data)
        flags = nvidia.translate(data.get("flags") or {})
    except nvidia.NvidiaFlagError as e:
        raise ConfigError(f"{path}:{nvidia.error_line(root, e)}: field {'.'.join(e.path)}: {e.message} "
                          f"(fix: {e.fix})") from None
    imex_ids, imex_required = nvidia.imex_of(data)
    return Config(
        path=path,
        flags=flags,
        gpu_health=dict((data.get("gpus") or {}).get("health") or {}),
        nic_resource_list=list((data.get("nics") or {}).get("resourceList") or []),
        time_slicing=parse_sharing(data.get("sharing"), root, path),
        imex_channel_ids=imex_ids,
        imex_required=imex_required,
    )


def load_config(path: str | None) -> Config:
    if not path:
        return Config()
    try:
        text = yaml_input.read_text(path)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror} (fix: check --config)") from None
    except yaml_input.YamlProblem as e:
        raise _error(path, e) from None
    return parse_config(text, path)
