"""The allocator is pure: no module of `allocator/` imports gRPC or the daemon (`plugin`).

Why a test: it is the property that lets the allocator be tested exhaustively,
reused by the offline commands and reasoned about without I/O; one convenient
import would erode it silently. Every import statement of every module is read
from its syntax tree, so imports inside functions count too.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FORBIDDEN = ("grpc", "plugin")


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, a module of `package`."""
    tree = ast.parse(source)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.append((node.lineno, name))
    return out


def package_of(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


def test_allocator_never_imports_grpc_or_plugin():
    modules = sorted((ROOT / "allocator").rglob("*.py"))
    assert len(modules) > 20
    bad = [f"{m.relative_to(ROOT)}:{line} imports {name}"
           for m in modules for line, name in imported_modules(m.read_text(), package_of(m))
           if name.split(".")[0] in FORBIDDEN or not name]
    assert not bad, "\n".join(bad)


def test_the_rule_reader_sees_imports_the_rule_forbids():
    """The reader itself: function-level and relative imports that climb out of allocator/ are seen."""
    source = "from ..topology import Link\n\ndef f():\n    import grpc\n\nfrom ...plugin import server\n"
    names = [n for _, n in imported_modules(source, "allocator.policies")]
    assert sorted(names) == ["allocator.topology", "grpc", "plugin"]
