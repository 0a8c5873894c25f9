"""Read what `nvidia-smi topo -m` printed on a real machine.

Why: this is how users bring their own node in ("what would the plugin
allocate on my DGX?"), so the reader accepts what real drivers print across
a decade of versions: tabs or runs of spaces, ANSI colour codes, `SOC` for
`SYS`, `mlx5_N` NIC columns or `NIC<j>` with a `NIC Legend:`, an optional
`NUMA Affinity` and `GPU NUMA ID`, and empty affinity cells (captured inside
a cgroup). Rules: `shared/spec/topology-input.md`.

It never guesses: the `CPU Affinity` / `NUMA Affinity` / `GPU NUMA ID`
headings are recognised however they are spaced, every header column must
have its row, and every row must have one cell per header column. Drivers
pad the affinity values with empty cells to reach the next tab stop, and not
all the same way (`0-7\t\t0` on older drivers, `0-7\t0\t\tN/A` on newer
ones); an empty cell right after an affinity value is read as that padding
(see `_Shape._trailing`). Text whose tabs the terminal expanded into spaces
is cut back into cells at the tab stops, so it reads exactly as the tabbed
original, empty cells included. A row that does not fit stops the load with
the file, the line and the fix, rather than shifting an affinity into the
NUMA column.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from itertools import combinations

from allocator.topology import Device, DeviceKind, Link, LinkLevel, NodeTopology

from ...errors import shorten
from ..errors import TopologyError

log = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_COL = re.compile(r"^GPU(\d+)$")
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_GPU_NUMA_ID = "GPU NUMA ID"
_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_NUMA_FIRST = re.compile(r"^\s*(\d+)")
#: What a value of each trailing column may look like (empty: captured inside a cgroup).
_TRAILING_VALUE = re.compile(r"^(N/A|[0-9][0-9,\-]*)?$", re.IGNORECASE)
_ROW_FIX = ("give every row one cell per header column, as `nvidia-smi topo -m` prints it "
            "(paste its output unchanged; write N/A for an unknown value)")


@dataclass
class _Row:
    label: str
    line: int
    cells: list[str]
    #: The values of the trailing columns, by heading ("" when empty).
    values: dict[str, str]


def _header_columns(line: str) -> list[str]:
    """The header's column names; the multi-word headings are joined however they are spaced."""
    words = line.split()
    out: list[str] = []
    i = 0
    while i < len(words):
        for heading in _TRAILING:
            parts = heading.lower().split()
            if [w.lower() for w in words[i:i + len(parts)]] == parts:
                out.append(heading)
                i += len(parts)
                break
        else:
            out.append(words[i])
            i += 1
    return out


_TAB_STOP = 8
_TOKEN = re.compile(r"\S+")


