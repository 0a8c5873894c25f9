"""The claim's network configuration for our NICs (`NicConfig`), and the plan it makes per NIC.

A ResourceClaim may carry, in `spec.devices.config[]`, an opaque entry for our
driver (its DeviceClass may too; the scheduler copies both into
`status.allocation.devices.config`, class entries first):

    - requests: [nic]                         # empty or absent: every request of the claim
      opaque:
        driver: topo.dev
        parameters:
          apiVersion: net.topo-device-plugin.io/v1alpha1
          kind: NicConfig
          interfaceName: net1                 # name in the pod (default: the node's netdev name)
          addresses: [192.0.2.10/24, 2001:db8::10/64]
          routes: [{destination: 198.51.100.0/24, gateway: 192.0.2.1}]
          mtu: 9000

Why it is checked in NodePrepareResources and not when the sandbox starts:
a refused prepare keeps the pod from starting with the reason on the pod's
events (and on the claim, see `plugin.dra.network.pod_network`), while nothing has
been moved yet; a failure in RunPodSandbox would come after the CNI has set
the pod's network up, with the reason only in the runtime's log.

`nic_plan` is pure (the node's netdevs are reached through `NicProbe`, the
one question asked of the host): the allocated NICs with a netdev, each with
the `NicNetwork` its pod gets, or a `NicConfigError` naming the field and the
fix. Which entry wins: for each request the last entry that applies (claim
entries come after class entries, so the claim's overrides the class's);
fields are not merged across entries.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from allocator.topology import Device, DeviceKind

from ..claims.claim import Claim
from ..claims.gpu_config import KIND as GPU_KIND
from ..claims.gpu_config import MIG_KIND
from ..claims.prepared import NicNetwork, Route

API_VERSION = "net.topo-device-plugin.io/v1alpha1"
KIND = "NicConfig"
#: The other kinds of configuration our driver reads (each by its own parser: plugin/dra/claims/gpu_config.py).
OTHER_KINDS = (GPU_KIND, MIG_KIND)
FIELDS = ("apiVersion", "kind", "interfaceName", "addresses", "routes", "mtu")
ROUTE_FIELDS = ("destination", "gateway")
#: networkData.ips holds at most 16 entries (resource.k8s.io/v1 NetworkDeviceData).
MAX_ADDRESSES = 16
#: The smallest MTU IPv4 allows (RFC 791); with an IPv6 address the interface needs 1280 (RFC 8200).
MIN_MTU_V4, MIN_MTU_V6 = 68, 1280
#: A Linux interface name: up to IFNAMSIZ-1 = 15 bytes, no '/', ':' or white space, not "." or "..".
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,14}$")

#: The host's view of a netdev: its maximum MTU, or None when no interface of that name is in the
#: node's network namespace (`plugin.netattach.max_mtu` / `exists` in the daemon).
NicProbe = Callable[[str], "int | None"]


def is_ifname(name: str) -> bool:
    """Whether `name` is a Linux interface name (the rule `interfaceName` and `--pod-primary-interface` follow)."""
    return bool(_IFNAME_RE.match(name))


class NicConfigError(Exception):
    """A NicConfig the driver cannot apply: the message names the claim, the field and the fix."""


@dataclass(frozen=True)
class PlanLimits:
    """What the node adds to the rules: names the pod already has, and whether attaching can happen at all."""

    #: Interface names the pod's network namespace already holds (`lo`, the primary CNI's `eth0`).
    taken_names: tuple[str, ...] = ("lo", "eth0")
    #: None: NICs can be attached; else why not (a NicConfig is then refused) ...
    unavailable: str | None = None
    #: ... and how to make it possible.
    unavailable_fix: str = "turn NIC attachment on"


@dataclass(frozen=True)
class _Entry:
    where: str                 # "spec.devices.config[2]" or "config[0] of the DeviceClass"
    requests: tuple[str, ...]  # empty: every request
    params: Any                # as the claim gives it: `_check_entry` refuses anything but a mapping


def _err(claim: str, where: str, problem: str, fix: str) -> NicConfigError:
    return NicConfigError(f"ResourceClaim {claim}: {where}: {problem} (fix: {fix})")


def config_entries(claim: Claim, driver: str) -> list[_Entry]:
    """Our driver's opaque entries that are not another kind of ours (each checked by its own parser), from the
    one reader of opaque config (`plugin.dra.claims.opaque`), each named by where its author wrote it (the
    claim's spec entries keep their index there)."""
    out: list[_Entry] = []
    for c in claim.opaque(driver):
        if c.kind in OTHER_KINDS:
            continue  # another kind of our driver's configuration, checked by its own parser
        out.append(_Entry(f"{c.authored_where}.opaque.parameters", c.requests, c.parameters))
    return out


def _check_entry(claim: str, e: _Entry) -> None:
    p = e.params
    fix_head = f"start the parameters with apiVersion: {API_VERSION} and kind: {KIND}"
    if not isinstance(p, Mapping):
        raise _err(claim, e.where, f"want a mapping, not {type(p).__name__}", fix_head)
    if p.get("apiVersion") != API_VERSION:
        raise _err(claim, f"{e.where}.apiVersion", f"{p.get('apiVersion')!r} is not {API_VERSION}", fix_head)
    if p.get("kind") != KIND:
        raise _err(claim, f"{e.where}.kind", f"{p.get('kind')!r} is not a kind this driver knows "
                   f"({KIND} or {', '.join(OTHER_KINDS)})", fix_head)
    unknown = sorted(set(p) - set(FIELDS))
    if unknown:
        raise _err(claim, f"{e.where}.{unknown[0]}", "unknown field",
                   f"remove or rename it; {KIND} has {', '.join(FIELDS[2:])}")
    name = p.get("interfaceName")
    if name is not None and (not isinstance(name, str) or not _IFNAME_RE.match(name)):
        raise _err(claim, f"{e.where}.interfaceName", f"{name!r} is not a Linux interface name",
                   "1 to 15 of A-Z a-z 0-9 _ . -, not starting with '.'")
    addrs = p.get("addresses")
    if addrs is not None:
        if not isinstance(addrs, list):
            raise _err(claim, f"{e.where}.addresses", "want a list of addresses in CIDR form",
                       "e.g. addresses: [192.0.2.10/24]")
        if len(addrs) > MAX_ADDRESSES:
            raise _err(claim, f"{e.where}.addresses", f"{len(addrs)} addresses, at most {MAX_ADDRESSES}",
                       f"give at most {MAX_ADDRESSES} (the claim status holds no more)")
        for j, a in enumerate(addrs):
            _address(claim, f"{e.where}.addresses[{j}]", a)
        dup = sorted({str(a) for a in addrs if addrs.count(a) > 1})
        if dup:
            raise _err(claim, f"{e.where}.addresses", f"{dup[0]} is listed twice", "list each address once")
    routes = p.get("routes")
    if routes is not None:
        if not isinstance(routes, list):
            raise _err(claim, f"{e.where}.routes", "want a list of {destination, gateway}",
                       "e.g. routes: [{destination: 198.51.100.0/24, gateway: 192.0.2.1}]")
        for j, r in enumerate(routes):
            _route(claim, f"{e.where}.routes[{j}]", r)
    mtu = p.get("mtu")
    if mtu is not None:
        if not isinstance(mtu, int) or isinstance(mtu, bool) or mtu < MIN_MTU_V4:
            raise _err(claim, f"{e.where}.mtu", f"{mtu!r} is not an MTU", f"give a whole number of at least {MIN_MTU_V4}")
        if mtu < MIN_MTU_V6 and any(ipaddress.ip_interface(a).version == 6 for a in addrs or ()):
            raise _err(claim, f"{e.where}.mtu", f"{mtu} is below {MIN_MTU_V6}, the least IPv6 allows",
                       f"raise it to {MIN_MTU_V6} or more, or leave out the IPv6 addresses")


def _address(claim: str, where: str, a: Any) -> None:
    fix = "an address with its prefix length, e.g. 192.0.2.10/24 or 2001:db8::10/64"
    if not isinstance(a, str) or "/" not in a:
        raise _err(claim, where, f"{a!r} is not an address in CIDR form", fix)
    try:
        iface = ipaddress.ip_interface(a)
    except ValueError as e:
        raise _err(claim, where, f"{a!r} is not an address in CIDR form ({e})", fix) from None
    # The claim status (networkData.ips) takes canonical forms only; the API server would refuse the write.
    if iface.version == 6 and iface.ip.ipv4_mapped is not None:
        raise _err(claim, where, f"{a!r} is an IPv4-mapped IPv6 address",
                   f"give the IPv4 address, e.g. {iface.ip.ipv4_mapped}/{max(iface.network.prefixlen - 96, 0)}")
    if str(iface) != a:
        raise _err(claim, where, f"{a!r} is not in canonical form", f"write it as {iface} (lower case, shortest form)")


def _route(claim: str, where: str, r: Any) -> None:
    if not isinstance(r, Mapping):
        raise _err(claim, where, "want a mapping {destination, gateway}",
                   "e.g. {destination: 198.51.100.0/24, gateway: 192.0.2.1}")
    unknown = sorted(set(r) - set(ROUTE_FIELDS))
    if unknown:
        raise _err(claim, f"{where}.{unknown[0]}", "unknown field", "a route has destination and gateway")
    dest = r.get("destination")
    try:
        net = ipaddress.ip_network(dest) if isinstance(dest, str) and "/" in dest else None
    except ValueError as e:
        if isinstance(dest, str):
            try:
                loose = ipaddress.ip_network(dest, strict=False)
            except ValueError:
                loose = None
            if loose is not None:
                raise _err(claim, f"{where}.destination", f"{dest!r} has host bits set",
                           f"write the network, {loose}") from None
        raise _err(claim, f"{where}.destination", f"{dest!r} is not a network ({e})",
                   "a network in CIDR form, e.g. 198.51.100.0/24 or 0.0.0.0/0") from None
    if net is None:
        raise _err(claim, f"{where}.destination", f"{dest!r} is not a network in CIDR form",
                   "a network in CIDR form, e.g. 198.51.100.0/24 or 0.0.0.0/0")
    gw = r.get("gateway")
    if gw is not None:
        try:
            gateway = ipaddress.ip_address(gw) if isinstance(gw, str) else None
        except ValueError:
            gateway = None
        if gateway is None:
            raise _err(claim, f"{where}.gateway", f"{gw!r} is not an IP address", "e.g. gateway: 192.0.2.1")
        if gateway.version != net.version:
            raise _err(claim, f"{where}.gateway", f"IPv{gateway.version} gateway for an IPv{net.version} destination",
                       "give a gateway of the destination's family")


def nic_plan(claim_ref: str, claim: Claim, driver: str,
             allocated: Sequence[tuple[str, Device, Sequence[str]]], probe: NicProbe,
             limits: PlanLimits) -> dict[str, NicNetwork]:
    """The NICs to attach (slice device name -> NicNetwork), or `NicConfigError`.

    `allocated`: the claim's devices of our driver (slice device name, Device, request names), as the
    preparer found them; `claim`: the claim as parsed once (`plugin.dra.claims.claim`); `claim_ref` names it in
    messages (`namespace/name`).
    """
    entries = config_entries(claim, driver)
    for e in entries:
        _check_entry(claim_ref, e)
    if entries and limits.unavailable is not None:
        raise _err(claim_ref, entries[0].where, f"the NIC configuration cannot be applied: {limits.unavailable}",
                   f"{limits.unavailable_fix}, or remove the NicConfig")
    per_request: dict[str, list[str]] = {}
    for name, dev, requests in allocated:
        for r in requests:
            per_request.setdefault(r, []).append(name)
    nics = {name: (dev, requests) for name, dev, requests in allocated if dev.kind is DeviceKind.NIC}
    # Which entry applies to which request (the last one that names it, or names none).
    chosen: dict[str, _Entry] = {}
    for e in entries:
        for r in e.requests:
            base = r.split("/", 1)[0]
            if base not in per_request:
                raise _err(claim_ref, e.where.removesuffix(".opaque.parameters") + ".requests",
                           f"request {r!r} has no device of {driver} in this claim",
                           f"name a request of the claim ({', '.join(sorted(per_request)) or 'none'})")
            if not any(n in nics for n in per_request[base]):
                raise _err(claim_ref, e.where.removesuffix(".opaque.parameters") + ".requests",
                           f"request {base!r} holds no NIC", "apply the NicConfig to the NIC requests only")
        for r in (e.requests and [x.split("/", 1)[0] for x in e.requests]) or per_request:
            chosen[r] = e
    plan: dict[str, NicNetwork] = {}
    by_pod_name: dict[str, str] = {}
    by_ip: dict[str, str] = {}
    for name, (dev, requests) in nics.items():
        entry = next((chosen[r] for r in requests if r in chosen), None)
        p: Mapping[str, Any] = entry.params if entry else {}
        where = entry.where if entry else "the NIC"
        netdev = dev.attributes.get("netdev") or ""
        if not netdev:
            if entry is not None:
                raise _err(claim_ref, where, f"device {name} ({dev.name}) has no network interface to configure "
                           "(no netdev: bound to vfio-pci, or an InfiniBand-only function?)",
                           "apply the NicConfig only to requests of NICs with a netdev")
            continue  # nothing to attach: the device nodes are all the pod gets (as before)
        if limits.unavailable is not None:
            continue  # attachment is off: NICs without a NicConfig stay in the node's namespace
        big = [r for r in requests if len(per_request.get(r, ())) > 1]
        for key in ("interfaceName", "addresses", "routes"):
            if p.get(key) and big:
                raise _err(claim_ref, f"{where}.{key}",
                           f"request {big[0]!r} holds {len(per_request[big[0]])} devices, and one {key} cannot "
                           "serve several interfaces", f"give each NIC a request of its own (count: 1) with its "
                           f"own NicConfig, or leave {key} out")
        max_mtu = probe(netdev)
        if max_mtu is None:
            raise _err(claim_ref, where if entry else f"device {name}",
                       f"network interface {netdev} of device {name} ({dev.name}) is not in the node's network "
                       "namespace", "check the NIC on the node (ip link show " + netdev + "); it may have been "
                       "renamed or moved")
        mtu = p.get("mtu")
        if mtu is not None and mtu > max_mtu:
            raise _err(claim_ref, f"{where}.mtu", f"{mtu} is above {netdev}'s maximum MTU {max_mtu} "
                       f"(device {name})", f"give at most {max_mtu}")
        pod_name = p.get("interfaceName") or netdev
        if pod_name in limits.taken_names:
            field = f"{where}.interfaceName" if p.get("interfaceName") else f"device {name}"
            raise _err(claim_ref, field, f"interface name {pod_name} is taken in the pod "
                       f"({'the loopback' if pod_name == 'lo' else 'the primary network interface'})",
                       "set interfaceName to another name, e.g. net1")
        if pod_name in by_pod_name:
            raise _err(claim_ref, f"{where}.interfaceName" if p.get("interfaceName") else f"device {name}",
                       f"interface name {pod_name} is given to devices {by_pod_name[pod_name]} and {name}",
                       "give each NIC its own interfaceName")
        by_pod_name[pod_name] = name
        addresses = tuple(p.get("addresses") or ())
        _gateways_reached(claim_ref, where, name, addresses, p.get("routes") or ())
        for a in addresses:
            ip = str(ipaddress.ip_interface(a).ip)
            if ip in by_ip:
                raise _err(claim_ref, f"{where}.addresses", f"address {ip} is given to devices {by_ip[ip]} and {name}",
                           "give each interface addresses of its own")
            by_ip[ip] = name
        rdma = (dev.attributes.get("rdma_devices") or "").split(",")[0] or None
        plan[name] = NicNetwork(
            host_name=netdev, pod_name=pod_name, addresses=addresses,
            routes=tuple(Route(r["destination"], r.get("gateway")) for r in p.get("routes") or ()),
            mtu=mtu, rdma_device=rdma)
    return plan


def _gateways_reached(claim: str, where: str, device: str, addresses: Sequence[str],
                      routes: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a route whose gateway lies outside the networks of the interface's own addresses.

    The kernel takes a route through a gateway only when that gateway is reachable on the interface
    (`RTNETLINK answers: Network is unreachable` otherwise); the routes are added when the pod's sandbox
    starts, so such a route would fail the sandbox after it exists (and containerd before 2.2.6 leaks its
    pause container then, docs/networking.md). An IPv6 link-local gateway (fe80::/10) is reached through
    the interface's own link-local address, which the kernel gives it when it comes up.
    """
    nets = [ipaddress.ip_interface(a).network for a in addresses]
    for j, r in enumerate(routes):
        gw = r.get("gateway")
        if gw is None:
            continue
        gateway = ipaddress.ip_address(gw)
        if gateway.version == 6 and gateway.is_link_local:
            continue
        if any(gateway.version == n.version and gateway in n for n in nets):
            continue
        own = [str(n) for n in nets if n.version == gateway.version]
        raise _err(claim, f"{where}.routes[{j}].gateway",
                   f"gateway {gateway} of the route to {r.get('destination')} is not in the network of any address "
                   f"of device {device}'s interface ({', '.join(own) or f'it has no IPv{gateway.version} address'}), "
                   "so the kernel would refuse the route when the pod starts",
                   "give the interface an address in the gateway's network, or name a gateway inside "
                   f"{' or '.join(own) if own else 'the network of one of its addresses'}")
