"""The build context `docker build .` sends, read from .dockerignore as Docker reads it.

Used by scripts/build_image.py (which builds from exactly this context and keys its cache
on it) and by tests/image/test_image.py (which checks the allowlist).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

Patterns = list[tuple[bool, re.Pattern]]


def patterns(dockerignore: Path) -> Patterns:
    """(negated, regex) per pattern; Go filepath.Match syntax plus `**`."""
    out = []
    for raw in dockerignore.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        pat = os.path.normpath(line[1:] if neg else line).lstrip("/")
        rx, i = "", 0
        while i < len(pat):
            if pat.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pat.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pat[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pat[i] == "?":
                rx, i = rx + "[^/]", i + 1
            elif pat[i] == "[":
                j = pat.index("]", i)
                rx, i = rx + pat[i : j + 1], j + 1
            else:
                rx, i = rx + re.escape(pat[i]), i + 1
        out.append((neg, re.compile(rx + "$")))
    return out


def excluded(rel: str, pats: Patterns) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents wins."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for neg, rx in pats:
        if any(rx.match(c) for c in candidates):
            result = not neg
    return result


def context_files(root: Path) -> list[str]:
    """The relative paths (sorted) that `docker build root` would send."""
    pats = patterns(root / ".dockerignore") if (root / ".dockerignore").exists() else []
    negations = [rx for neg, rx in pats if neg]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in dirnames:
            rel = f"{rel_dir}/{d}" if rel_dir else d
            # Prune excluded dirs unless a negation could re-include something below them.
            if excluded(rel, pats) and not any(rx.match(rel) for rx in negations):
                continue
            keep.append(d)
        dirnames[:] = sorted(keep)
        for f in filenames:
            rel = f"{rel_dir}/{f}" if rel_dir else f
            if not excluded(rel, pats):
                found.append(rel)
    return sorted(found)


def copy_context(root: Path, dest: Path) -> list[str]:
    """Copy what `docker build root` would send into `dest`; return the relative paths."""
    files = context_files(root)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, dest / rel)
    return files