def _split_row(line: str) -> list[str]:
    """The cells of a row, empty ones included.

    Tabs separate cells. Without tabs, the text is usually what a terminal showed: tabs
    expanded to stops every 8 columns, so a cell starts at a stop (` X ` one column after it)
    and every stop skipped between two values was an empty cell; the line is cut back at the
    stops. Text spaced by hand (a value off the stops) has no empty cells: runs of spaces
    separate cells.
    """
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    tokens = [(m.start(), m.group()) for m in _TOKEN.finditer(line)]
    if not all(start % _TAB_STOP == 0 or (tok == "X" and start % _TAB_STOP == 1) for start, tok in tokens):
        return [tok for _, tok in tokens]
    cells: list[str] = []
    next_stop = 0  # where the tab after the previous cell would have gone
    for start, tok in tokens:
        cells.extend([""] * ((start - next_stop) // _TAB_STOP))
        cells.append(tok)
        next_stop = (start + len(tok)) // _TAB_STOP * _TAB_STOP + _TAB_STOP
    if tokens and len(line) >= next_stop:  # trailing tabs, as in NIC rows that end with empty cells
        cells.extend([""] * ((len(line) - next_stop) // _TAB_STOP + 1))
    return cells


def has_header_row(text: str) -> bool:
    """Whether TEXT holds an `nvidia-smi topo -m` header row: what makes a file a capture."""
    lines = [_ANSI.sub("", raw).rstrip("\r\n") for raw in text.splitlines()]
    try:
        _find_header(lines, "<text>")
    except TopologyError:
        return False
    return True


def _find_header(lines: list[str], source: str) -> int:
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#"):
            continue
        cols = _header_columns(line)
        if cols and _GPU_COL.match(cols[0]) and not line[:1].isalnum():
            return i
        if cols and cols[0] == "GPU0" and len(cols) > 1 and cols[1] in ("GPU1", *_TRAILING):
            return i
    raise TopologyError(
        source,
        "no `nvidia-smi topo -m` header row (a line naming GPU0 GPU1 ... CPU Affinity) found",
        fix="paste the whole output of `nvidia-smi topo -m`, header row included",
    )


def _check_header(header: list[str], source: str, line: int) -> tuple[list[str], list[str]]:
    """(link columns, trailing columns) of the header row."""
    start = next((i for i, c in enumerate(header) if c in _TRAILING), len(header))
    matrix_cols, trailing = header[:start], header[start:]
    for c in trailing:
        if c not in _TRAILING:
            raise TopologyError(source, f"unexpected header column {shorten(c)} after the link columns", line=line,
                                fix=f"only {', '.join(_TRAILING)} may follow the device columns")
    if not matrix_cols or not _GPU_COL.match(matrix_cols[0]):
        raise TopologyError(source, "the first header column must be GPU0", line=line)
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise TopologyError(source, f"the header names {', '.join(dup)} twice", line=line,
                            fix="paste the header row of `nvidia-smi topo -m` unchanged")
    return matrix_cols, trailing


def parse_topo_matrix(text: str, source: str = "<text>", node_name: str | None = None) -> ParsedMatrix:
    """Parse the text; raise TopologyError naming line, row, column and token on bad input."""
    lines = [_ANSI.sub("", raw).rstrip("\r\n") for raw in text.splitlines()]
    header_idx = _find_header(lines, source)
    matrix_cols, trailing = _check_header(_header_columns(lines[header_idx]), source, header_idx + 1)
    shape = _Shape(source, matrix_cols, trailing)
    rows: dict[str, _Row] = {}
    legend: dict[str, str] = {}
    in_nic_legend = False
    for i in range(header_idx + 1, len(lines)):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("NIC Legend"):
            in_nic_legend = True
            continue
        if in_nic_legend:
            m = _LEGEND_ENTRY.match(line)
            if m:
                legend[m.group(1)] = m.group(2)
            continue
        cells = _split_row(line)
        if not cells or cells[0] not in matrix_cols:
            continue  # legend lines and other text are ignored
        if cells[0] in rows:
            raise TopologyError(source, f"row {cells[0]} appears twice", line=i + 1)
        rows[cells[0]] = shape.row(cells[0], i + 1, cells[1:])
    for c in matrix_cols:
        if c not in rows:
            raise TopologyError(source, f"the header names {c} but there is no {c} row", line=header_idx + 1,
                                fix=f"paste every row of the matrix; after the device columns the header may only "
                                    f"name {', '.join(_TRAILING)}")
    return ParsedMatrix(source, matrix_cols, trailing, rows, legend, node_name)


@dataclass(frozen=True)
class _Shape:
    """The header's columns; checks each row against them."""

    source: str
    columns: list[str]
    trailing: list[str]

    def _width_error(self, label: str, line: int, got: int, need: str) -> TopologyError:
        cols = f"{len(self.columns)} link columns" + (f", then {', '.join(self.trailing)}" if self.trailing else "")
        return TopologyError(self.source, f"row {label} has {got} cells but the header names {need} ({cols})",
                             line=line, fix=_ROW_FIX)

    def _trailing(self, extra: list[str]) -> list[str] | None:
        """The trailing column values in `extra`, or None when the cells cannot be them.

        Why: drivers pad an affinity value with an empty cell to reach the tab stop under the
        next heading (every heading is wider than one stop), older ones after `CPU Affinity`,
        newer ones after `NUMA Affinity`. So after each value but the last, one empty cell may
        be padding; a non-empty cell there means the row has a cell too many. Which empty
        cells are padding never changes the values: with at most three headings, two readings
        of one row differ only in which of two adjacent empty cells is the padding.
        """
        k = len(self.trailing)
        pads = len(extra) - k
        if not 0 <= pads <= max(k - 1, 0):
            return None
        for gaps in combinations(range(k - 1), pads):
            values, i = [], 0
            for j in range(k):
                values.append(extra[i])
                i += 1
                if j in gaps:
                    if extra[i]:
                        break
                    i += 1
            else:
                return values
        return None

    def row(self, label: str, line: int, body: list[str]) -> _Row:
        n, k = len(self.columns), len(self.trailing)
        if len(body) < n:
            raise TopologyError(self.source, f"row {label} has {len(body)} cells but the header names {n} link "
                                             "columns", line=line, fix=_ROW_FIX)
        extra = body[n:]
        is_gpu = bool(_GPU_COL.match(label))
        values = self._trailing(extra)
        if values is None and not is_gpu and len(extra) < k:
            values = extra  # NIC rows may stop before the trailing columns: they have no values there
        if values is None:
            raise self._width_error(label, line, len(body), f"{n + k} columns")
        named = dict(zip(self.trailing, values))
        if is_gpu:
            for name, value in named.items():
                if not _TRAILING_VALUE.match(value):
                    raise TopologyError(self.source, f"row {label}, column {name}: cannot read {shorten(value)}",
                                        line=line, fix="use a CPU or node list such as 0 or 0,5-11, or N/A; "
                                                       "and check that the row has no extra cell")
        return _Row(label, line, body[:n], {name: named.get(name, "") for name in self.trailing})


@dataclass
class ParsedMatrix:
    """The parsed text, before it becomes a NodeTopology."""

    source: str
    columns: list[str]
    trailing: list[str]
    rows: dict[str, _Row]
    legend: dict[str, str]
    node_name: str | None

    @property
    def gpu_columns(self) -> list[str]:
        return [c for c in self.columns if _GPU_COL.match(c)]

    def to_topology(self) -> NodeTopology:
        links = self._symmetric(self._parse_links())
        numa = self._gpu_numa()
        devices = self._gpus(numa) + self._nics(links, numa)
        rename = {c: self.legend.get(c, c) for c in self.columns if not _GPU_COL.match(c)}
        named = {(rename.get(a, a), rename.get(b, b)): link for (a, b), link in links.items()}
        return NodeTopology.build(devices, named, source=self.node_name or self.source)

    def _parse_links(self) -> dict[tuple[str, str], Link]:
        """Every cell of every row; `X` on the diagonal, a link token elsewhere (NIC rows may leave cells empty)."""
        gpu_cols = self.gpu_columns
        parsed: dict[tuple[str, str], Link] = {}
        for label, row in self.rows.items():
            for col, tok in zip(self.columns, row.cells):
                if col == label:
                    if tok.upper() != "X":
                        raise TopologyError(self.source, f"row {label}, column {col}: expected X on the diagonal, "
                                                         f"got {shorten(tok)}", line=row.line)
                    continue
                if not tok and label not in gpu_cols:
                    continue
                try:
                    parsed[(label, col)] = Link.parse(tok)
                except ValueError:
                    if _TRAILING_VALUE.match(tok):  # a CPU list among the links: the row lost a link cell
                        raise TopologyError(self.source, f"row {label}, column {col}: unknown link token "
                                                         f"{shorten(tok)}, a CPU or node list: the row has a link "
                                                         "cell too few", line=row.line, fix=_ROW_FIX) from None
                    raise TopologyError(self.source, f"row {label}, column {col}: unknown link token {shorten(tok)}",
                                        line=row.line, fix="use X, NV<n>, PIX, PXB, PHB, NODE, SYS or SOC") from None
        return parsed

    def _symmetric(self, parsed: dict[tuple[str, str], Link]) -> dict[tuple[str, str], Link]:
        """An asymmetric pair keeps the higher weight, with a warning naming both ends."""
        links: dict[tuple[str, str], Link] = {}
        for (a, b), link in parsed.items():
            back = parsed.get((b, a))
            if back is not None and back != link:
                if a < b:
                    log.warning("asymmetric link in topology matrix",
                                extra={"source": self.source, "pair": f"{a}-{b}", "a_to_b": link.label,
                                       "b_to_a": back.label})
                link = max(link, back, key=lambda x: x.weight)
            links[(a, b)] = link
        return links

    def _gpu_numa(self) -> dict[str, int | None]:
        """First node of `NUMA Affinity`; without the column, groups of equal `CPU Affinity` in order."""
        numa: dict[str, int | None] = {}
        if "NUMA Affinity" in self.trailing:
            for g in self.gpu_columns:
                m = _NUMA_FIRST.match(self.rows[g].values["NUMA Affinity"])
                numa[g] = int(m.group(1)) if m else None
            return numa
        order: dict[str, int] = {}
        for g in self.gpu_columns:
            aff = self.rows[g].values.get("CPU Affinity", "")
            numa[g] = None if not aff or aff.upper() == "N/A" else order.setdefault(aff, len(order))
        return numa

    def _gpus(self, numa: dict[str, int | None]) -> list[Device]:
        devices = []
        for g in self.gpu_columns:
            values = self.rows[g].values
            attrs = {}
            if values.get("CPU Affinity"):
                attrs["cpu_affinity"] = values["CPU Affinity"]
            gnid = values.get(_GPU_NUMA_ID, "")
            if gnid and gnid.upper() != "N/A":
                attrs["gpu_numa_id"] = gnid
            col = _GPU_COL.match(g)
            assert col is not None, g  # gpu_columns are the header's columns that this pattern matched
            devices.append(Device(name=g, kind=DeviceKind.GPU, index=int(col.group(1)),
                                  numa=numa[g], attributes=attrs))
        return devices

    def _nics(self, links: dict[tuple[str, str], Link], numa: dict[str, int | None]) -> list[Device]:
        """NICs, named by the legend (NIC0 -> mlx5_2) or their column. Their NUMA node is that of the
        closest GPUs (highest PCIe level short of SYS); one that reaches every GPU through SYS has none."""
        devices = []
        nic_cols = [c for c in self.columns if not _GPU_COL.match(c)]
        for j, c in enumerate(nic_cols):
            reach = [(links.get((c, g)) or links.get((g, c)), g) for g in self.gpu_columns]
            levels = [(lk.level, g) for lk, g in reach if lk is not None and lk.nvlinks == 0 and lk.level > LinkLevel.SYS]
            best = max((lvl for lvl, _ in levels), default=None)
            near = {numa[g] for lvl, g in levels if lvl == best}
            name = self.legend.get(c, c)
            devices.append(Device(name=name, kind=DeviceKind.NIC, index=j, numa=next(iter(near)) if len(near) == 1
                                  else None, port=name, attributes={"column": c} if name != c else {}))
        return devices


def load_topo_matrix(text: str, source: str, node_name: str | None = None) -> NodeTopology:
    return parse_topo_matrix(text, source, node_name).to_topology()
