"""Point at the place in a YAML file that a validation error is about.

Why: a bad ConfigMap or node file must be fixed by a person reading one
message, so errors say `file:line: field a.b[2]: ...`, mapping the JSON-schema
error path back to the YAML node it came from.
"""

from __future__ import annotations

from typing import Any

import yaml


def line_of(root: yaml.Node | None, path: list[Any]) -> int | None:
    """1-based line of the YAML node at `path` (mapping keys / sequence indexes), best effort."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value == part:
                    nxt = v
                    line = k.start_mark.line + 1
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
        if node is None:
            break
    return line


def field_path(path: list[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"
