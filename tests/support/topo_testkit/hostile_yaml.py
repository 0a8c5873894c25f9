"""Hostile config and node files, for the tests that show the daemon survives them.

One home for them so the start-up (CLI) and live-edit (daemon) tests attack
with the same inputs.
"""

from __future__ import annotations

#: The most a hostile input may cost the daemon, in KiB: 128 MiB, two thirds of the chart's memory
#: limit (192Mi), the rest being what NVML adds on a real node (docs/deployment.md).
HOSTILE_INPUT_RSS_BOUND_KIB = 128 * 1024
NODE_HEAD = "apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\n"


def billion_laughs(levels: int = 8) -> str:
    """A flow list whose item k is nine aliases of item k-1: 9**levels strings from ~400 bytes.

    All of it sits in one field the schema checks, so a reader that expands
    aliases builds the whole thing (and quotes it in its error message)."""
    items = ['&l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    items += [f"&l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def nested(depth: int = 3000) -> str:
    """A flow mapping nested `depth` levels deep."""
    return "{a: " * depth + "1" + "}" * depth


def config_with(flags_value: str) -> str:
    """A config file whose `flags:` (or one flag) carries `flags_value`."""
    return "version: v1\nflags: " + flags_value + "\n"


def node_with(field: str, value: str) -> str:
    """A simulated-node file whose `field` carries `value`."""
    return NODE_HEAD + f"{field}: {value}\n"
