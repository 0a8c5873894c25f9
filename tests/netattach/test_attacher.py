"""NetAttacher: a pod's NICs in and out, recorded so that a restart at any point loses nothing.

A crash is played by `on_record` raising right after the ledger write it names:
the instance is dropped as a killed process would be, and a new one on the same
ledger must finish or undo the work, with every interface ending up in exactly
one place (a second move of an interface already moved would fail, so reaching
the expected end state also shows nothing moved twice).
"""

from __future__ import annotations

import asyncio
import json

import pytest
from netattach_testlib import link, link_by_mac, run

from plugin.errors import InputError
from plugin.netattach import AttachError, InterfaceSpec, LedgerError, NetAttacher, Outcome, RouteSpec
from plugin.netattach.links import STEPS

POD = "pod-a"


class Crash(Exception):
    """The process dies here."""


def crash_at(label: str):
    def hook(seen: str) -> None:
        if seen == label:
            raise Crash(label)
    return hook


def two_nics(net):
    a, b = net.veth(mtu=1400), net.veth(up=True)
    specs = [InterfaceSpec(a.name, "net1", addresses=("10.90.0.2/24",),
                           routes=(RouteSpec("10.91.0.0/16", "10.90.0.1"),), mtu=9000),
             InterfaceSpec(b.name, "net2", addresses=("10.92.0.2/24",))]
    return (a, b), specs


def assert_in_pod(ns, nics, specs):
    for nic, spec in zip(nics, specs):
        inside = link(ns, spec.pod_name)
        assert inside is not None and inside["address"] == nic.mac and "UP" in inside["flags"]
        assert inside["mtu"] == (spec.mtu or 1500)
        assert link_by_mac(None, nic.mac) is None


def assert_home(ns, nics, mtus_up):
    for nic, (mtu, up) in zip(nics, mtus_up):
        home = link(None, nic.name)
        assert home is not None and home["address"] == nic.mac, nic.name
        assert home["mtu"] == mtu and ("UP" in home["flags"]) is up
    assert [x["ifname"] for x in json.loads(run("nsenter", f"--net={ns}", "ip", "-j", "link", "show"))] == ["lo"]


ORIGINAL = [(1400, False), (1500, True)]


def attach_labels() -> list[str]:
    """Every record of a two-interface attachment, in order: {0}/{1} stand for the interfaces."""
    per = lambda i: [f"{{{i}}}/prepared"] + [f"{{{i}}}/{s}" for s in STEPS] + [f"{{{i}}}/done"]  # noqa: E731 (a one-line table of names)
    return [f"{POD}/attaching", *per(0), *per(1), f"{POD}/attached"]


DETACH_LABELS = [f"{POD}/detaching", "{1}/detached", "{0}/detached", f"{POD}/removed"]


async def test_every_ledger_write_of_an_attach_and_a_detach_is_one_the_crash_tests_cover(net, tmp_path):
    ns = net.netns()
    nics, specs = two_nics(net)
    seen: list[str] = []
    att = NetAttacher(str(tmp_path / "ledger.json"), on_record=seen.append)
    await att.attach_pod(POD, ns, specs)
    await att.detach_pod(POD)
    names = {n.name: f"{{{i}}}" for i, n in enumerate(nics)}
    generic = list(seen)
    for real, tmpl in names.items():
        generic = [g.replace(f"{POD}/{real}/", f"{tmpl}/") for g in generic]
    assert generic == attach_labels() + DETACH_LABELS
    assert att.ledger.writes == len(seen)


def label_for(template: str, nics) -> str:
    return template.format(*(f"{POD}/{n.name}" for n in nics))


@pytest.mark.parametrize("then", ["attach again", "still running", "pod gone"])
@pytest.mark.parametrize("where", attach_labels())
async def test_a_crash_at_any_point_of_an_attach_is_finished_or_undone_by_the_next_instance(net, tmp_path,
                                                                                           where, then):
    ns = net.netns()
    nics, specs = two_nics(net)
    ledger = str(tmp_path / "ledger.json")
    with pytest.raises(Crash):
        await NetAttacher(ledger, on_record=crash_at(label_for(where, nics))).attach_pod(POD, ns, specs)

    restarted = NetAttacher(ledger)
    if then == "attach again":
        got = await restarted.attach_pod(POD, ns, specs)
        assert [a.spec for a in got] == specs and [a.hw_address for a in got] == [n.mac for n in nics]
        assert [(a.original_mtu, a.was_up) for a in got] == ORIGINAL
        assert_in_pod(ns, nics, specs)
        assert restarted.attached(POD) == got
        # and it comes back as it was
        assert await restarted.detach_pod(POD) == {n.name: Outcome.RESTORED for n in nics}
    elif then == "still running":  # the runtime went on without us: the next reconcile finishes the job
        await restarted.reconcile({POD: ns})
        assert_in_pod(ns, nics, specs)
        assert [a.spec for a in restarted.attached(POD)] == specs
        await restarted.reconcile({})
    else:
        await restarted.reconcile({})
    assert_home(ns, nics, ORIGINAL)
    assert NetAttacher(ledger).attached(POD) == []
    assert json.loads(open(ledger).read())["pods"] == {}


