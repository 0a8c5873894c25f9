"""A simulated node with GPUs in MIG mode for the DRA MIG tests: partitionable GPUs and a GPU with static MIG devices.

Why a helper: the unit tests and the cluster e2e serve the same node, so what the e2e checks
on the real scheduler is what the unit tests check against the driver alone.
"""

from __future__ import annotations

from typing import Any

import yaml

from plugin.sources.simulated import builtin_text

#: GPU index -> profiles of the MIG devices that exist on it (static MIG).
STATIC = {2: ["3g.40gb", "2g.20gb", "1g.10gb"]}
PARTITIONABLE = (0, 1)


def mig_node(base: str = "dgx-h100", partitionable: tuple[int, ...] = PARTITIONABLE,
             static: dict[int, list[str]] | None = None) -> dict[str, Any]:
    """The built-in `base` with GPUs `partitionable` in MIG mode without MIG devices, and `static` GPUs in MIG
    mode with MIG devices of those profiles; GPU minors are the indexes (device nodes /dev/nvidia<i>)."""
    data = yaml.safe_load(builtin_text(base))
    data["metadata"]["name"] = f"{base}-mig"
    for i, gpu in enumerate(data["gpus"]):
        gpu["minor"] = i
        if i in partitionable:
            gpu["mig"] = []
        for profile in (static if static is not None else STATIC).get(i, []):
            gpu.setdefault("mig", []).append({"profile": profile})
    return data


def mig_node_text(**kw: Any) -> str:
    return yaml.safe_dump(mig_node(**kw), sort_keys=False)
