"""Read what `nvidia-smi topo -m` printed on a real machine.

Why: this is how users bring their own node in ("what would the plugin
allocate on my DGX?"), so the reader accepts what real drivers print across
a decade of versions: tabs or runs of spaces, ANSI colour codes, `SOC` for
`SYS`, `mlx5_N` NIC columns or `NIC<j>` with a `NIC Legend:`, an optional
`NUMA Affinity` and `GPU NUMA ID`, and empty affinity cells (captured inside
a cgroup). Rules: `shared/spec/topology-input.md`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from allocator.topology import Device, DeviceKind, Link, LinkLevel, NodeTopology

from ..errors import TopologyError

log = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_COL = re.compile(r"^GPU(\d+)$")
_TRAILING = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_NUMA_FIRST = re.compile(r"^\s*(\d+)")


@dataclass
class _Row:
    label: str
    line: int
    cells: list[str]
    extra: list[str] = field(default_factory=list)
    tabbed: bool = False


def _split_header(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"\t| {2,}", line) if c.strip()]


def _split_row(line: str) -> tuple[list[str], bool]:
    if "\t" in line:
        return [c.strip() for c in line.split("\t")], True
    return line.split(), False


def parse_topo_matrix(text: str, source: str = "<text>", node_name: str | None = None) -> ParsedMatrix:
    """Parse the text; raise TopologyError naming line, row, column and token on bad input."""
    lines = [_ANSI.sub("", raw).rstrip("\r\n") for raw in text.splitlines()]
    header_idx = None
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#"):
            continue
        cols = _split_header(line)
        if cols and _GPU_COL.match(cols[0]) and not line[:1].isalnum():
            header_idx = i
            break
        if cols and cols[0] == "GPU0" and len(cols) > 1 and cols[1] in ("GPU1", *_TRAILING):
            header_idx = i
            break
    if header_idx is None:
        raise TopologyError(
            source,
            "no `nvidia-smi topo -m` header row (a line naming GPU0 GPU1 ... CPU Affinity) found",
            fix="paste the whole output of `nvidia-smi topo -m`, header row included",
        )
    header = _split_header(lines[header_idx])
    trailing_start = next((i for i, c in enumerate(header) if c in _TRAILING), len(header))
    matrix_cols = header[:trailing_start]
    trailing_cols = header[trailing_start:]
    for c in trailing_cols:
        if c not in _TRAILING:
            raise TopologyError(
                source, f"unexpected header column {c!r} after the link columns", line=header_idx + 1
            )
    if not matrix_cols or not _GPU_COL.match(matrix_cols[0]):
        raise TopologyError(source, "the first header column must be GPU0", line=header_idx + 1)

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
        label = cells[0]
        if label not in matrix_cols:
            continue  # legend lines and other text are ignored
        if label in rows:
            raise TopologyError(source, f"row {label} appears twice", line=i + 1)
        body = cells[1:]
        if len(body) < len(matrix_cols):
            raise TopologyError(
                source,
                f"row {label} has {len(body)} cells but the header names {len(matrix_cols)} link columns",
                line=i + 1,
            )
        rows[label] = _Row(label, i + 1, body[: len(matrix_cols)], body[len(matrix_cols) :], tabbed)

    gpu_cols = [c for c in matrix_cols if _GPU_COL.match(c)]
    for g in gpu_cols:
        if g not in rows:
            raise TopologyError(source, f"the header names {g} but there is no {g} row")
    return ParsedMatrix(source, matrix_cols, trailing_cols, rows, legend, node_name)


@dataclass
class ParsedMatrix:
    """The parsed text, before it becomes a NodeTopology."""

    source: str
    columns: list[str]
    trailing: list[str]
    rows: dict[str, _Row]
    legend: dict[str, str]
    node_name: str | None

    def _trailing_values(self, row: _Row) -> dict[str, str]:
        vals = [v.strip() for v in row.extra]
        out: dict[str, str] = {}
        if row.tabbed:
            # Drivers print an extra tab before `GPU NUMA ID`; empty cells are real
            # (affinity captured in a cgroup), so map positionally and take the
            # GPU NUMA ID from the last non-empty cell after NUMA Affinity.
            for k, name in enumerate(self.trailing):
                if name == "GPU NUMA ID":
                    rest = [v for v in vals[k:] if v]
                    out[name] = rest[-1] if rest else ""
                else:
                    out[name] = vals[k] if k < len(vals) else ""
        else:
            for k, name in enumerate(self.trailing):
                out[name] = vals[k] if k < len(vals) else ""
        return out

    def to_topology(self) -> NodeTopology:
        gpu_cols = [c for c in self.columns if _GPU_COL.match(c)]
        nic_cols = [c for c in self.columns if not _GPU_COL.match(c)]

        # Links: parse every cell of every row; the matrix must be symmetric.
        parsed: dict[tuple[str, str], tuple[Link, int]] = {}
        for label, row in self.rows.items():
            for col, tok in zip(self.columns, row.cells):
                if col == label:
                    if tok.upper() != "X":
                        raise TopologyError(
                            self.source, f"row {label}, column {col}: expected X on the diagonal, got {tok!r}",
                            line=row.line,
                        )
                    continue
                if not tok and label not in gpu_cols:
                    continue
                try:
                    link = Link.parse(tok)
                except ValueError:
                    raise TopologyError(
                        self.source,
                        f"row {label}, column {col}: unknown link token {tok!r}",
                        line=row.line,
                        fix="use X, NV<n>, PIX, PXB, PHB, NODE, SYS or SOC",
                    ) from None
                parsed[(label, col)] = (link, row.line)
        links: dict[tuple[str, str], Link] = {}
        for (a, b), (link, _line) in parsed.items():
            back = parsed.get((b, a))
            if back is not None and back[0] != link:
                if a < b:
                    log.warning(
                        "asymmetric link in topology matrix",
                        extra={"source": self.source, "pair": f"{a}-{b}", "a_to_b": link.label,
                               "b_to_a": back[0].label},
                    )
                link = max(link, back[0], key=lambda l: l.weight)
            links[(a, b)] = link

        # NUMA of GPUs.
        values = {g: self._trailing_values(self.rows[g]) for g in gpu_cols}
        numa: dict[str, int | None] = {}
        if "NUMA Affinity" in self.trailing:
            for g in gpu_cols:
                v = values[g].get("NUMA Affinity", "")
                m = _NUMA_FIRST.match(v)
                if v and v.upper() != "N/A" and not m:
                    raise TopologyError(
                        self.source, f"row {g}, column NUMA Affinity: cannot read {v!r}",
                        line=self.rows[g].line, fix="use a node list such as 0 or 0,5-11, or N/A",
                    )
                numa[g] = int(m.group(1)) if m else None
        else:
            order: dict[str, int] = {}
            for g in gpu_cols:
                aff = values[g].get("CPU Affinity", "")
                if not aff or aff.upper() == "N/A":
                    numa[g] = None
                    continue
                numa[g] = order.setdefault(aff, len(order))

        devices: list[Device] = []
        for i, g in enumerate(gpu_cols):
            attrs = {}
            cpu = values[g].get("CPU Affinity", "")
            if cpu:
                attrs["cpu_affinity"] = cpu
            gnid = values[g].get("GPU NUMA ID", "")
            if gnid and gnid.upper() != "N/A":
                attrs["gpu_numa_id"] = gnid
            devices.append(
                Device(name=g, kind=DeviceKind.GPU, index=int(_GPU_COL.match(g).group(1)),
                       numa=numa[g], attributes=attrs)
            )
        # NICs: named by the legend (NIC0 -> mlx5_2) or by their column; their NUMA
        # node is that of the GPUs they reach without crossing the SMP link.
        rename = {c: self.legend.get(c, c) for c in nic_cols}
        for j, c in enumerate(nic_cols):
            # The closest GPUs (highest PCIe level short of SYS) decide; a NIC
            # that reaches every GPU through the SMP link has no known node.
            reach = [(links.get((c, g)) or links.get((g, c)), g) for g in gpu_cols]
            reach = [(l.level, g) for l, g in reach if l is not None and l.nvlinks == 0 and l.level > LinkLevel.SYS]
            best = max((lvl for lvl, _ in reach), default=None)
            near = {numa[g] for lvl, g in reach if lvl == best}
            nic_numa = next(iter(near)) if len(near) == 1 else None
            name = rename[c]
            devices.append(
                Device(name=name, kind=DeviceKind.NIC, index=j, numa=nic_numa, port=name,
                       attributes={"column": c} if name != c else {})
            )
        named = {(rename.get(a, a), rename.get(b, b)): l for (a, b), l in links.items()}
        return NodeTopology.build(devices, named, source=self.node_name or self.source)


def load_topo_matrix(text: str, source: str, node_name: str | None = None) -> NodeTopology:
    return parse_topo_matrix(text, source, node_name).to_topology()
