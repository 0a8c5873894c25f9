"""The import graph of `plugin/` and `allocator/` has no cycle, and `plugin/config` imports no runtime module.

Why a test: a cycle makes the load order matter (a module half-initialised when
its partner reads it), hides which layer serves which, and grows silently
(issue 20 found one through ten modules). The layers read top-down:
cli → runtime → serving, dra → allocation → model → sources → config → inputs,
watch, observability, errors; each imports only downward.

The rule, as the reader below applies it: every import statement of every
module counts, wherever it is: at the top, inside a function (a lazy import is
the usual way to hide a cycle, not to break it) and under `if TYPE_CHECKING:`
(a type the module needs is a dependency, even if Python skips the import at run
time). An import of `a.b.c` also depends on the packages `a.b` and `a` whose
`__init__` runs first, unless the importer is inside them (they are then already
running). `from pkg import name` depends on `pkg.name` when that is a module.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOP = ("plugin", "allocator")
#: What `plugin/config` may import besides itself: the error kinds and the pure input readers.
CONFIG_MAY_IMPORT = ("plugin.errors", "plugin.inputs")


def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    return {module_name(p, root): p for top in TOP for p in sorted((root / top).rglob("*.py"))}


def imports_of(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every module of `known` that `source` (the text of `module`) depends on."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
        for target in targets:
            parts = target.split(".")
            for n in range(1, len(parts) + 1):  # the packages whose __init__ runs first, then the module
                name = ".".join(parts[:n])
                inside = module == name or module.startswith(name + ".")
                if name in known and name != module and not inside:
                    found.append((node.lineno, name))
    return found


def import_graph(root: pathlib.Path = ROOT) -> dict[str, dict[str, int]]:
    """module → {imported module: first line}, for the modules of `plugin/` and `allocator/`."""
    modules = all_modules(root)
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for line, target in imports_of(path.read_text(), name, path.name == "__init__.py", known):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # iterative: the graph is deep enough to matter for recursion limits
        work = [(v, iter(graph.get(v, ())))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    members = set(component)
    edges = [f"  {a} → {b} (line {graph[a][b]})" for a in component for b in sorted(graph[a]) if b in members]
    return f"cycle through {len(component)} modules: {', '.join(component)}\n" + "\n".join(edges)


def test_no_import_cycles_in_plugin_or_allocator():
    graph = import_graph()
    assert len(graph) > 100
    found = cycles(graph)
    assert not found, "\n".join(describe(c, graph) for c in found)


def test_config_imports_no_runtime_module():
    """`plugin/config` declares options; what uses them imports it, never the other way round."""
    graph = import_graph()
    bad = [f"{m} imports {t} (line {line})"
           for m, edges in graph.items() if m == "plugin.config" or m.startswith("plugin.config.")
           for t, line in edges.items()
           if t.startswith("plugin") and t != "plugin"
           and not (t == "plugin.config" or t.startswith("plugin.config."))
           and not any(t == ok or t.startswith(ok + ".") for ok in CONFIG_MAY_IMPORT)]
    assert not bad, "\n".join(bad)


# -- the reader itself: what it must see --------------------------------------------------------------

def _graph_of(tmp_path: pathlib.Path, files: dict[str, str]) -> dict[str, dict[str, int]]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return import_graph(tmp_path)


def test_a_cycle_hidden_in_a_function_or_a_type_check_is_found(tmp_path):
    graph = _graph_of(tmp_path, {
        "plugin/__init__.py": "",
        "plugin/a.py": "from .b import x\n",
        "plugin/b.py": "def f():\n    from . import c\n",
        "plugin/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from plugin.a import y\n",
        "allocator/__init__.py": "",
    })
    assert cycles(graph) == [["plugin.a", "plugin.b", "plugin.c"]]
    message = describe(cycles(graph)[0], graph)
    assert "plugin.b → plugin.c (line 2)" in message and "plugin.c → plugin.a (line 3)" in message


def test_a_package_init_that_imports_its_importer_is_a_cycle(tmp_path):
    """`from ..pkg.mod import x` runs `pkg/__init__` first: if that imports the importer, it is a cycle;
    a module inside the package importing its sibling is not."""
    graph = _graph_of(tmp_path, {
        "plugin/__init__.py": "",
        "plugin/pkg/__init__.py": "from .mod import x\nfrom ..user import y\n",
        "plugin/pkg/mod.py": "from .other import z\n",
        "plugin/pkg/other.py": "",
        "plugin/user.py": "from .pkg.other import z\n",
        "allocator/__init__.py": "",
    })
    assert cycles(graph) == [["plugin.pkg", "plugin.user"]]
    assert "plugin.pkg" not in graph["plugin.pkg.mod"]


def test_config_rule_sees_an_import_of_a_runtime_module(tmp_path, monkeypatch):
    graph = _graph_of(tmp_path, {
        "plugin/__init__.py": "", "plugin/errors.py": "",
        "plugin/config/__init__.py": "from ..errors import E\n",
        "plugin/config/flags.py": "from ..model.gpu import STRATEGIES\n",
        "plugin/model/__init__.py": "", "plugin/model/gpu.py": "",
        "allocator/__init__.py": "",
    })
    assert graph["plugin.config.flags"] == {"plugin.model": 1, "plugin.model.gpu": 1}
    assert graph["plugin.config"] == {"plugin.errors": 1}


def package_graph(graph: dict[str, dict[str, int]], inside: str = "plugin") -> dict[str, dict[str, int]]:
    """The same graph between the subpackages of `inside` (and whatever lies outside it, one node per top
    package or per subpackage of `plugin`): by default the layers of docs/architecture.md, with
    `inside="plugin.dra"` the DRA wing's concepts (kubelet, network, slices, mig, claims)."""
    depth = inside.count(".") + 2

    def layer(module: str) -> str:
        parts = module.split(".")
        if module == inside or module.startswith(inside + "."):
            return ".".join(parts[:depth])
        return ".".join(parts[:2]) if parts[0] == "plugin" else parts[0]

    out: dict[str, dict[str, int]] = {}
    for a, edges in graph.items():
        for b, line in edges.items():
            if layer(a) != layer(b) and b != "plugin":
                out.setdefault(layer(a), {}).setdefault(layer(b), line)
    return out


