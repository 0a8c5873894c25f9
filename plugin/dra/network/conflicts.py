"""A claim's NICs against those of the claims already prepared on this node (issue 35).

`plugin.dra.network.nic_config` checks one claim on its own; what it cannot see is
the other claims. Three things only show once they are put together, and each
used to fail the pod's sandbox start, after the sandbox existed (containerd
before 2.2.6 then leaks the pod's pause container, docs/networking.md):

- a claim whose NICs move into a pod, reserved for several pods: a netdev can be
  in one network namespace only, so the second pod's attach would fail;
- one interface name asked by two claims of the same pod (the kubelet prepares
  a pod's claims of one driver in one call, but a claim may also have been
  prepared earlier, for this pod or, shared, for another: so the other claims
  are looked up in the checkpoint, which holds every claim prepared here);
- an address that another claim prepared by this driver on this node already
  holds. The driver cannot see the switches, so it takes every NIC of the node
  to be on one L2 segment: an address is given once per node. Addresses set up
  outside this driver (the primary CNI, Multus, by hand) are not known here.

Run under the checkpoint's lock (`ClaimPreparer._record`), so two instances
preparing at once cannot both hand out one address. Pure.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

from ..claims.prepared import NicNetwork, PreparedClaim
from .nic_config import NicConfigError


def check_conflicts(claim_ref: str, uid: str, pods: Sequence[str], networks: Mapping[str, NicNetwork],
                    prepared: Mapping[str, PreparedClaim]) -> None:
    """Raise NicConfigError (naming the other claim and the fix) if `networks`, the NICs the claim `uid`
    would attach to `pods`, clash with a claim in `prepared`."""
    if not networks:
        return
    head = f"ResourceClaim {claim_ref}"
    if len(pods) > 1:
        raise NicConfigError(
            f"{head}: its NICs ({', '.join(sorted(networks))}) would move into a pod's network namespace, and the "
            f"claim is reserved for {len(pods)} pods ({', '.join(pods)}); a network interface can be in one pod "
            "only (fix: give each pod its own claim, a ResourceClaimTemplate in the pod spec, or move the NICs to "
            "a claim of their own)")
    ours = {str(ipaddress.ip_interface(a).ip): (device, a) for device, n in networks.items() for a in n.addresses}
    names = {n.pod_name: device for device, n in networks.items()}
    for other in prepared.values():
        if other.uid == uid:
            continue
        same_pod = sorted(set(other.pods) & set(pods))
        for d, n in other.networks:
            where = f"device {d.device} of ResourceClaim {other.namespace}/{other.name}"
            if same_pod and n.pod_name in names:
                raise NicConfigError(
                    f"{head}: device {names[n.pod_name]}: interface name {n.pod_name} is already given to {where}, "
                    f"prepared for the same pod {same_pod[0]} (fix: set interfaceName in one of the two claims' "
                    "NicConfig to a name of its own, e.g. net2)")
            for a in n.addresses:
                held = ours.get(str(ipaddress.ip_interface(a).ip))
                if held is not None:
                    raise NicConfigError(
                        f"{head}: device {held[0]}: address {held[1]} is already held by {where} ({a} on "
                        f"{n.pod_name} in its pod), prepared on this node (fix: give this claim another address; "
                        "the claim holding it keeps it until it is unprepared)")
