"""Topology Manager policy options (`--topology-manager-policy-options`), as in kubelet 1.37.

Why model the parsing and not just take booleans: `explain` accepts the same
`key=value` strings an operator puts in the kubelet config, and a wrong value
must fail with the kubelet's own message, or the what-if report would promise
a configuration the real kubelet refuses to start with.

Kubelet 1.37: `prefer-closest-numa-nodes` and `max-allowable-numa-nodes` are
both GA (the latter was beta up to 1.34: with TopologyManagerPolicyBetaOptions
off, 1.34 refuses it and 1.37 accepts it); no alpha or beta options exist.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .hint import TopologyManagerError

PREFER_CLOSEST_NUMA_NODES = "prefer-closest-numa-nodes"
MAX_ALLOWABLE_NUMA_NODES = "max-allowable-numa-nodes"

#: The kubelet's `defaultMaxAllowableNUMANodes`.
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8

ALPHA_OPTIONS: frozenset[str] = frozenset()
BETA_OPTIONS: frozenset[str] = frozenset()
STABLE_OPTIONS: frozenset[str] = frozenset({PREFER_CLOSEST_NUMA_NODES, MAX_ALLOWABLE_NUMA_NODES})


class PolicyOptionError(TopologyManagerError):
    """An option the kubelet would refuse (its message is the kubelet's)."""


@dataclass(frozen=True)
class FeatureGates:
    """The two gates that decide which option levels are accepted (1.37 defaults)."""

    policy_alpha_options: bool = False  # TopologyManagerPolicyAlphaOptions
    policy_beta_options: bool = True  # TopologyManagerPolicyBetaOptions


@dataclass(frozen=True)
class PolicyOptions:
    prefer_closest_numa: bool = False
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    #: Non-fatal remarks the kubelet would log (shown by `explain`).
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, object]:
        return {
            PREFER_CLOSEST_NUMA_NODES: self.prefer_closest_numa,
            MAX_ALLOWABLE_NUMA_NODES: self.max_allowable_numa_nodes,
        }


def check_policy_option_available(option: str, gates: FeatureGates = FeatureGates()) -> None:
    """Raise PolicyOptionError unless `option` exists and its level is enabled."""
    if option not in ALPHA_OPTIONS | BETA_OPTIONS | STABLE_OPTIONS:
        raise PolicyOptionError(f"unknown Topology Manager Policy option: {_go_quote(option)}")
    if option in ALPHA_OPTIONS and not gates.policy_alpha_options:
        raise PolicyOptionError(
            "topology manager policy alpha-level options not enabled, "
            f"but option {_go_quote(option)} provided"
        )
    if option in BETA_OPTIONS and not gates.policy_beta_options:
        raise PolicyOptionError(
            "topology manager policy beta-level options not enabled, "
            f"but option {_go_quote(option)} provided"
        )


def parse_policy_options(
    options: Mapping[str, str] | None, gates: FeatureGates = FeatureGates()
) -> PolicyOptions:
    """The kubelet's `NewPolicyOptions`. Options are checked in the mapping's order
    (the kubelet walks a Go map, so with several bad options which one it reports varies)."""
    prefer = False
    max_nodes = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    warnings: list[str] = []
    for name, value in (options or {}).items():
        check_policy_option_available(name, gates)
        if name == PREFER_CLOSEST_NUMA_NODES:
            parsed = go_parse_bool(value)
            if parsed is None:
                raise PolicyOptionError(
                    f"bad value for option {_go_quote(name)}: "
                    f"strconv.ParseBool: parsing {_go_quote(value)}: invalid syntax"
                )
            prefer = parsed
        elif name == MAX_ALLOWABLE_NUMA_NODES:
            number = go_atoi(value)
            if isinstance(number, str):
                raise PolicyOptionError(
                    f"unable to convert policy option to integer {_go_quote(name)}: {number}"
                )
            if number < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
                raise PolicyOptionError(
                    f"the minimum value of {_go_quote(name)} should not be less than "
                    f"{DEFAULT_MAX_ALLOWABLE_NUMA_NODES}"
                )
            if number > DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
                warnings.append(
                    "WARNING: the value of max-allowable-numa-nodes is more than the default "
                    f"recommended value (max-allowable-numa-nodes={number}, "
                    f"defaultMaxAllowableNUMANodes={DEFAULT_MAX_ALLOWABLE_NUMA_NODES})"
                )
            max_nodes = number
    return PolicyOptions(prefer, max_nodes, tuple(warnings))


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def go_parse_bool(value: str) -> bool | None:
    """Go's `strconv.ParseBool`; None where Go returns an error."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    return None


_ATOI_RE = re.compile(r"^[+-]?[0-9]+$")
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1


def go_atoi(value: str) -> int | str:
    """Go's `strconv.Atoi` on a 64-bit platform: the int, or Go's error text."""
    if not _ATOI_RE.match(value):
        return f"strconv.Atoi: parsing {_go_quote(value)}: invalid syntax"
    number = int(value)
    if not _INT_MIN <= number <= _INT_MAX:
        return f"strconv.Atoi: parsing {_go_quote(value)}: value out of range"
    return number


def _go_quote(text: str) -> str:
    """Go's `%q` for the plain strings options are made of."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    return f'"{escaped}"'