def test_subpackages_import_one_way():
    """Not only modules: the layers themselves (serving, model, sources...) form no cycle, so the flow reads
    top-down (sources → model → servers and drivers, the allocator consulted)."""
    layers = package_graph(import_graph())
    assert {"plugin.runtime", "plugin.serving", "plugin.model", "plugin.sources"} <= set(layers)
    found = cycles(layers)
    assert not found, "\n".join(describe(c, layers) for c in found)


def test_the_subpackage_table_of_the_architecture_doc_is_the_import_order():
    """docs/architecture.md lists the subpackages top-down; every import between them goes down that list."""
    listed = architecture_table()
    rank = {name: n for n, name in enumerate(listed)}
    layers = package_graph(import_graph())
    subpackages = {a for a in layers if a.startswith("plugin.") and a != "plugin.__main__"}
    assert subpackages <= set(rank), f"not in the table: {sorted(subpackages - set(rank))}"
    upward = upward_imports(layers, listed)
    assert not upward, "\n".join(upward)


def architecture_table(heading: str = "Subpackages") -> list[str]:
    """The modules and packages a table of docs/architecture.md (the section `heading`) lists, top-down, as
    dotted names."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [m.rstrip("/").removesuffix(".py").replace("/", ".")
            for m in re.findall(r"^\| `(plugin/[^`]+)` \|", section, re.M)]


def upward_imports(layers: dict[str, dict[str, int]], listed: list[str]) -> list[str]:
    """Each import of `layers` from a listed package to one listed above it."""
    rank = {name: n for n, name in enumerate(listed)}
    return [f"{a} imports {b} (line {line}; listed above it)" for a, edges in layers.items() if a in rank
            for b, line in edges.items() if b in rank and rank[b] < rank[a]]


def test_the_dra_wing_imports_down_its_table():
    """The DRA wing's concepts import one way, as docs/architecture.md lists them: the kubelet side stands on
    the pod network, the slices, MIG and the claim; nothing below imports back up (issue 31: the pod network
    imported the kubelet side's claim types while the kubelet side imported the pod network)."""
    listed = [m for m in architecture_table("Modules") if m.startswith("plugin.dra.")]
    layers = package_graph(import_graph(), inside="plugin.dra")
    # driver.py runs the wing (it imports every concept); it is the `plugin/dra/` row above them.
    wing = {a for a in layers if a.startswith("plugin.dra.") and a != "plugin.dra.driver"}
    assert {"plugin.dra.kubelet", "plugin.dra.network", "plugin.dra.claims"} <= wing
    assert wing <= set(listed), f"not in the table: {sorted(wing - set(listed))}"
    assert not cycles(layers), "\n".join(describe(c, layers) for c in cycles(layers))
    upward = upward_imports(layers, listed)
    assert not upward, "\n".join(upward)


def test_the_wing_rule_sees_a_back_arrow(tmp_path):
    """The reader of that rule: a module of a lower concept importing a higher one's is reported with its line."""
    graph = _graph_of(tmp_path, {
        "plugin/__init__.py": "", "plugin/dra/__init__.py": "",
        "plugin/dra/kubelet/__init__.py": "", "plugin/dra/kubelet/prepare.py": "from ..network.plan import p\n",
        "plugin/dra/network/__init__.py": "",
        "plugin/dra/network/plan.py": "import os\nfrom ..kubelet.prepare import ClaimRef\n",
        "allocator/__init__.py": "",
    })
    layers = package_graph(graph, inside="plugin.dra")
    assert layers == {"plugin.dra.kubelet": {"plugin.dra.network": 1}, "plugin.dra.network": {"plugin.dra.kubelet": 2}}
    assert upward_imports(layers, ["plugin.dra.kubelet", "plugin.dra.network"]) == [
        "plugin.dra.network imports plugin.dra.kubelet (line 2; listed above it)"]
