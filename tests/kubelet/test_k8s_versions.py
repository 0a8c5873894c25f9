"""The Kubernetes versions are written down once (tests/kubelet/k8s_versions.json); every
other place that names them must agree: each line's go.mod (the k8s.io/kubernetes
require and every staging replace) and go.sum, kubelet_build.py, what the built
binaries report, and the docs.

These checks read files (and run the cached binaries where they are built); they need
no Go toolchain, so they run everywhere.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import kubelet_build
import pytest
from kubelet_testlib import ROOT, unavailable

LINES = kubelet_build.versions()
#: A full Kubernetes release or staging version as docs and code write them.
K8S_RE = re.compile(r"\bv1\.(2\d|3\d|4\d)\.\d+\b")
STAGING_RE = re.compile(r"\bv0\.(2\d|3\d|4\d)\.\d+\b")


def _gomod(line: kubelet_build.Line) -> tuple[dict[str, str], dict[str, str]]:
    """(requires, replaces) of a go.mod: module path -> version."""
    text = line.gomod.read_text()
    requires = dict(re.findall(r"^\s*(?:require\s+)?([\w./-]+) (v[\w.+-]+)(?: // indirect)?$", text, re.M))
    replaces = {}
    for old, new, ver in re.findall(r"^\s*(?:replace\s+)?([\w./-]+) => ([\w./-]+) (v[\w.+-]+)$", text, re.M):
        assert old == new, f"{line.gomod}: {old} replaced by another module ({new})"
        replaces[old] = ver
    return requires, replaces


def test_the_versions_file_has_both_lines():
    raw = json.loads(kubelet_build.VERSIONS_FILE.read_text())
    for name in ("current", "race"):
        assert set(raw[name]) >= {"kubernetes", "staging"}, raw[name]
    # 1.34 is the last minor whose kubelet has the #121994 re-registration race.
    assert LINES["race"].minor == "1.34"
    cur, race = (tuple(int(x) for x in LINES[n].minor.split(".")) for n in ("current", "race"))
    assert cur > race


@pytest.mark.parametrize("name", list(LINES))
def test_gomod_pins_the_line(name):
    line = LINES[name]
    requires, replaces = _gomod(line)
    assert requires.get("k8s.io/kubernetes") == line.kubernetes
    # k8s.io/kubernetes requires its staging modules at v0.0.0: each needs a replace, and
    # every replace is to this line's staging version.
    placeholders = {m for m, v in requires.items() if v == "v0.0.0"}
    assert placeholders <= set(replaces), f"staging modules without a replace: {placeholders - set(replaces)}"
    assert {"k8s.io/api", "k8s.io/apimachinery", "k8s.io/kubelet", "k8s.io/component-base"} <= set(replaces)
    wrong = {m: v for m, v in replaces.items() if v != line.staging}
    assert not wrong, f"{line.gomod}: replaces not at {line.staging}: {wrong}"
    wrong = {m: v for m, v in requires.items() if m in replaces and v not in (line.staging, "v0.0.0")}
    assert not wrong, f"{line.gomod}: staging requires not at {line.staging}: {wrong}"
    # go.sum was made from these versions.
    gosum = line.gosum.read_text()
    assert f"k8s.io/kubernetes {line.kubernetes}/go.mod " in gosum
    assert f"k8s.io/kubelet {line.staging} " in gosum


@pytest.mark.parametrize("name", list(LINES))
def test_gomod_replaces_every_staging_module_of_the_release(name):
    """The replace list is the release's own staging list (read from its go.mod, which
    the module cache holds once the line has been built or downloaded)."""
    line = LINES[name]
    upstream = kubelet_build.cache_dir() / "gomod" / "cache" / "download" / "k8s.io" / "kubernetes" / "@v" \
        / f"{line.kubernetes}.mod"
    if not upstream.exists():
        unavailable("the staging list check", f"{upstream} is not in the module cache yet "
                                               "(scripts/kubelet_tests.sh prepare downloads it)")
    staging = set(re.findall(r"^\s*(k8s\.io/[\w.-]+) => \./staging/", upstream.read_text(), re.M))
    assert set(_gomod(line)[1]) == staging


def test_kubelet_build_reads_the_versions_file_only():
    source = (kubelet_build.HERE / "kubelet_build.py").read_text()
    assert not K8S_RE.search(source) and not STAGING_RE.search(source), "kubelet_build.py names a version"
    assert kubelet_build.line().kubernetes == LINES["current"].kubernetes


def test_harness_cache_keys_do_not_depend_on_where_the_checkout_is(tmp_path):
    """Two clones share one build cache: neither may rebuild (or prune) the other's harness."""
    inputs = ["kubelet_build.py", "k8s_versions.json", "harness/go.mod", "harness/go.sum",
              "harness/race/go.mod", "harness/race/go.sum",
              *(str(p.relative_to(kubelet_build.HERE)) for p in (kubelet_build.HARNESS_DIR / "cmd").rglob("*.go"))]
    names = []
    for clone in (tmp_path / "a", tmp_path / "elsewhere" / "b"):
        for rel in inputs:
            dest = clone / "tests" / "kubelet" / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes((kubelet_build.HERE / rel).read_bytes())
        (clone / "scripts").mkdir()  # the cache's root and key helper kubelet_build imports
        (clone / "scripts" / "build_cache.py").write_bytes((kubelet_build.ROOT / "scripts" / "build_cache.py").read_bytes())
        proc = subprocess.run(
            [sys.executable, "-c", "import kubelet_build as k; print(*(k.harness_binary_path(n).name for n in k.LINES))"],
            cwd=clone / "tests" / "kubelet", capture_output=True, text=True, timeout=120,
            env={**os.environ, "TOPO_DP_CACHE_DIR": str(tmp_path / "cache")})
        assert proc.returncode == 0, proc.stderr
        names.append(proc.stdout.split())
    assert names[0] == names[1] and len(names[0]) == len(LINES), names


