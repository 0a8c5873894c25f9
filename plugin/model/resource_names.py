"""Extended resource names: what the kubelet accepts in `Register`.

Why a module of its own: the GPU resource, the default NIC pool and every
configured NIC pool are checked by the same rule, and the NIC pool parser
must not depend on the resource layer that consumes its pools.
"""

from __future__ import annotations

import re

from ..errors import OptionError

# `domain/name`, not in kubernetes.io (the kubelet's IsExtendedResourceName).
_RESOURCE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def check_resource_name(name: str) -> None:
    """Raise `OptionError` unless the kubelet would accept `name` in Register."""
    if not _RESOURCE_RE.match(name) or "kubernetes.io/" in name or name.startswith("requests."):
        raise OptionError(
            f"resource name {name!r} is not a valid extended resource name "
            "(want <lowercase.domain>/<name>, not under kubernetes.io, e.g. nvidia.com/gpu)"
        )
