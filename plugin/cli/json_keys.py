"""One key style for every command's JSON: Kubernetes' camelCase (`numaNodes`, `mustInclude`).

Why at the output and not in the models: the data behind `allocate` and `explain` are Python
dicts (the Topology Manager model's `to_dict`, the CLI's own reports) that the text renderers
and other callers read with snake_case keys. Converting once, where a command prints JSON,
gives scripts one style for every command without renaming the models, and a key a model gains
later comes out camelCase too.

Some maps are keyed by data, not by field names: resource names (`nvidia.com/gpu`), container
names, device IDs, the kubelet's policy option names. Their keys are printed as they are; the
fields that hold such maps are listed in `DATA_MAPS` (and `DATA_MAP_LISTS` for a list of them).
`tests/cli/test_json_keys.py` walks every command's output and fails on any other key that is
not camelCase, so a new data-keyed map has to be named here.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Fields (camelCase, as printed) whose value is a map keyed by data: its keys stay as they are.
DATA_MAPS = frozenset({
    "limits",         # resource name -> count (explain's pod)
    "policyOptions",  # the kubelet's --topology-manager-policy-options names
    "inUse",          # resource name -> device IDs (explain --allocated)
    "partners",       # resource name -> device IDs (allocate/explain --with, pairing partners)
    "pairs",          # explain: container name -> GPU-NIC pairs (allocate's `pairs` is a list)
    "affinities",     # container name -> merged hint
    "numa",           # device ID -> NUMA nodes (explain's allocations)
})
#: Fields whose value is a list of maps keyed by data.
DATA_MAP_LISTS = frozenset({
    "providersHints",  # per hint provider: resource name -> hints
})

_SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
#: What every printed field name looks like (tests/cli/test_json_keys.py checks it).
CAMEL = re.compile(r"[a-z][a-zA-Z0-9]*")


def camel(key: str) -> str:
    """`must_include` -> `mustInclude`; anything that is not a snake_case identifier is left alone."""
    if not _SNAKE.fullmatch(key):
        return key
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def camel_keys(obj: Any, data_keyed: bool = False) -> Any:
    """`obj` with every field name camelCase; the keys of the maps named in DATA_MAPS kept."""
    if isinstance(obj, dict):
        out: dict[Any, Any] = {}
        for key, value in obj.items():
            name = key if data_keyed or not isinstance(key, str) else camel(key)
            if data_keyed:
                out[name] = camel_keys(value)
            elif name in DATA_MAPS and isinstance(value, dict):
                out[name] = camel_keys(value, data_keyed=True)
            elif name in DATA_MAP_LISTS and isinstance(value, list):
                out[name] = [camel_keys(v, data_keyed=True) for v in value]
            else:
                out[name] = camel_keys(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [camel_keys(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """The JSON every command prints: camelCase field names, indented for people reading it too."""
    return json.dumps(camel_keys(obj), indent=2)
