"""The daemon's YAML config file (`--config`), validated before anything starts.

Why validate up front with a schema: a typo in a ConfigMap must stop the
pod with a message naming the file, the field and the fix, not surface later
as a resource that silently never appears. Precedence of option values:
flag > TOPO_DP_<OPTION> environment > this file's `flags:` > default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import jsonschema
import yaml

from ..yamlpath import field_path, line_of


class ConfigError(ValueError):
    """An unusable config file; the message names file, field and fix."""


@dataclass(frozen=True)
class Config:
    path: str | None = None
    flags: dict[str, Any] = field(default_factory=dict)
    gpu_health: dict[str, Any] = field(default_factory=dict)
    nic_resource_list: list[Any] = field(default_factory=list)


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(resources.files("plugin.config").joinpath("config-v1.json").read_text())


def parse_config(text: str, path: str) -> Config:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise ConfigError(f"{where}: not valid YAML ({getattr(e, 'problem', e)}); fix the YAML syntax") from None
    if data is None:
        data = {"version": "v1"}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping starting with `version: v1`")
    errors = sorted(jsonschema.Draft202012Validator(schema()).iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        hint = "remove or rename the unknown field" if e.validator == "additionalProperties" else "see docs/configuration.md"
        where = list(e.absolute_path)
        line = line_of(yaml.compose(text), where)
        raise ConfigError(f"{path}:{line}: field {field_path(where)}: {e.message} (fix: {hint})")
    return Config(
        path=path,
        flags=dict(data.get("flags") or {}),
        gpu_health=dict((data.get("gpus") or {}).get("health") or {}),
        nic_resource_list=list((data.get("nics") or {}).get("resourceList") or []),
    )


def load_config(path: str | None) -> Config:
    if not path:
        return Config()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror} (fix: check --config)") from None
    return parse_config(text, path)
