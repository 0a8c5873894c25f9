"""Where the test-support builds keep what they made, and the content keys that name it.

One root for every build of the suite (the project image, the kubelet and control plane, the kind
node image, Go programs), so one variable moves or clears them all: `$TOPO_DP_CACHE_DIR`, else
`$XDG_CACHE_HOME/topo-device-plugin`, else `~/.cache/topo-device-plugin` (scripts/go_build_cached.sh
reads the same). A build names its output by a key of its inputs, so an edit of any input makes a new
entry and an unchanged tree finds the old one at once.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def root() -> Path:
    """The cache's root directory (made if missing)."""
    base = os.environ.get("TOPO_DP_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "topo-device-plugin"
    d = Path(base)
    d.mkdir(parents=True, exist_ok=True)
    return d


def subdir(name: str) -> Path:
    """One build's directory under the root (made if missing)."""
    d = root() / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def content_key(*parts: bytes) -> str:
    """16 hex digits naming an output by its inputs; each part is hashed on its own first, so moving bytes
    from one part to the next changes the key."""
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()[:16]
