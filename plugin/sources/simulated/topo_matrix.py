"""Read what `nvidia-smi topo -m` printed on a real machine.

Why: this is how users bring their own node in ("what would the plugin
allocate on my DGX?"), so the reader accepts what real drivers print across
a decade of versions: tabs or runs of spaces, ANSI colour codes, `SOC` for
`SYS`, `mlx5_N` NIC columns or `NIC<j>` with a `NIC Legend:`, an optional
`NUMA Affinity` and `GPU NUMA ID`, and empty affinity cells (captured inside
a cgroup). Rules: `shared/spec/topology-input.md`.

It never guesses: the `CPU Affinity` / `NUMA Affinity` / `GPU NUMA ID`
headings are recognised however they are spaced, every header column must
have its row, and every row must have one cell per header column (the one
driver quirk allowed: an empty extra tab before `GPU NUMA ID`). A row that
does not fit stops the load with the file, the line and the fix, rather than
shifting an affinity into the NUMA column.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

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


def _split_row(line: str) -> tuple[list[str], bool]:
    if "\t" in line:
        return [c.strip() for c in line.split("\t")], True
    return line.split(), False


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
        cells, tabbed = _split_row(line)
        if cells[0] not in matrix_cols:
            continue  # legend lines and other text are ignored
        if cells[0] in rows:
            raise TopologyError(source, f"row {cells[0]} appears twice", line=i + 1)
        rows[cells[0]] = shape.row(cells[0], i + 1, cells[1:], tabbed)
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

    def row(self, label: str, line: int, body: list[str], tabbed: bool) -> _Row:
        n, k = len(self.columns), len(self.trailing)
        if len(body) < n:
            raise TopologyError(self.source, f"row {label} has {len(body)} cells but the header names {n} link "
                                             "columns", line=line, fix=_ROW_FIX)
        extra = body[n:]
        if tabbed and len(extra) == k + 1 and _GPU_NUMA_ID in self.trailing:
            # Drivers print an extra tab before `GPU NUMA ID`: drop that empty cell, nothing else.
            gap = self.trailing.index(_GPU_NUMA_ID)
            if not extra[gap]:
                extra = extra[:gap] + extra[gap + 1:]
        is_gpu = bool(_GPU_COL.match(label))
        if len(extra) > k or (is_gpu and len(extra) < k):
            raise self._width_error(label, line, len(body), f"{n + k} columns")
        values = dict(zip(self.trailing, extra))
        if is_gpu:
            for name, value in values.items():
                if not _TRAILING_VALUE.match(value):
                    raise TopologyError(self.source, f"row {label}, column {name}: cannot read {shorten(value)}",
                                        line=line, fix="use a CPU or node list such as 0 or 0,5-11, or N/A; "
                                                       "and check that the row has no extra cell")
        return _Row(label, line, body[:n], {name: values.get(name, "") for name in self.trailing})


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
                link = max(link, back, key=lambda l: l.weight)
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
            devices.append(Device(name=g, kind=DeviceKind.GPU, index=int(_GPU_COL.match(g).group(1)),
                                  numa=numa[g], attributes=attrs))
        return devices

    def _nics(self, links: dict[tuple[str, str], Link], numa: dict[str, int | None]) -> list[Device]:
        """NICs, named by the legend (NIC0 -> mlx5_2) or their column. Their NUMA node is that of the
        closest GPUs (highest PCIe level short of SYS); one that reaches every GPU through SYS has none."""
        devices = []
        nic_cols = [c for c in self.columns if not _GPU_COL.match(c)]
        for j, c in enumerate(nic_cols):
            reach = [(links.get((c, g)) or links.get((g, c)), g) for g in self.gpu_columns]
            levels = [(l.level, g) for l, g in reach if l is not None and l.nvlinks == 0 and l.level > LinkLevel.SYS]
            best = max((lvl for lvl, _ in levels), default=None)
            near = {numa[g] for lvl, g in levels if lvl == best}
            name = self.legend.get(c, c)
            devices.append(Device(name=name, kind=DeviceKind.NIC, index=j, numa=next(iter(near)) if len(near) == 1
                                  else None, port=name, attributes={"column": c} if name != c else {}))
        return devices


def load_topo_matrix(text: str, source: str, node_name: str | None = None) -> NodeTopology:
    return parse_topo_matrix(text, source, node_name).to_topology()
