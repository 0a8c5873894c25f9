"""Policy option cases (kubelet 1.37 levels: prefer-closest and max-allowable both GA)."""

from __future__ import annotations

import pytest

from allocator.topologymanager import FeatureGates, PolicyOptionError, PolicyOptions, parse_policy_options
from allocator.topologymanager.options import check_policy_option_available, go_atoi, go_parse_bool


@pytest.mark.parametrize(
    "description, options, gates, expected",
    [
        ("empty options", {}, FeatureGates(), PolicyOptions()),
        ("None options", None, FeatureGates(), PolicyOptions()),
        ("prefer closest true", {"prefer-closest-numa-nodes": "true"}, FeatureGates(), PolicyOptions(True, 8)),
        ("prefer closest Go spelling T", {"prefer-closest-numa-nodes": "T"}, FeatureGates(), PolicyOptions(True, 8)),
        ("prefer closest false", {"prefer-closest-numa-nodes": "0"}, FeatureGates(), PolicyOptions(False, 8)),
        (
            "GA option needs no gate",
            {"prefer-closest-numa-nodes": "true"},
            FeatureGates(policy_beta_options=False),
            PolicyOptions(True, 8),
        ),
        ("max allowable 8", {"max-allowable-numa-nodes": "8"}, FeatureGates(), PolicyOptions(False, 8)),
        ("max allowable 12", {"max-allowable-numa-nodes": "12"}, FeatureGates(), PolicyOptions(False, 12)),
        (
            "max allowable is GA: no gate needed",
            {"max-allowable-numa-nodes": "12"},
            FeatureGates(policy_beta_options=False),
            PolicyOptions(False, 12),
        ),
        (
            "both",
            {"prefer-closest-numa-nodes": "true", "max-allowable-numa-nodes": "16"},
            FeatureGates(),
            PolicyOptions(True, 16),
        ),
    ],
)
def test_parse_policy_options(description, options, gates, expected):
    assert parse_policy_options(options, gates) == expected


@pytest.mark.parametrize(
    "description, options, gates, message",
    [
        (
            "unknown option",
            {"unknown-option": "true"},
            FeatureGates(),
            'unknown Topology Manager Policy option: "unknown-option"',
        ),
        (
            "bad bool",
            {"prefer-closest-numa-nodes": "not a boolean"},
            FeatureGates(),
            'bad value for option "prefer-closest-numa-nodes": '
            'strconv.ParseBool: parsing "not a boolean": invalid syntax',
        ),
        (
            "bad int",
            {"max-allowable-numa-nodes": "can't parse to int"},
            FeatureGates(),
            'unable to convert policy option to integer "max-allowable-numa-nodes": '
            "strconv.Atoi: parsing \"can't parse to int\": invalid syntax",
        ),
        (
            "less than 8",
            {"max-allowable-numa-nodes": "7"},
            FeatureGates(),
            'the minimum value of "max-allowable-numa-nodes" should not be less than 8',
        ),
    ],
)
def test_parse_policy_options_errors(description, options, gates, message):
    with pytest.raises(PolicyOptionError) as err:
        parse_policy_options(options, gates)
    assert str(err.value) == message


def test_more_than_default_max_warns():
    opts = parse_policy_options({"max-allowable-numa-nodes": "12"})
    assert opts.warnings and "more than the default recommended value" in opts.warnings[0]


@pytest.mark.parametrize(
    "option, gates, available",
    [
        ("this-option-does-not-exist", FeatureGates(), False),
        ("this-option-does-not-exist", FeatureGates(True, True), False),
        ("prefer-closest-numa-nodes", FeatureGates(False, False), True),
        ("max-allowable-numa-nodes", FeatureGates(False, True), True),
        ("max-allowable-numa-nodes", FeatureGates(False, False), True),
    ],
)
def test_option_available(option, gates, available):
    try:
        check_policy_option_available(option, gates)
        ok = True
    except PolicyOptionError:
        ok = False
    assert ok is available


@pytest.mark.parametrize(
    "text, value",
    [("1", True), ("t", True), ("TRUE", True), ("True", True), ("0", False), ("F", False), ("yes", None), ("", None)],
)
def test_go_parse_bool(text, value):
    assert go_parse_bool(text) is value


@pytest.mark.parametrize("text, value", [("8", 8), ("+12", 12), ("-3", -3), ("012", 12)])
def test_go_atoi_ok(text, value):
    assert go_atoi(text) == value


@pytest.mark.parametrize("text", ["", "1.5", " 8", "8 ", "1_000", "0x10"])
def test_go_atoi_rejects_what_go_rejects(text):
    assert isinstance(go_atoi(text), str)