@pytest.mark.parametrize("then", ["detach again", "reconcile"])
@pytest.mark.parametrize("where", DETACH_LABELS)
async def test_a_crash_at_any_point_of_a_detach_is_finished_by_the_next_instance(net, tmp_path, where, then):
    ns = net.netns()
    nics, specs = two_nics(net)
    ledger = str(tmp_path / "ledger.json")
    first = NetAttacher(ledger)
    await first.attach_pod(POD, ns, specs)
    first.on_record = crash_at(label_for(where, nics))
    with pytest.raises(Crash):
        await first.detach_pod(POD)

    restarted = NetAttacher(ledger)
    if then == "detach again":
        await restarted.detach_pod(POD)
    else:
        await restarted.reconcile({POD: ns})  # still running, but its detach had begun: finished
    assert_home(ns, nics, ORIGINAL)
    assert json.loads(open(ledger).read())["pods"] == {}


async def test_attaching_an_attached_pod_answers_from_the_record_without_netlink(net, tmp_path):
    ns = net.netns()
    nics, specs = two_nics(net)
    att = NetAttacher(str(tmp_path / "ledger.json"))
    first = await att.attach_pod(POD, ns, specs)
    # change the pod's interface by hand: a second attach that touched netlink would notice or undo it
    run("nsenter", f"--net={ns}", "ip", "link", "set", "net1", "mtu", "1280")
    writes = att.ledger.writes
    assert await att.attach_pod(POD, ns, specs) == first
    assert att.ledger.writes == writes
    assert link(ns, "net1")["mtu"] == 1280
    # another instance (a rolling update) reads the same ledger
    assert await NetAttacher(str(tmp_path / "ledger.json")).attach_pod(POD, ns, specs) == first


async def test_reconcile_returns_the_interfaces_of_pods_that_are_gone_and_keeps_the_live_ones(net, tmp_path):
    ns_a, ns_b = net.netns(), net.netns()
    a, b = net.veth(), net.veth()
    att = NetAttacher(str(tmp_path / "ledger.json"))
    await att.attach_pod("pod-a", ns_a, [InterfaceSpec(a.name, "net1")])
    await att.attach_pod("pod-b", ns_b, [InterfaceSpec(b.name, "net1")])
    await att.reconcile({"pod-a": ns_a})
    assert link(ns_a, "net1")["address"] == a.mac and len(att.attached("pod-a")) == 1
    assert link(None, b.name)["address"] == b.mac and att.attached("pod-b") == []
    # a live pod now in another namespace (its sandbox was recreated): the old attachment is returned
    await att.reconcile({"pod-a": ns_b})
    assert link(None, a.name)["address"] == a.mac and att.attached("pod-a") == []


async def test_a_killed_pod_with_a_veth_inside_is_reported_lost_and_forgotten(net, tmp_path):
    ns = net.netns()
    a = net.veth()
    att = NetAttacher(str(tmp_path / "ledger.json"), settle_s=0.2)
    await att.attach_pod(POD, ns, [InterfaceSpec(a.name, "net1")])
    net.kill(ns)
    assert await att.detach_pod(POD) == {a.name: Outcome.LOST}
    assert att.attached(POD) == [] and await att.detach_pod(POD) == {}


async def test_a_pod_gets_all_its_interfaces_or_none(net, tmp_path):
    ns = net.netns()
    a = net.veth(mtu=1400)
    att = NetAttacher(str(tmp_path / "ledger.json"))
    missing = net.name("x")
    with pytest.raises(AttachError) as e:
        await att.attach_pod(POD, ns, [InterfaceSpec(a.name, "net1", mtu=9000), InterfaceSpec(missing, "net2")])
    assert e.value.ifname == missing
    assert link(None, a.name)["mtu"] == 1400 and link(ns, "net1") is None
    assert json.loads(open(tmp_path / "ledger.json").read())["pods"] == {}


async def test_two_pods_asking_for_one_interface_at_once_get_it_once(net, tmp_path):
    ns_a, ns_b = net.netns(), net.netns()
    a = net.veth()
    att = NetAttacher(str(tmp_path / "ledger.json"))
    results = await asyncio.gather(att.attach_pod("pod-a", ns_a, [InterfaceSpec(a.name, "net1")]),
                                   att.attach_pod("pod-b", ns_b, [InterfaceSpec(a.name, "net1")]),
                                   return_exceptions=True)
    assert len(results[0]) == 1  # the first in gets it
    assert isinstance(results[1], AttachError) and "already attached to pod pod-a" in str(results[1])
    assert link(ns_a, "net1")["address"] == a.mac and link(ns_b, "net1") is None


@pytest.mark.parametrize("text, why", [
    ("{not json", "not a valid ledger"),
    ('{"version": 99, "pods": {}}', "format version 99 is not 1"),
    ('{"version": 1, "pods": {"p": {"netns": "/x", "state": "half"}}}', "not a valid ledger"),
])
def test_a_corrupt_ledger_is_refused_naming_the_file_and_the_fix(tmp_path, text, why):
    path = tmp_path / "ledger.json"
    path.write_text(text)
    with pytest.raises(LedgerError) as e:
        NetAttacher(str(path))
    assert isinstance(e.value, InputError)
    assert str(path) in str(e.value) and why in str(e.value) and "move the file aside" in str(e.value)
