"""Only the composition root (`plugin/runtime/compose/`) builds the program's long-lived parts.

Why a test: the program used to be composed in three places (the CLI, the
options, the DRA driver), so nobody could read in one file what runs in a mode
(issue 31). This walks every module of `plugin/` and fails on a call that
constructs a server, a source, a publisher, a backend, a labeller or the DRA
driver anywhere else. The classes are found in the code, not listed by hand:
every class of `plugin/` whose name ends in one of those words (protocols
left out), every class that implements a `...Backend` protocol (the
time-slice setters), the NIC side's two parts the root wires (`PodNetwork`,
`NriPlugin`), the sharing wrapper (`GpuSharing`) and the `Daemon`. Factory functions that construct one for the root count as
constructions too. The few places that still construct one, each for a reason
the root cannot take over, are listed with that reason; an entry that no
longer matches anything fails too, so the list cannot go stale.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The composition root: constructions are what it is for.
COMPOSE = "plugin/runtime/compose/"
SUFFIX = re.compile(r"(Server|Source|Publisher|Backend|Driver|Labeller)$")
#: Collaborators named by what they are, not by a suffix: the NIC side of the DRA driver, the wrapper every
#: sharing backend is handed in, and the daemon that runs the device-plugin side.
NAMED = ("PodNetwork", "NriPlugin", "GpuSharing", "Daemon")
#: Functions that construct a listed class for the root: calling one is constructing.
FACTORIES = ("hardware_source_from_options",)

#: (module, class) → why that module constructs it itself.
ALLOWED: dict[tuple[str, str], str] = {
    ("plugin/sources/hardware.py", "HardwareSource"):
        "`hardware_source_from_options` is the hardware source's option mapping; it is listed in FACTORIES, so "
        "only the root may call it",
    ("plugin/sources/hardware.py", "NvmlGpuSource"):
        "the hardware source's own GPU half, made from the HardwareOptions it was given (NVML handle, health)",
    ("plugin/observability/health_endpoint.py", "BoundedHTTPServer"):
        "the health endpoint's own HTTP transport, made when it starts",
    ("plugin/runtime/daemon.py", "ResourceServer"):
        "one server per resource, made and replaced on every topology change and config reload: serving, "
        "not composition",
    ("plugin/runtime/daemon.py", "HealthServer"):
        "made only when the daemon starts with --metrics-address (h11 loaded only then, docs/deployment.md) and "
        "bound to the daemon's own readiness",
    ("plugin/dra/kubelet/prepare.py", "GpuSharing"):
        "ClaimPreparer's default when built without a driver (its unit tests); the driver always passes the root's",
    ("plugin/dra/kubelet/prepare.py", "SimulatedTimeSlice"): "as above: the default's backend",
    ("plugin/nrt/side.py", "HeldSource"):
        "the NRT side's own pod-resources reader, made from the socket in its options (the root builds the side "
        "itself; tests pass a counting reader instead)",
}


@functools.lru_cache(maxsize=4)
def _modules(root: pathlib.Path) -> dict[str, ast.Module]:
    """Every module of `plugin/` under `root`, parsed (once per root: the tests only read the trees)."""
    return {p.relative_to(root).as_posix(): ast.parse(p.read_text()) for p in sorted((root / "plugin").rglob("*.py"))}


def _is_protocol(c: ast.ClassDef) -> bool:
    return any((isinstance(b, ast.Name) and b.id == "Protocol") or (isinstance(b, ast.Attribute) and b.attr == "Protocol")
               for b in c.bases)


def _methods(c: ast.ClassDef) -> set[str]:
    return {f.name for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not f.name.startswith("_")}


def collaborator_classes(modules: dict[str, ast.Module]) -> set[str]:
    """The classes of `plugin/` that only the root may construct (see the module docstring). A backend
    protocol's implementers are looked for beside it (where the backends of one concern live), so that an
    unrelated class with a method of the same name is not taken for one."""
    found: set[str] = set()
    every: set[str] = set()
    for tree in modules.values():
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        every |= {c.name for c in classes}
        found |= {c.name for c in classes if SUFFIX.search(c.name) and not _is_protocol(c)}
        for proto in (c for c in classes if _is_protocol(c) and c.name.endswith("Backend") and _methods(c)):
            found |= {c.name for c in classes if not _is_protocol(c) and _methods(proto) <= _methods(c)}
    return found | (set(NAMED) & every)


def _called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def constructions(modules: dict[str, ast.Module], names: set[str]) -> set[tuple[str, str]]:
    """(module, name) of every call of a class in `names` or of a factory, in every module."""
    wanted = names | set(FACTORIES)
    return {(path, name) for path, tree in modules.items() for node in ast.walk(tree)
            if isinstance(node, ast.Call) and (name := _called_name(node)) in wanted}


def violations(root: pathlib.Path = ROOT) -> list[str]:
    modules = _modules(root)
    found = constructions(modules, collaborator_classes(modules))
    return sorted(f"{path} constructs {name} (build it in {COMPOSE}, or list it in ALLOWED with the reason)"
                  for path, name in found if not path.startswith(COMPOSE) and (path, name) not in ALLOWED)


def test_only_the_root_constructs_servers_sources_publishers_backends_and_the_driver():
    found = violations()
    assert not found, "\n".join(found)


def test_the_class_list_comes_from_the_code_and_holds_what_the_root_builds():
    names = collaborator_classes(_modules(ROOT))
    # One of each kind, so a rename that drops a class from the list fails here rather than silently.
    assert {"ResourceServer", "HealthServer", "SimulatedSource", "HardwareSource", "FabricLabelledSource",
            "SlicePublisher", "SimulatedMigBackend", "NvmlMigBackend", "DraDriver", "NodeLabeller",
            "SimulatedTimeSlice", "NvidiaSmiTimeSlice", "PodNetwork", "NriPlugin"} <= names, sorted(names)
    assert "TopologySource" not in names and "MigBackend" not in names  # protocols are not constructed


def test_the_walk_finds_the_roots_own_constructions():
    """The check can fail: the same walk sees each collaborator being built in the root."""
    modules = _modules(ROOT)
    built = {name for path, name in constructions(modules, collaborator_classes(modules)) if path.startswith(COMPOSE)}
    assert {"DraDriver", "SlicePublisher", "SimulatedSource", "FabricLabelledSource", "NodeLabeller",
            "hardware_source_from_options", "SimulatedMigBackend", "NvmlMigBackend", "SimulatedTimeSlice",
            "NvidiaSmiTimeSlice", "GpuSharing", "PodNetwork", "NriPlugin", "Daemon"} <= built, sorted(built)


def test_a_construction_outside_the_root_is_reported(tmp_path):
    (tmp_path / "plugin" / "cli").mkdir(parents=True)
    (tmp_path / "plugin" / "runtime" / "compose").mkdir(parents=True)
    (tmp_path / "plugin" / "sources.py").write_text("class SimulatedSource:\n    pass\n")
    (tmp_path / "plugin" / "cli" / "serve.py").write_text(
        "from ..sources import SimulatedSource\n\ndef serve():\n    return SimulatedSource()\n")
    (tmp_path / "plugin" / "runtime" / "compose" / "root.py").write_text(
        "from ...sources import SimulatedSource\n\ndef compose():\n    return SimulatedSource()\n")
    assert violations(tmp_path) == [
        "plugin/cli/serve.py constructs SimulatedSource (build it in plugin/runtime/compose/, or list it in "
        "ALLOWED with the reason)"]


def test_every_allowed_entry_is_still_needed():
    modules = _modules(ROOT)
    found = constructions(modules, collaborator_classes(modules))
    stale = sorted(f"{path}: {name}" for path, name in ALLOWED if (path, name) not in found)
    assert not stale, "ALLOWED names constructions that no longer happen:\n" + "\n".join(stale)
