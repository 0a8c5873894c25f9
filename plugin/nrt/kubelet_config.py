"""The kubelet's Topology Manager policy and scope, read from its config file (`--kubelet-config`).

Why the file and not `configz`: the file is on the node (the chart mounts it
read-only), needs no RBAC on `nodes/proxy` (which would let a daemon reach
every kubelet's API) and no network path to the kubelet. What it cannot see:
the deprecated kubelet flags `--topology-manager-policy`/`--topology-manager-scope`,
which override the file; a cluster that sets them must set the file instead.

Rules:
- the file is read and is a KubeletConfiguration: its `topologyManagerPolicy`
  and `topologyManagerScope`, or the kubelet's defaults (`none`, `container`)
  for a field it leaves out, as the kubelet itself would;
- it cannot be read (missing, unreadable, not YAML, not a mapping): both are
  unknown, the attributes are left out of the object and a WARNING says why
  once; a scheduler then sees no policy (scheduler-plugins treats a node
  without the attribute as `none`: it does not filter it).
"""

from __future__ import annotations

import logging

from ..inputs.yaml_input import YamlProblem, load, read_text
from .build import TopologyManagerSettings

log = logging.getLogger(__name__)

DEFAULT_PATH = "/var/lib/kubelet/config.yaml"
#: The kubelet's defaults (KubeletConfiguration v1beta1 SetDefaults).
DEFAULT_POLICY = "none"
DEFAULT_SCOPE = "container"
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES = ("container", "pod")


def read_topology_manager(path: str) -> TopologyManagerSettings:
    """The settings the file gives (module doc); never raises."""
    try:
        data, _ = load(read_text(path))
    except (OSError, YamlProblem) as e:
        return _unknown(path, f"{type(e).__name__}: {e}")
    if not isinstance(data, dict):
        return _unknown(path, "not a KubeletConfiguration (the file is not a YAML mapping)")
    policy = data.get("topologyManagerPolicy", DEFAULT_POLICY)
    scope = data.get("topologyManagerScope", DEFAULT_SCOPE)
    if policy not in POLICIES or scope not in SCOPES:
        return _unknown(path, f"topologyManagerPolicy {policy!r} / topologyManagerScope {scope!r} is not one the "
                              f"kubelet accepts ({', '.join(POLICIES)} / {', '.join(SCOPES)})")
    return TopologyManagerSettings(policy, scope, path)


def _unknown(path: str, why: str) -> TopologyManagerSettings:
    log.warning("the kubelet's Topology Manager policy is unknown: NodeResourceTopology is published without "
                "topologyManagerPolicy/topologyManagerScope", extra={
                    "file": path, "reason": why,
                    "fix": "mount the kubelet's config file and name it with --kubelet-config "
                           "(chart: nrt.kubeletConfig)"})
    return TopologyManagerSettings(None, None, f"unreadable: {why}")
