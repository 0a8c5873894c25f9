"""The node's NVLink fabric clique as a node label, through a Node Feature Discovery feature file.

Why a feature file (one of two ways; `plugin.runtime.node_labels` patches the
Node instead, for clusters without NFD): labelling the Node ourselves needs
RBAC to patch Nodes from every node (a DaemonSet that can rewrite any node's
labels). Node
Feature Discovery already runs where GPU clusters are managed (the GPU
Operator deploys it) and turns each `key=value` line of a file in its
`features.d` directory into a label of the node it runs on. GPU Feature
Discovery publishes the same fact as `nvidia.com/gpu.clique`; we write that
name with the same value, `<cluster UUID>.<clique ID>`, so selectors written
for GFD keep working on nodes where GFD does not run.

The label is written only when every GPU of the node that reports a fabric
reports the same clique with the state `completed` (GFD's rule too); a node
whose GPUs disagree or whose fabric is not ready has no clique label (the file
is removed, so NFD drops the label). Writes are atomic (a temporary file in
the same directory, then rename), and a file with the same content is not
rewritten.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from allocator.topology import Device

from ..atomic_file import replace_file

log = logging.getLogger(__name__)

__all__ = ["CLIQUE_LABEL", "FabricLabelFile", "clique_of", "render"]

CLIQUE_LABEL = "nvidia.com/gpu.clique"
_HEADER = "# Written by topo-device-plugin (fabricLabelsFile): the NVLink fabric clique of this node's GPUs.\n"


def clique_of(gpus: Iterable[Device]) -> tuple[str | None, str | None]:
    """(clique, None) when the GPUs with a fabric agree; (None, why) otherwise."""
    cliques = sorted({g.fabric.clique for g in gpus if g.fabric is not None and g.fabric.state == "completed"})
    if not cliques:
        return None, "no GPU reports a completed NVLink fabric"
    if len(cliques) > 1:
        return None, f"GPUs report different cliques ({', '.join(cliques)})"
    return cliques[0], None


def render(clique: str | None) -> str | None:
    """The file's content for a clique (None: no file)."""
    return None if clique is None else f"{_HEADER}{CLIQUE_LABEL}={clique}\n"


class FabricLabelFile:
    """Keeps one feature file in step with the GPUs' fabric clique."""

    def __init__(self, path: str):
        self.path = path
        self._why: str | None = None

    def update(self, gpus: Iterable[Device]) -> bool:
        """Write (or remove) the file for these GPUs; True when it changed. Never raises for I/O."""
        gpus = list(gpus)
        clique, why = clique_of(gpus)
        if why != self._why:
            if why is not None and any(g.fabric is not None for g in gpus):
                log.warning("no NVLink clique label: %s", why, extra={"file": self.path})
            elif why is not None:
                log.debug("no NVLink clique label: %s", why, extra={"file": self.path})
            self._why = why
        try:
            return self._apply(render(clique))
        except OSError as e:
            log.warning("cannot write the fabric label file", extra={"file": self.path, "reason": str(e),
                        "fix": "mount the NFD features.d directory writable into the container"})
            return False

    def _apply(self, content: str | None) -> bool:
        try:
            with open(self.path, encoding="utf-8") as f:
                old: str | None = f.read()
        except FileNotFoundError:
            old = None
        if old == content:
            return False
        if content is None:
            os.unlink(self.path)
            log.info("fabric clique label removed", extra={"file": self.path})
            return True
        replace_file(self.path, content, mode=0o644, prefix=".topo-clique-", durable=False)
        log.info("fabric clique label written", extra={"file": self.path, "label": content.splitlines()[-1]})
        return True

