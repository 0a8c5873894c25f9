"""Extended resource names: what the kubelet accepts in `Register`.

Why a module of its own: the GPU resource, the default NIC pool and every
configured NIC pool are checked by the same rule, and the NIC pool parser
must not depend on the resource layer that consumes its pools.
"""

from __future__ import annotations

import re

from .errors import OptionError

# `domain/name`, not in kubernetes.io (the kubelet's IsExtendedResourceName): a DNS subdomain of at
# most 253 characters, a name of at most 63. Plain patterns (no look-ahead), because the option
# declarations put them in the JSON schemas too, and helm checks the chart's with Go's RE2.
RESOURCE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
RESOURCE_NAME_MAX = 253 + 1 + 63
#: Names the kubelet keeps for itself (searched anywhere in the name).
RESERVED_PATTERNS = (r"kubernetes\.io/", r"^requests\.")
_RESOURCE_RE = re.compile(RESOURCE_NAME_PATTERN)
_RESERVED_RE = [re.compile(p) for p in RESERVED_PATTERNS]


def check_resource_name(name: str) -> None:
    """Raise `OptionError` unless the kubelet would accept `name` in Register."""
    if not _RESOURCE_RE.fullmatch(name) or any(r.search(name) for r in _RESERVED_RE):
        raise OptionError(
            f"resource name {name!r} is not a valid extended resource name "
            "(want <lowercase.domain>/<name>, not under kubernetes.io, e.g. nvidia.com/gpu)"
        )
