"""A NIC's netdev into a pod's network namespace, configured, and back: netlink through pyroute2.

Knows nothing of DRA or NRI: callers give an interface spec and a namespace
path. `attach`/`detach` are the blocking primitives; `NetAttacher` keeps a ledger
of them so that a driver restart at any point loses no interface. See
docs/networking.md for where this sits in the DRA path.
"""

from .attacher import NetAttacher
from .ledger import LedgerError
from .links import SETTLE_S, InterfaceNotFound, attach, detach, exists, max_mtu, rdma_netns_mode
from .spec import AttachError, Attached, DetachError, InterfaceSpec, Outcome, RouteSpec

__all__ = [
    "SETTLE_S", "AttachError", "Attached", "DetachError", "InterfaceNotFound", "InterfaceSpec", "LedgerError",
    "NetAttacher", "Outcome", "RouteSpec", "attach", "detach", "exists", "max_mtu", "rdma_netns_mode",
]
