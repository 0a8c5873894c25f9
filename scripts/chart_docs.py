#!/usr/bin/env python3
"""Regenerate the generated parts of charts/topo-device-plugin/README.md.

    python scripts/chart_docs.py            # rewrite README.md in place
    python scripts/chart_docs.py --check    # exit 1 (and show a diff) if README.md is stale

Two parts of the README are generated, each between marker comments:

* ``values-table``: one row per documented key of values.yaml. A key is documented by a
  comment block right above it that starts with ``# --``; following ``#`` lines continue
  the description, and ``# @default -- TEXT`` replaces the printed default. The default
  and type come from the parsed values.yaml.
* ``helm-template``: the ConfigMap and DaemonSet that ``helm template`` renders for the
  default values (release ``topo-device-plugin``, namespace ``kube-system``). It needs a
  helm binary: ``--helm PATH``, ``$HELM``, or the one scripts/install_helm.sh builds.
  ``--no-helm`` leaves that part alone (and ``--check`` then checks the table only).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "topo-device-plugin"
README = CHART / "README.md"
RELEASE = "topo-device-plugin"
NAMESPACE = "kube-system"
EXCERPT_KINDS = ("ConfigMap", "DaemonSet")
#: The excerpt renders for the tested Kubernetes line (offline `helm template` assumes 1.20, which the chart's
#: kubeVersion refuses).
KUBE_VERSION = json.loads((ROOT / "tests" / "kubelet" / "k8s_versions.json").read_text())["current"]["kubernetes"]

KEY_RE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/]+|\"[^\"]+\"):(?:\s|$)")


@dataclass
class Doc:
    path: tuple[str, ...]
    description: str
    default_override: str | None


def parse_docs(text: str) -> list[Doc]:
    """The documented keys of a values.yaml, in file order."""
    docs: list[Doc] = []
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    pending: list[str] | None = None  # description lines of the current "# --" block
    default_override: str | None = None
    seq_indent: int | None = None  # indent of the "- " items we are inside, if any
    for raw in text.splitlines():
        stripped = raw.strip()
        indent = len(raw) - len(raw.lstrip(" "))
        if stripped.startswith("#"):
            body = stripped[1:].strip()
            if body.startswith("--"):
                pending = [body[2:].strip()]
                default_override = None
            elif pending is not None and body.startswith("@default --"):
                default_override = body[len("@default --") :].strip()
            elif pending is not None:
                pending.append(body)
            continue
        if not stripped:
            continue
        if seq_indent is not None:
            if indent > seq_indent or (indent == seq_indent and stripped.startswith("-")):
                continue
            seq_indent = None
        if stripped.startswith("-"):
            seq_indent = indent
            pending = None
            continue
        m = KEY_RE.match(raw)
        if not m:
            pending = None
            continue
        key = m.group("key").strip('"')
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(k for _, k in stack) + (key,)
        stack.append((indent, key))
        if pending is not None:
            desc = " ".join(line for line in pending if line)
            docs.append(Doc(path, desc, default_override))
        pending = None
        default_override = None
    return docs


def lookup(values: dict, path: tuple[str, ...]):
    node = values
    for key in path:
        node = node[key]
    return node


def type_name(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def values_table(values_text: str) -> str:
    values = yaml.safe_load(values_text)
    rows = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for doc in parse_docs(values_text):
        value = lookup(values, doc.path)
        if doc.default_override is not None:
            default = doc.default_override
        else:
            default = "`" + json.dumps(value, separators=(", ", ": ")) + "`"
        rows.append(
            f"| `{'.'.join(doc.path)}` | {type_name(value)} | {cell(default)} | {cell(doc.description)} |"
        )
    return "\n".join(rows)


def find_helm(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install_helm.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def helm_excerpt(helm: str) -> str:
    out = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    keep = []
    for doc in re.split(r"^---\s*$", out, flags=re.M):
        obj = yaml.safe_load(doc)
        if isinstance(obj, dict) and obj.get("kind") in EXCERPT_KINDS:
            keep.append("---\n" + doc.strip("\n") + "\n")
    cmd = f"helm template {RELEASE} charts/topo-device-plugin --namespace {NAMESPACE} --kube-version {KUBE_VERSION}"
    return f"```yaml\n# {cmd}  (ConfigMap and DaemonSet only)\n" + "".join(keep) + "```"


def replace_block(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"chart_docs: {README} has no {begin} ... {end} markers")
    note = "<!-- generated by scripts/chart_docs.py; do not edit by hand -->"
    return pattern.sub(lambda _: f"{begin}\n{note}\n{body}\n{end}", text)


def render(readme_text: str, values_text: str, helm: str | None) -> str:
    text = replace_block(readme_text, "values-table", values_table(values_text))
    if helm is not None:
        text = replace_block(text, "helm-template", helm_excerpt(helm))
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if README.md is not up to date")
    ap.add_argument("--helm", help="helm binary for the template excerpt")
    ap.add_argument("--no-helm", action="store_true", help="leave the helm-template part alone")
    args = ap.parse_args(argv)

    helm = None if args.no_helm else find_helm(args.helm)
    current = README.read_text()
    wanted = render(current, (CHART / "values.yaml").read_text(), helm)
    if args.check:
        if current == wanted:
            print("chart_docs: README.md is up to date")
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                current.splitlines(True), wanted.splitlines(True), "README.md", "README.md (regenerated)"
            )
        )
        print("chart_docs: README.md is stale; run: python scripts/chart_docs.py", file=sys.stderr)
        return 1
    if current != wanted:
        README.write_text(wanted)
        print(f"chart_docs: wrote {README.relative_to(ROOT)}")
    else:
        print("chart_docs: README.md already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
