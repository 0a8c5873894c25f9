"""Simulated nodes: built-in names, our YAML format, or `nvidia-smi topo -m` text.

Why simulated nodes are first-class: they let the daemon, the what-if
commands and the tests run anywhere (no GPU, no kubelet), and they are how a
user asks "what would the plugin do on my machine?".
"""

from __future__ import annotations

import pathlib
from importlib import resources

from allocator.topology import NodeTopology

from ...inputs import yaml_input
from ...inputs.yaml_input import YamlProblem, read_text
from ..errors import TopologyError
from .driver_health import NodeDriverFacts, SimulatedHealth
from .node_yaml import API_VERSION, load_node_yaml, load_node_yaml_with_driver
from .topo_matrix import has_header_row, load_topo_matrix, parse_topo_matrix

__all__ = [
    "API_VERSION",
    "builtin_names",
    "builtin_text",
    "load_node_yaml",
    "load_simulated",
    "load_simulated_with_driver",
    "load_topo_matrix",
    "parse_topo_matrix",
    "source_path",
    "stated_imex_major",
]


def builtin_names() -> list[str]:
    folder = resources.files("plugin.sources").joinpath("builtins")
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def builtin_text(name: str) -> str:
    return resources.files("plugin.sources").joinpath(f"builtins/{name}.yaml").read_text()


def source_path(source: str) -> pathlib.Path | None:
    """The file behind SOURCE (None for a built-in name): the daemon watches it for edits."""
    if source in builtin_names():
        return None
    return pathlib.Path(source)


def stated_imex_major(source: str) -> int | None:
    """The `imexChannelsMajor` a YAML node file states (None: a built-in, topo -m text, or not stated).

    Why here and not in the topology: it is no device's fact but the driver's, standing in for the
    `nvidia-caps-imex-channels` line of /proc/devices, which a simulated node has no procfs for.
    """
    path = source_path(source)
    if path is None:
        return None
    try:
        data, _ = yaml_input.load(read_text(str(path)))
    except (YamlProblem, OSError):  # not YAML (topo -m text), or unreadable: loading the node says why
        return None
    value = data.get("imexChannelsMajor") if isinstance(data, dict) else None
    return value if isinstance(value, int) else None


def load_simulated(source: str) -> NodeTopology:
    """Load SOURCE: a built-in name, a YAML node file, or `nvidia-smi topo -m` text.

    The format of a file is recognised by content (an `apiVersion:` line means
    YAML), not by extension, so users can paste outputs into any file. Files
    above 1 MiB are refused unread (`plugin.inputs.yaml_input`). GPUs' driver
    facts apply as at a daemon's start: a listed XID that needs an action makes
    its GPU Unhealthy (driver_health.py).
    """
    return SimulatedHealth().apply(*load_simulated_with_driver(source))


def load_simulated_with_driver(source: str) -> tuple[NodeTopology, NodeDriverFacts]:
    """As `load_simulated`, the topology as the file states it and its driver facts apart (the live source
    keeps the faults they cause across edits)."""
    if source in builtin_names():
        return load_node_yaml_with_driver(builtin_text(source), f"builtin:{source}")
    path = pathlib.Path(source)
    try:
        text = read_text(source)
    except FileNotFoundError:
        raise TopologyError(
            source, "no such file or built-in node",
            fix=f"give a file path or one of the built-ins: {', '.join(builtin_names())}",
        ) from None
    except OSError as e:
        raise TopologyError(source, f"cannot read: {e.strerror}") from None
    except YamlProblem as e:
        raise TopologyError(source, e.message, fix=e.fix) from None
    if any(line.startswith("apiVersion:") for line in text.splitlines()):
        return load_node_yaml_with_driver(text, source)
    if not has_header_row(text) and _is_yaml_mapping(text):
        raise TopologyError(source, "a YAML mapping without `apiVersion: topo-device-plugin/v1`: neither a "
                                    "simulated-node file nor `nvidia-smi topo -m` output",
                            line=1, fix="start the file with `apiVersion: topo-device-plugin/v1` and "
                                        "`kind: SimulatedNode` (docs/simulated-nodes.md)")
    return load_topo_matrix(text, source, node_name=path.stem), NodeDriverFacts()


def _is_yaml_mapping(text: str) -> bool:
    """Whether TEXT reads as a YAML mapping (a node file that lost its first line, say)."""
    try:
        data, _ = yaml_input.load(text)
    except YamlProblem:
        return False
    return isinstance(data, dict) and bool(data)
