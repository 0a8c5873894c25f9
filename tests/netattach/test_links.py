"""attach/detach on real network namespaces, with veth pairs standing in for NICs.

What a user would notice: the interface shows up in the pod under its new name
with exactly the addresses, routes and MTU asked for, and comes back to the host
as it was; a refused attachment leaves the host as it was; a pod killed with the
interface inside does not crash the driver.
"""

from __future__ import annotations

import pytest
from netattach_testlib import ip_json, link, link_by_mac, run

from plugin.netattach import (
    AttachError,
    DetachError,
    InterfaceNotFound,
    InterfaceSpec,
    Outcome,
    RouteSpec,
    attach,
    detach,
    exists,
    max_mtu,
)


def addresses(netns: str, name: str) -> set[str]:
    return {f"{a['local']}/{a['prefixlen']}" for x in ip_json(netns, "addr", "show", "dev", name)
            for a in x["addr_info"] if a.get("scope") == "global"}


def routes(netns: str, family: str) -> set[tuple[str, str | None, str]]:
    return {(r["dst"], r.get("gateway"), r["dev"]) for r in ip_json(netns, family, "route", "show")}


def test_attach_moves_renames_and_configures_the_interface_in_the_pod(net):
    ns = net.netns()
    nic = net.veth()
    spec = InterfaceSpec(nic.name, "net1", addresses=("10.77.0.2/24", "fd00:77::2/64"),
                         routes=(RouteSpec("10.78.0.0/16", "10.77.0.1"), RouteSpec("0.0.0.0/0", "10.77.0.1"),
                                 RouteSpec("fd00:78::/48", "fd00:77::1")), mtu=9000)
    att = attach(spec, ns)

    assert link(None, nic.name) is None  # gone from the host
    inside = link(ns, "net1")
    assert inside["address"] == nic.mac and inside["mtu"] == 9000 and "UP" in inside["flags"]
    assert addresses(ns, "net1") == {"10.77.0.2/24", "fd00:77::2/64"}
    v4 = routes(ns, "-4")
    assert {("10.78.0.0/16", "10.77.0.1", "net1"), ("default", "10.77.0.1", "net1")} <= v4
    assert ("fd00:78::/48", "fd00:77::1", "net1") in routes(ns, "-6")
    assert att.hw_address == nic.mac and att.original_mtu == 1500 and att.was_up is False
    assert att.netns == ns and att.rdma_moved is False


@pytest.mark.parametrize("was_up", [False, True])
def test_detach_restores_name_mtu_and_state_and_drops_what_we_configured(net, was_up):
    ns = net.netns()
    nic = net.veth(mtu=1400, up=was_up)
    att = attach(InterfaceSpec(nic.name, "eth7", addresses=("192.168.77.5/24",), mtu=9000), ns)
    assert link(ns, "eth7") is not None

    assert detach(att) is Outcome.RESTORED
    home = link(None, nic.name)
    assert home["address"] == nic.mac and home["mtu"] == 1400
    assert ("UP" in home["flags"]) is was_up
    assert addresses(None, nic.name) == set()
    assert link(ns, "eth7") is None
    # idempotent: a second detach finds it home and does nothing
    assert detach(att) is Outcome.ALREADY_HOME


def test_a_name_taken_in_the_pod_is_refused_and_nothing_moves(net):
    ns = net.netns()
    net.occupy(ns, "net1")
    nic = net.veth()
    with pytest.raises(AttachError) as e:
        attach(InterfaceSpec(nic.name, "net1"), ns)
    assert e.value.step == "check" and e.value.ifname == nic.name
    assert "net1 is taken in the pod network namespace" in str(e.value)
    assert link(None, nic.name)["address"] == nic.mac


def test_the_host_name_may_exist_in_the_pod_when_the_pod_name_differs(net):
    """A NIC called like an interface the pod already has arrives under its pod name: no clash on the move."""
    ns = net.netns()
    nic = net.veth()
    net.occupy(ns, nic.name)
    attach(InterfaceSpec(nic.name, "net2"), ns)
    assert link(ns, "net2")["address"] == nic.mac
    assert link(ns, nic.name)["link_type"] == "ether" and link(ns, nic.name)["address"] != nic.mac


def test_an_mtu_above_the_devices_maximum_is_refused_before_anything_moves(net):
    ns = net.netns()
    nic = net.veth()
    kernel_max = link(None, nic.name)["max_mtu"]
    assert max_mtu(nic.name) == kernel_max
    with pytest.raises(AttachError) as e:
        attach(InterfaceSpec(nic.name, "net1", mtu=kernel_max + 1), ns)
    assert e.value.step == "check"
    assert f"MTU {kernel_max + 1} is above the device's maximum {kernel_max}" in str(e.value)
    assert link(None, nic.name) is not None and link(ns, "net1") is None


