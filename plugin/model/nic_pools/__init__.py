"""NIC resource pools, SR-IOV-network-device-plugin compatible: config, selectors, Allocate, pools.

Why this split (as sriov-network-device-plugin splits the same ground into
config, selectors, device and info providers): `config` parses and validates
`nics.resourceList`, `selectors` matches devices, `allocate` builds what a
container gets, `pools` turns entries (or the default pool) into the
`NicPool`s the resource layer serves. See docs/nics.md.
"""

from .allocate import NicAllocateBuilder, go_json
from .config import (
    _BOOL_SELECTORS,
    _ENTRY_KEYS,
    _LIST_SELECTORS,
    CONFIG_PATH,
    DEFAULT_PREFIX,
    LINK_TYPES,
    POLICIES,
    NicPoolError,
    parse_pool_specs,
)
from .pools import NicPool, PoolSummary, default_pool, parse_pools, pool_of, summarize
from .selectors import PoolSpec, Selector, VfRange, env_var_name

__all__ = [
    "CONFIG_PATH",
    "DEFAULT_PREFIX",
    "LINK_TYPES",
    "POLICIES",
    "_BOOL_SELECTORS",
    "_ENTRY_KEYS",
    "_LIST_SELECTORS",
    "NicAllocateBuilder",
    "NicPool",
    "NicPoolError",
    "PoolSpec",
    "PoolSummary",
    "Selector",
    "VfRange",
    "default_pool",
    "env_var_name",
    "go_json",
    "parse_pool_specs",
    "parse_pools",
    "pool_of",
    "summarize",
]
