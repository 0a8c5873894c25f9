"""Extended resource names: what the kubelet accepts in `Register`.

Why a module of its own: the GPU resource, the default NIC pool and every
configured NIC pool are checked by the same rule, and the NIC pool parser
must not depend on the resource layer that consumes its pools.
"""

from __future__ import annotations

import re

from ..config.flags import RESERVED_PATTERNS, RESOURCE_NAME_PATTERN
from ..errors import OptionError

# The rule (`<domain>/<name>`, not in kubernetes.io: the kubelet's IsExtendedResourceName) is declared
# with the options (`plugin.config.flags`), which put it in the config file's and the chart's schemas too.
_RESOURCE_RE = re.compile(RESOURCE_NAME_PATTERN)
_RESERVED_RE = [re.compile(p) for p in RESERVED_PATTERNS]


def check_resource_name(name: str) -> None:
    """Raise `OptionError` unless the kubelet would accept `name` in Register."""
    if not _RESOURCE_RE.fullmatch(name) or any(r.search(name) for r in _RESERVED_RE):
        raise OptionError(
            f"resource name {name!r} is not a valid extended resource name "
            "(want <lowercase.domain>/<name>, not under kubernetes.io, e.g. nvidia.com/gpu)"
        )