def test_a_missing_interface_or_namespace_is_named(net):
    ns = net.netns()
    missing = net.name("x")
    assert exists(missing) is False
    with pytest.raises(InterfaceNotFound) as e:
        attach(InterfaceSpec(missing, "net1"), ns)
    assert f"attaching interface {missing}" in str(e.value) and "no such interface" in str(e.value)
    with pytest.raises(InterfaceNotFound):
        max_mtu(missing)
    nic = net.veth()
    assert exists(nic.name) is True
    with pytest.raises(AttachError) as e:
        attach(InterfaceSpec(nic.name, "net1"), str(net.tmp / "no-such-netns"))
    assert "cannot open the pod network namespace" in str(e.value) and "no-such-netns" in str(e.value)
    assert not (net.tmp / "no-such-netns").exists()  # never created on the way


def test_a_failing_step_undoes_the_move_and_names_the_step(net):
    """A gateway on no subnet of the interface: the kernel refuses the route after the move, MTU and
    addresses were done; the interface must be back in the host as it was."""
    ns = net.netns()
    nic = net.veth(mtu=1450)
    spec = InterfaceSpec(nic.name, "net1", addresses=("10.79.0.2/24",), mtu=9000,
                         routes=(RouteSpec("10.80.0.0/16", "172.31.99.1"),))
    with pytest.raises(AttachError) as e:
        attach(spec, ns)
    assert e.value.step == "routes" and e.value.ifname == nic.name
    assert "unreachable" in e.value.why.lower()
    home = link(None, nic.name)
    assert home["address"] == nic.mac and home["mtu"] == 1450 and "UP" not in home["flags"]
    assert link(ns, "net1") is None


def test_a_veth_whose_namespace_died_is_reported_lost_without_an_error(net):
    ns = net.netns()
    nic = net.veth()
    att = attach(InterfaceSpec(nic.name, "net1", addresses=("10.81.0.2/24",)), ns)
    net.kill(ns)  # the pod is gone: the veth dies with its namespace (and takes its peer along)
    assert detach(att, settle_s=0.2) is Outcome.LOST
    assert link_by_mac(None, nic.mac) is None and link(None, nic.peer) is None


def test_a_device_back_in_the_host_under_another_name_is_found_by_address_and_renamed(net):
    """A physical NIC whose namespace dies comes back under a name the kernel picks. Played here by a
    clash on the way home: the NIC waits in the host under a temporary name until the next detach."""
    ns = net.netns()
    nic = net.veth(mtu=1300, up=True)
    att = attach(InterfaceSpec(nic.name, "net1", mtu=9000), ns)
    # someone took the name in the meantime: the move home works, the rename cannot
    net.occupy(None, nic.name)
    with pytest.raises(DetachError) as e:
        detach(att)
    assert e.value.step == "rename" and f"is called {nic.name} now" in str(e.value)
    back = link_by_mac(None, nic.mac)
    assert back is not None and back["ifname"] != nic.name and link(ns, "net1") is None
    run("ip", "link", "del", nic.name)
    assert detach(att) is Outcome.RECOVERED
    home = link(None, nic.name)
    assert home["address"] == nic.mac and home["mtu"] == 1300 and "UP" in home["flags"]
    assert detach(att) is Outcome.ALREADY_HOME


def test_a_namespace_path_reused_by_another_namespace_is_not_taken_for_the_pods(net):
    ns = net.netns()
    nic = net.veth()
    att = attach(InterfaceSpec(nic.name, "net1"), ns)
    net.kill(ns)
    net.namespaces.append(ns)
    open(ns, "w").close()
    run("unshare", f"--net={ns}", "true")  # a new namespace at the same path
    assert detach(att, settle_s=0.2) is Outcome.LOST


@pytest.mark.parametrize("bad, why", [
    (dict(addresses=("10.0.0.300/24",)), "not an address"),
    (dict(addresses=("10.0.0.3",)), "no prefix length"),
    (dict(routes=(RouteSpec("10.1.0.0/16", "fd00::1"),)), "another IP version"),
    (dict(pod_name="a-name-that-is-too-long"), "not a valid interface name"),
    (dict(mtu=20), "below 68"),
])
def test_a_malformed_spec_is_refused_naming_the_field(net, bad, why):
    ns = net.netns()
    nic = net.veth()
    with pytest.raises(AttachError) as e:
        attach(InterfaceSpec(nic.name, **{"pod_name": "net1", **bad}), ns)
    assert why in str(e.value) and e.value.step == "check"
    assert link(None, nic.name) is not None


def test_an_address_the_pod_changed_is_put_back_with_the_interface(net):
    ns = net.netns()
    nic = net.veth()
    att = attach(InterfaceSpec(nic.name, "net1"), ns)
    run("nsenter", f"--net={ns}", "ip", "link", "set", "net1", "address", "02:00:00:00:ab:cd")
    assert detach(att) is Outcome.RESTORED
    assert link(None, nic.name)["address"] == nic.mac


async def test_the_blocking_calls_also_work_from_a_coroutine(net):
    """pyroute2 runs its own event loop; called where one is running (the DRA driver validating a claim's
    MTU in NodePrepareResources), each call must still answer, not fail on 'loop already running'."""
    ns = net.netns()
    nic = net.veth()
    assert exists(nic.name) is True and max_mtu(nic.name) == link(None, nic.name)["max_mtu"]
    att = attach(InterfaceSpec(nic.name, "net1"), ns)
    assert link(ns, "net1")["address"] == nic.mac
    assert detach(att) is Outcome.RESTORED
