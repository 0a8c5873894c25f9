""""Did you mean ...?" for an unknown key of the config file, at any level the schema knows.

Why: the config schema refuses unknown keys (a typo must not pass
silently), but "'deviceIDStrategy' was unexpected" leaves the reader to find
the right spelling. The known names are right there in the schema: the
declared options under `flags:` (camelCase), NVIDIA's keys
(`nvidia.FLAG_PROPERTIES`, `flags.plugin.*`), `gpus.health.*`,
`sharing.timeSlicing.*` and the rest. A key that belongs one level up or down
(NVIDIA's `nvidiaCTKPath` written under `flags:` instead of `flags.plugin:`)
is pointed to its place.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from ..inputs.yamlpath import field_path


def _resolve(root: Mapping[str, Any], schema: Any) -> Any:
    """Follow a local `$ref` (`#/$defs/name`)."""
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str) and schema["$ref"].startswith("#/"):
        node: Any = root
        for part in schema["$ref"][2:].split("/"):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        schema = node
    return schema


def _object_branch(root: Mapping[str, Any], schema: Any, instance: Any) -> Any:
    """The branch of a `oneOf`/`anyOf` that describes this instance (an object's, an array's)."""
    schema = _resolve(root, schema)
    for key in ("oneOf", "anyOf"):
        for branch in schema.get(key, ()) if isinstance(schema, Mapping) else ():
            branch = _resolve(root, branch)
            if isinstance(instance, Mapping) and "properties" in branch:
                return branch
            if isinstance(instance, list) and "items" in branch:
                return branch
    return schema


def schema_at(root: Mapping[str, Any], data: Any, path: list[Any]) -> Mapping[str, Any]:
    """The (resolved) schema of the value at `path` in `data` (empty when the schema says nothing)."""
    schema: Any = root
    value = data
    for part in path:
        schema = _object_branch(root, schema, value)
        if isinstance(part, int):
            schema = schema.get("items", {}) if isinstance(schema, Mapping) else {}
            value = value[part] if isinstance(value, list) and part < len(value) else None
        else:
            props = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
            schema = props.get(part, {})
            value = value.get(part) if isinstance(value, Mapping) else None
    schema = _object_branch(root, schema, value)
    return schema if isinstance(schema, Mapping) else {}


def _known(schema: Mapping[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return dict(props) if isinstance(props, Mapping) else {}


def _close(key: str, names: list[str]) -> str | None:
    same_case = [n for n in names if n.lower() == key.lower()]
    if same_case:
        return same_case[0]
    match = difflib.get_close_matches(key, names, n=1, cutoff=0.75)
    if match:
        return match[0]
    # Case-blind second try: `deviceidstrategy` is `deviceIdStrategy` more than anything else.
    lowered = {n.lower(): n for n in names}
    match = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.75)
    return lowered[match[0]] if match else None


def suggestion(root: Mapping[str, Any], data: Any, path: list[Any], key: str) -> str | None:
    """The field (full dotted path) an unknown `key` at `path` was probably meant to be, or None."""
    here = schema_at(root, data, path)
    names = _known(here)
    near = _close(key, list(names))
    if near is not None:
        return field_path([*path, near])
    # The right name at the wrong level: one level down (into a known section), then one level up.
    for section, sub in names.items():
        sub_names = _known(_object_branch(root, sub, {}))
        if key in sub_names:
            return field_path([*path, section, key])
    if path:
        parent = path[:-1]
        up = _known(schema_at(root, data, parent))
        near = key if key in up else None
        if near is not None:
            return field_path([*parent, near])
    return None


def unknown_keys_fix(root: Mapping[str, Any], data: Any, path: list[Any]) -> str:
    """The fix of an "additional properties" error at `path`: rename or remove, with what each key may mean."""
    value: Any = data
    for part in path:
        value = value[part] if isinstance(value, (list, Mapping)) else None
    known = _known(schema_at(root, data, path))
    unknown = [str(k) for k in value if k not in known] if isinstance(value, Mapping) else []
    hints = [(k, s) for k in unknown if (s := suggestion(root, data, path, k)) is not None]
    if not hints:
        return "remove or rename the unknown field"
    if len(hints) == 1:
        return f"remove or rename the unknown field; did you mean {hints[0][1]}?"
    return "remove or rename the unknown fields; did you mean " + ", ".join(f"{s} (for {k!r})" for k, s in hints) + "?"
