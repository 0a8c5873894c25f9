"""The docs a newcomer reads must be true today: a doc that drifts from the code fails CI.

Checked in README.md, docs/*.md and charts/topo-device-plugin/README.md:

- every fenced code block is closed. A fence with an info string (```yaml) met inside an open
  block means the block above was never closed (the rest of the page would render as code);
- no placeholder text: TODO/TBD/FIXME/XXX in prose, or a lone UPPER_SNAKE word on a line
  (`STAGE_TABLE`);
- every relative link (and its `#anchor`) points at a file (and heading) that exists;
- every repository path the text names (`plugin/config/nvidia.py`, `docs/*.md`, ...) exists.
  `shared/...` is named too: those design notes are not in the repository, so naming them is an
  error;
- every **runnable** command block runs and exits as the doc says.

The runnable convention (README.md says it too, under "Documentation"):

    ```sh runnable
    topo-device-plugin allocate --simulate dgx-1-v100 --size 2
    topo-device-plugin explain ... --fail-on-reject     # exits 1: the pod is rejected
    ```

- the info string's first word is the language (`sh`), and the word `runnable` marks the block;
- each line is one command (a trailing `\\` joins the next line); blank and comment lines are
  skipped. Each command runs with `bash -c` in the repository root, with the directory of the
  test's Python (the project's `.venv/bin`) first on PATH, so `topo-device-plugin` and `python`
  are the project's;
- a command must exit 0, unless its comment says `exits N`;
- a block marked `output` right after a runnable block (```text output) is what the commands
  print: each of its lines must appear in their stdout, in that order; `...` inside a line matches
  any text, and a line that is only `...` stands for lines left out. stderr must hold no Python
  traceback.

Runnable blocks must stay fast (simulated nodes only: `discover`, `allocate`, `explain`, `demo` with
`--simulate`, about a second each) and must leave nothing behind on the host: no `serve`, no file
written outside a temporary directory.

The committed picture `docs/img/dgx-1-v100.svg` is checked too: its source `.dot` beside it must
equal what `discover --format dot` prints today, and the SVG must draw exactly the nodes and edges
of that source (graphviz keeps each node's and edge's name as its `<title>`), so neither can drift
silently while graphviz itself is not needed in CI.
"""

from __future__ import annotations

import html
import os
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "charts" / "topo-device-plugin" / "README.md",
        ROOT / "benchmarks" / "README.md"]
BIN = pathlib.Path(sys.executable).parent
PICTURE_NODE = "dgx-1-v100"
PICTURE_DOT = ROOT / "docs" / "img" / f"{PICTURE_NODE}.dot"
PICTURE_SVG = ROOT / "docs" / "img" / f"{PICTURE_NODE}.svg"

#: Top-level names whose mention in a doc is a path to check; `shared` is not in the repository.
PATH_ROOTS = ("allocator", "plugin", "tests", "docs", "benchmarks", "scripts", "charts", "proto", "shared")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_PATH = re.compile(r"(?<![\w./~$<{-])(?:\.\./)*(?P<path>(?:" + "|".join(PATH_ROOTS) + r")/[\w.*/-]*)")
_PLACEHOLDER_WORD = re.compile(r"\b(TODO|TBD|FIXME|XXX)\b")
_PLACEHOLDER_LINE = re.compile(r"^\s*[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\s*$")
_EXITS = re.compile(r"#.*\bexits (\d+)\b")
_TRACEBACK = "Traceback (most recent call last)"


@dataclass
class Block:
    """One fenced code block: where it opens, its info string words, its lines."""

    path: pathlib.Path
    line: int
    info: list[str]
    body: list[str] = field(default_factory=list)
    closed: bool = False

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def parse(path: pathlib.Path) -> tuple[list[Block], list[str], list[str]]:
    """Split a Markdown file into its fenced blocks and its prose lines (code blocks blanked).

    Returns (blocks, prose lines, problems). A problem names the file and line.
    """
    blocks: list[Block] = []
    prose: list[str] = []
    problems: list[str] = []
    current: Block | None = None
    marker = ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = _FENCE.match(line)
        if current is None:
            if m and not (m["fence"][0] == "`" and "`" in m["info"]):
                current = Block(path, number, m["info"].split())
                marker = m["fence"]
                blocks.append(current)
            prose.append("" if current else line)
            continue
        prose.append("")
        if m and m["fence"][0] == marker[0] and len(m["fence"]) >= len(marker):
            if not m["info"].strip():
                current.closed = True
                current = None
                continue
            problems.append(f"{current.where}: code block not closed before the fence "
                            f"'{line.strip()}' at line {number} (fix: add a closing {marker})")
            current = Block(path, number, m["info"].split())
            blocks.append(current)
            continue
        current.body.append(line)
    if current is not None:
        problems.append(f"{current.where}: code block not closed at the end of the file (fix: add a closing {marker})")
    return blocks, prose, problems