@pytest.mark.parametrize("name", list(LINES))
def test_built_harness_reports_its_line(name):
    line = LINES[name]
    binary = kubelet_build.harness_binary_path(name)
    if not binary.exists():
        unavailable("the harness version check", f"the {name} harness is not built here yet ({binary.name})")
    out = json.loads(subprocess.run([str(binary), "-mode", "version"], capture_output=True, text=True,
                                    check=True, timeout=60).stdout)
    assert out["kubernetes"] == line.kubernetes and out["staging"] == line.staging, out
    assert out.get("build_tags", "") == line.build_tags


def test_built_kubelet_reports_the_current_line():
    binary = kubelet_build.kubelet_binary_path()
    if not binary.exists():
        unavailable("the kubelet version check", f"the kubelet is not built here yet ({binary.name})")
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.split() == ["Kubernetes", LINES["current"].kubernetes], out


#: Other Kubernetes module pins in the repo, and why they need not follow the kubelet lines.
EXPLAINED = {
    # tests/chart/decode: a strict decoder of the chart's rendered objects, built on the
    # API types (k8s.io/api, apimachinery) that its prometheus-operator monitoring module
    # is built against. It checks the chart's manifests, never talks to a kubelet.
    "v0.36.2": "tests/chart/decode/go.mod",
    # Not Kubernetes' staging modules, though numbered alike: kind's CLI (the kind e2e's podman path) and
    # scheduler-plugins (the topology-aware scheduler of the multi-node e2e, v0.35.4-devel).
    "v0.33.0": "tests/e2e/kind/kindcli/go.mod",
    "v0.35.4": "tests/e2e/cluster/topo_scheduler/go.mod",
    "v0.25.2": "tests/e2e/cluster/topo_scheduler/go.mod",  # controller-runtime, raised for client-go 1.37
}
#: The module each explained pin is of, as its go.mod names it.
EXPLAINED_MODULE = {"v0.36.2": "k8s.io/api", "v0.33.0": "sigs.k8s.io/kind", "v0.35.4": "sigs.k8s.io/scheduler-plugins",
                    "v0.25.2": "sigs.k8s.io/controller-runtime"}


@pytest.mark.parametrize("version", sorted(EXPLAINED))
def test_other_pins_are_the_explained_ones(version):
    text = (ROOT / EXPLAINED[version]).read_text()
    module = re.escape(EXPLAINED_MODULE[version])
    assert re.search(rf"^\s*{module} {re.escape(version)}(-[\w.]+)?( // indirect)?$", text, re.M), (version, module)


DOCS = ["README.md", "tests/kubelet/README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS)
def test_docs_name_only_the_pinned_versions(doc):
    text = (ROOT / doc).read_text()
    raw = json.loads(kubelet_build.VERSIONS_FILE.read_text())
    pinned = {ln.kubernetes for ln in LINES.values()}
    refused = {v for entry in raw.values() for v in entry.get("refused", {})}
    staging = {ln.staging for ln in LINES.values()}
    stray = {m[0] for m in K8S_RE.finditer(text)} - pinned - refused
    stray |= {m[0] for m in STAGING_RE.finditer(text)} - staging - set(EXPLAINED)
    assert not stray, f"{doc} names {sorted(stray)}; k8s_versions.json pins {sorted(pinned | staging)}"


def test_kubelet_readme_names_both_lines():
    text = (ROOT / "tests" / "kubelet" / "README.md").read_text()
    for line in LINES.values():
        assert line.kubernetes in text and line.staging in text, line


def test_the_code_names_no_other_version():
    """Test code and scripts take versions from k8s_versions.json too."""
    files = [*(ROOT / "tests" / "kubelet").glob("*.py"), *(ROOT / "tests" / "e2e").glob("*.py"),
             *(ROOT / "scripts").glob("*.sh"), ROOT / ".ci" / "run",
             *(ROOT / "tests" / "kubelet" / "harness" / "cmd" / "harness").glob("*.go")]
    named = {f.relative_to(ROOT).as_posix(): sorted({m[0] for m in K8S_RE.finditer(f.read_text())})
             for f in files if f.name != "test_k8s_versions.py"}
    assert not {f: v for f, v in named.items() if v}


def test_the_cluster_control_plane_is_built_from_the_current_line():
    """The local cluster's etcd/apiserver/scheduler/controller-manager come from their own go.mod
    (tests/e2e/cluster/controlplane): it must pin the same release as the kubelet they run with."""
    cur = LINES["current"]
    gomod = ROOT / "tests" / "e2e" / "cluster" / "controlplane" / "go.mod"
    text = gomod.read_text()
    assert re.search(rf"^\s*k8s\.io/kubernetes {re.escape(cur.kubernetes)}\b", text, re.M), \
        f"{gomod} does not require k8s.io/kubernetes {cur.kubernetes}"
    staging = dict(re.findall(r"^\s*(k8s\.io/[\w.-]+) => k8s\.io/[\w.-]+ (v[\w.+-]+)$", text, re.M))
    assert staging and all(v == cur.staging for v in staging.values()), \
        f"{gomod}: staging replaces not at {cur.staging}: {staging}"
