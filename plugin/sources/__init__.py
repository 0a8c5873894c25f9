"""Discovery sources: each builds the node's `NodeTopology` from one kind of input."""

from __future__ import annotations

from allocator.topology import NodeTopology

from .errors import TopologyError
from .simulated import builtin_names, load_simulated

__all__ = ["TopologyError", "builtin_names", "load_topology"]


def load_topology(source: str) -> NodeTopology:
    """Load a simulated node (built-in name, YAML file or `nvidia-smi topo -m` text)."""
    return load_simulated(source)