def fence_problems(path: pathlib.Path) -> list[str]:
    return parse(path)[2]


def _without_code_spans(line: str) -> str:
    return _CODE_SPAN.sub(lambda m: " " * len(m[0]), line)


def placeholder_problems(path: pathlib.Path) -> list[str]:
    """Prose that was meant to be replaced: TODO-like words, or a lone UPPER_SNAKE token."""
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    out = []
    for number, line in enumerate(parse(path)[1], 1):
        if line.lstrip().startswith("<!--"):
            continue
        text = _without_code_spans(line)
        m = _PLACEHOLDER_WORD.search(text)
        if m or _PLACEHOLDER_LINE.match(text):
            out.append(f"{rel}:{number}: placeholder text left in: {line.strip()!r}")
    return out


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in parse(path)[1]:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m[1])
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def link_problems(path: pathlib.Path) -> list[str]:
    """Relative links whose file, or whose #anchor in a Markdown file, does not exist."""
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    out = []
    for number, line in enumerate(parse(path)[1], 1):
        for m in _LINK.finditer(_without_code_spans(line)):
            target = m["target"]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                out.append(f"{rel}:{number}: link to {target} but {file_part} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                out.append(f"{rel}:{number}: link to {target} but {dest.name} has no heading #{anchor}")
    return out


def path_problems(path: pathlib.Path, root: pathlib.Path = ROOT) -> list[str]:
    """Repository paths named anywhere in the file (prose, code spans, code blocks) that do not exist."""
    rel = path.relative_to(root) if path.is_relative_to(root) else path
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for m in _PATH.finditer(line):
            name = m["path"].rstrip(".,:;")
            if "*" in name:
                found = any(root.glob(name))
            else:
                found = (root / name).exists() or (path.parent / m[0].rstrip(".,:;")).exists()
            if name.startswith("shared/"):
                out.append(f"{rel}:{number}: names {name}: the design notes are not in the repository "
                           "(fix: say it in the repo's own docs, e.g. docs/allocation.md)")
            elif not found:
                out.append(f"{rel}:{number}: names {name}, which does not exist in the repository")
    return out


# -- runnable blocks ------------------------------------------------------------------------------
def commands(block: Block) -> list[str]:
    """The block's commands: continuation lines joined, blank and comment-only lines left out."""
    joined = re.sub(r"\\\n\s*", " ", "\n".join(block.body))
    return [c.strip() for c in joined.splitlines() if c.strip() and not c.strip().startswith("#")]


def runnable_blocks(path: pathlib.Path) -> list[tuple[Block, Block | None]]:
    """Each `runnable` block with the `output` block that follows it (or None)."""
    blocks = parse(path)[0]
    out = []
    for i, b in enumerate(blocks):
        if "runnable" in b.info[1:]:
            nxt = blocks[i + 1] if i + 1 < len(blocks) else None
            out.append((b, nxt if nxt is not None and "output" in nxt.info[1:] else None))
    return out


def expected_exit(command: str) -> int:
    m = _EXITS.search(command)
    return int(m[1]) if m else 0


def output_problems(expected: Block, stdout: str) -> list[str]:
    """Each line of the output block must appear in stdout in order; `...` matches any text."""
    lines = [ln.rstrip() for ln in stdout.splitlines()]
    at = 0
    for want in (w.rstrip() for w in expected.body):
        if want.strip() == "...":
            continue
        pattern = re.compile("^" + ".*".join(re.escape(p) for p in want.split("...")) + "$")
        while at < len(lines) and not pattern.match(lines[at]):
            at += 1
        if at == len(lines):
            return [f"{expected.where}: the commands no longer print {want!r} (in this order)"]
        at += 1
    return []


def run_block(block: Block, expected: Block | None, cwd: pathlib.Path = ROOT) -> list[str]:
    """Run the block's commands as the convention says; the problems found (empty: as documented)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    # The reader's shell has no TOPO_DP_* options set; the test session's private CDI directory stays.
    env = {k: v for k, v in env.items() if not k.startswith("TOPO_DP_") or k == "TOPO_DP_CDI_SPEC_DIR"}
    problems = []
    stdout = ""
    cmds = commands(block)
    if not cmds:
        return [f"{block.where}: a runnable block without a command"]
    for command in cmds:
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        stdout += proc.stdout
        want = expected_exit(command)
        if proc.returncode != want:
            problems.append(f"{block.where}: `{command}` exited {proc.returncode}, the doc says {want}\n"
                            f"{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        if _TRACEBACK in proc.stderr or _TRACEBACK in proc.stdout:
            problems.append(f"{block.where}: `{command}` printed a traceback\n{proc.stderr[-3000:]}")
    if expected is not None and not problems:
        problems += output_problems(expected, stdout)
    return problems


# -- the docs of the repository -------------------------------------------------------------------
def _ids(paths: list[pathlib.Path]) -> list[str]:
    return [p.relative_to(ROOT).as_posix() for p in paths]


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_every_code_block_is_closed(doc):
    assert fence_problems(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_no_placeholder_text(doc):
    assert placeholder_problems(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_relative_links_resolve(doc):
    assert link_problems(doc) == []


@pytest.mark.parametrize("doc", DOCS, ids=_ids(DOCS))
def test_named_repository_paths_exist(doc):
    assert path_problems(doc) == []


RUNNABLE = [(b, out) for doc in DOCS for b, out in runnable_blocks(doc)]


def test_the_docs_have_runnable_examples():
    """The README and the allocation doc show the CLI at work; losing their runnable marks loses the check."""
    where = {b.path.name for b, _ in RUNNABLE}
    assert {"README.md", "allocation.md"} <= where, where
    assert any(out is not None for _, out in RUNNABLE), "no runnable block has its output checked"


@pytest.mark.parametrize("block,expected", RUNNABLE, ids=[b.where for b, _ in RUNNABLE])
def test_runnable_block_runs_as_documented(block, expected):
    assert run_block(block, expected) == []


# -- the CLI's legend --------------------------------------------------------------------------------
def _cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "plugin", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("args", [
    ("allocate", "--simulate", "dgx-h100", "--device-id-strategy", "index", "--resource", "topo.dev/nic", "--size", "2",
     "--with", "nvidia.com/gpu=2,6"),
    ("explain", "--simulate", "dgx-a100", "--device-id-strategy", "index", "--policy", "best-effort",
     "--request", "nvidia.com/gpu=4", "--allocated", "0,1,4"),
], ids=["allocate", "explain"])
def test_the_terms_the_cli_prints_are_explained_where_its_legend_points(args):
    """The output names a doc of the repository, and that doc explains every term of the legend."""
    out = _cli(*args)
    [legend] = [ln for ln in out.splitlines() if ln.startswith("Terms: ")]
    doc = re.search(r"\b(docs/[\w-]+\.md)\b", legend)
    assert doc and (ROOT / doc[1]).is_file(), legend
    text = (ROOT / doc[1]).read_text()
    terms = [t.strip() for t in legend.removeprefix("Terms: ").split(" are explained")[0].split(", ")]
    terms = [w for t in terms for w in (("Case A", "Case B") if t.startswith("Case A/B") else (t,))]
    assert len(terms) >= 3 and all(w in out or w.startswith("Case") for w in terms), (terms, out)
    assert [w for w in terms if w not in text] == [], f"{doc[1]} does not explain these terms"


# -- the picture ----------------------------------------------------------------------------------
def dot_graph(dot: str) -> tuple[set[str], set[tuple[str, str]]]:
    nodes = set(re.findall(r'^\s*"([^"]+)" \[shape=', dot, re.M))
    edges = {tuple(sorted(e)) for e in re.findall(r'^\s*"([^"]+)" -- "([^"]+)"', dot, re.M)}
    return nodes, edges


def svg_graph(svg: str) -> tuple[set[str], set[tuple[str, str]]]:
    """Graphviz names each node <g class="node"><title>NAME</title> and each edge NAME--NAME."""
    nodes, edges = set(), set()
    for cls, title in re.findall(r'<g id="\w+" class="(node|edge)">\s*<title>([^<]*)</title>', svg):
        title = html.unescape(title)
        if cls == "node":
            nodes.add(title)
        else:
            edges.add(tuple(sorted(title.split("--"))))
    return nodes, edges


def test_the_committed_picture_is_what_discover_draws_today():
    proc = subprocess.run([sys.executable, "-m", "plugin", "discover", "--simulate", PICTURE_NODE, "--format", "dot"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert PICTURE_DOT.read_text() == proc.stdout, (
        f"{PICTURE_DOT.relative_to(ROOT)} is stale: regenerate it and the SVG with the command in README.md")
    nodes, edges = dot_graph(proc.stdout)
    assert len(nodes) == 12 and edges, "the picture shows the node's 8 GPUs and 4 NICs and their links"
    assert svg_graph(PICTURE_SVG.read_text()) == (nodes, edges), (
        f"{PICTURE_SVG.relative_to(ROOT)} was not rendered from {PICTURE_DOT.name}: render it again")


def test_the_readme_gives_the_command_that_makes_the_picture():
    text = (ROOT / "README.md").read_text()
    assert f"discover --simulate {PICTURE_NODE} --format dot" in text and f"docs/img/{PICTURE_NODE}.svg" in text


# -- the checkers catch what they are for -----------------------------------------------------------
def test_the_benchmark_list_names_every_benchmark():
    listed = set(re.findall(r"^\| `([^`]+)` \|", (ROOT / "benchmarks" / "README.md").read_text(), re.M))
    present = {p.name + ("/" if p.is_dir() else "") for p in (ROOT / "benchmarks").iterdir()
               if (p.suffix == ".py" or p.is_dir()) and not p.name.startswith(("_", "."))}
    assert present <= listed, f"benchmarks/README.md does not list {sorted(present - listed)}"
    assert listed <= present, f"benchmarks/README.md lists missing files {sorted(listed - present)}"


def test_checkers_catch_a_broken_doc(tmp_path):
    """A planted unclosed fence, placeholder, broken link, missing path and failing example are all reported."""
    (tmp_path / "other.md").write_text("# Real heading\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Title\n\n"
        "See [the other](other.md#real-heading), [gone](missing.md), [bad anchor](other.md#nope).\n"
        "The code is in `plugin/no_such_module.py`; the spec in `shared/spec/allocation.md`.\n\n"
        "STAGE_TABLE\n\n"
        "```yaml\nkey: value\n\n"
        "```sh runnable\nfalse\ntrue   # exits 3\n```\n"
    )
    fences = fence_problems(doc)
    assert len(fences) == 1 and "doc.md:8: code block not closed" in fences[0] and "line 11" in fences[0]
    assert [p.split(": ", 1)[1] for p in placeholder_problems(doc)] == ["placeholder text left in: 'STAGE_TABLE'"]
    links = link_problems(doc)
    assert len(links) == 2 and "missing.md does not exist" in links[0] and "no heading #nope" in links[1]
    paths = path_problems(doc, root=ROOT)
    assert len(paths) == 2 and "plugin/no_such_module.py" in paths[0] and "not in the repository" in paths[1]
    [(block, expected)] = runnable_blocks(doc)
    problems = run_block(block, expected, cwd=tmp_path)
    assert len(problems) == 2
    assert "`false` exited 1, the doc says 0" in problems[0] and "exited 0, the doc says 3" in problems[1]


def test_checkers_pass_a_good_doc_and_check_output(tmp_path):
    (tmp_path / "b.md").write_text("## Why the daemon runs as root\n")
    doc = tmp_path / "a.md"
    doc.write_text(
        "Read [b](b.md#why-the-daemon-runs-as-root) and `docs/allocation.md`.\n\n"
        "````md\n```sh\nnested fences are content\n```\n````\n\n"
        "```sh runnable\necho one; echo two two; echo three\nexit 2   # exits 2\n```\n\n"
        "```text output\none\n...\nthree\n```\n"
    )
    assert fence_problems(doc) == placeholder_problems(doc) == link_problems(doc) == path_problems(doc) == []
    [(block, expected)] = runnable_blocks(doc)
    assert run_block(block, expected, cwd=tmp_path) == []
    expected.body = ["three", "one"]
    assert "no longer print 'one'" in run_block(block, expected, cwd=tmp_path)[0]
    expected.body = ["two...two"]
    assert run_block(block, expected, cwd=tmp_path) == []
