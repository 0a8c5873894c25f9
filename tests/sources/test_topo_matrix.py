"""Reading `nvidia-smi topo -m` text: every shared machine, and precise errors on bad input."""

from __future__ import annotations

import logging
import pathlib

import pytest

from allocator.topology import DeviceKind
from plugin.sources import TopologyError, load_topology
from plugin.sources.simulated import load_topo_matrix


def test_every_shared_topology_loads(shared_topologies):
    for path in shared_topologies:
        topo = load_topology(str(path))
        assert topo.gpus, path.name
        # the matrix is complete and symmetric for every GPU pair
        for a in topo.gpus:
            for b in topo.gpus:
                if a.name != b.name:
                    assert topo.link(a.name, b.name) == topo.link(b.name, a.name)


def by_name(topo):
    return {d.name: d for d in topo.devices}


def test_nic_legend_names_nics_and_gpu_numa_id_is_kept(shared_topologies):
    hgx = load_topology(next(str(p) for p in shared_topologies if p.name.startswith("02-")))
    assert [d.name for d in hgx.nics][:3] == ["mlx5_2", "mlx5_3", "mlx5_4"]
    assert hgx.link("GPU0", "mlx5_2").label == "PXB" and hgx.link("GPU0", "GPU7").label == "NV12"
    assert by_name(hgx)["mlx5_bond_0"].numa is None  # SYS to every GPU: unknown NUMA
    gh = load_topology(next(str(p) for p in shared_topologies if p.name.startswith("11-")))
    assert [d.attributes.get("gpu_numa_id") for d in gh.gpus] == ["4", "12", "20", "28"]
    assert [d.numa for d in gh.gpus] == [0, 1, 2, 3]


def test_old_driver_soc_and_ansi_codes(shared_topologies):
    k80 = load_topology(next(str(p) for p in shared_topologies if p.name.startswith("23-")))
    assert k80.link("GPU0", "GPU1").label == "PIX" and k80.link("GPU0", "GPU2").label == "PHB"
    a6000 = load_topology(next(str(p) for p in shared_topologies if p.name.startswith("07-")))
    assert a6000.link("GPU0", "GPU1").label == "NV4" and a6000.link("GPU1", "GPU2").label == "NODE"


def test_empty_cpu_affinity_inside_cgroup(shared_topologies):
    h100 = load_topology(next(str(p) for p in shared_topologies if p.name.startswith("14-")))
    assert [d.numa for d in h100.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    # NICs take the NUMA node of the GPU they reach through one PCIe switch
    assert by_name(h100)["mlx5_0"].numa == 0 and by_name(h100)["mlx5_5"].numa == 1


SMALL = """\
\tGPU0\tGPU1\tmlx5_0\tCPU Affinity
GPU0\t X \tNV2\tPIX\t0-7
GPU1\tNV2\t X \tSYS\t8-15
mlx5_0\tPIX\tSYS\t X \t
"""


def test_soc_equals_sys_and_cpu_affinity_groups_numa():
    topo = load_topo_matrix(SMALL.replace("SYS\t8-15", "SOC\t8-15"), "small.txt")
    assert topo.link("GPU1", "mlx5_0").label == "SYS"
    assert [d.numa for d in topo.gpus] == [0, 1]
    assert [d.kind for d in topo.devices] == [DeviceKind.GPU, DeviceKind.GPU, DeviceKind.NIC]


def test_unknown_token_names_file_line_row_column_and_token():
    with pytest.raises(TopologyError) as e:
        load_topo_matrix(SMALL.replace("NV2\t X", "NVX\t X"), "my-node.txt")
    msg = str(e.value)
    assert msg.startswith("my-node.txt:3:")
    assert "row GPU1, column GPU0" in msg and "'NVX'" in msg


def test_missing_header_and_short_row_are_errors():
    with pytest.raises(TopologyError, match="no `nvidia-smi topo -m` header"):
        load_topo_matrix("hello\nworld\n", "x.txt")
    with pytest.raises(TopologyError, match=r"x.txt:2: row GPU0 has 1 cells"):
        load_topo_matrix("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X\n", "x.txt")


def test_asymmetric_pair_keeps_higher_weight_and_warns(caplog):
    text = SMALL.replace("GPU1\tNV2\t X", "GPU1\tPIX\t X")
    with caplog.at_level(logging.WARNING):
        topo = load_topo_matrix(text, "asym.txt")
    assert topo.link("GPU0", "GPU1").label == "NV2"
    warning = [r for r in caplog.records if "asymmetric" in r.getMessage()]
    assert warning and warning[0].pair == "GPU0-GPU1"


# -- headings however they are spaced, and rows checked against the header (never guessed) ----------
SPACED = """\
        GPU0    GPU1    mlx5_0  mlx5_1 CPU Affinity NUMA Affinity
GPU0     X      NV2     PIX     SYS     0-7     0
GPU1    NV2      X      SYS     PIX     8-15    1
mlx5_0  PIX     SYS      X      SYS
mlx5_1  SYS     PIX     SYS      X
"""


@pytest.mark.parametrize("header", [
    "        GPU0    GPU1    mlx5_0  mlx5_1 CPU Affinity NUMA Affinity",
    "        GPU0    GPU1    mlx5_0  mlx5_1  CPU  Affinity   NUMA   Affinity",
    "\tGPU0\tGPU1\tmlx5_0\tmlx5_1\tCPU Affinity NUMA Affinity",
])
def test_affinity_headings_are_recognised_however_spaced(header):
    topo = load_topo_matrix(header + "\n" + SPACED.split("\n", 1)[1], "spaced.txt")
    assert [d.name for d in topo.nics] == ["mlx5_0", "mlx5_1"]
    assert [d.numa for d in topo.gpus] == [0, 1]
    assert [d.attributes["cpu_affinity"] for d in topo.gpus] == ["0-7", "8-15"]


@pytest.mark.parametrize("row", [
    "GPU1    NV2      X      SYS     PIX     PIX     32-63   1",  # one link cell too many
    "GPU1    NV2      X      SYS     PIX     8-15    1     7",      # one trailing cell too many
    "GPU1    NV2      X      SYS     PIX     8-15",                 # NUMA Affinity missing
])
def test_a_row_that_does_not_fit_the_header_names_file_line_and_fix(row):
    text = SPACED.replace("GPU1    NV2      X      SYS     PIX     8-15    1", row)
    with pytest.raises(TopologyError) as e:
        load_topo_matrix(text, "node.txt")
    msg = str(e.value)
    assert msg.startswith("node.txt:3: row GPU1 has") and "the header names 6 columns" in msg
    assert "(fix: " in msg


def test_a_shifted_affinity_is_not_read_as_a_numa_node():
    tabbed = SMALL.replace("GPU1\tNV2\t X \tSYS\t8-15", "GPU1\tNV2\t X \tSYS\tSYS\t8-15")
    with pytest.raises(TopologyError, match=r"small.txt:3: row GPU1 has 5 cells"):
        load_topo_matrix(tabbed, "small.txt")
    junk = SMALL.replace("SYS\t8-15", "SYS\tPIX")
    with pytest.raises(TopologyError, match=r"small.txt:3: row GPU1, column CPU Affinity: cannot read 'PIX'"):
        load_topo_matrix(junk, "small.txt")


def test_a_misspelled_heading_is_an_error_not_a_nic():
    text = SPACED.replace("CPU Affinity", "CPU Afinity")  # must not become NICs called CPU and Afinity
    with pytest.raises(TopologyError, match=r"node.txt:2: row GPU0 has 6 cells but the header names 7 columns"):
        load_topo_matrix(text, "node.txt")
    no_nic_row = SPACED.replace("mlx5_1  SYS     PIX     SYS      X\n", "")
    with pytest.raises(TopologyError, match=r"node.txt:1: the header names mlx5_1 but there is no mlx5_1 row"):
        load_topo_matrix(no_nic_row, "node.txt")


def test_a_misfit_row_stops_discover_with_exit_2(tmp_path):
    from click.testing import CliRunner

    from plugin.cli import cli

    path = tmp_path / "node.txt"
    path.write_text(SPACED.replace("8-15    1", "PIX    8-15    1"))
    r = CliRunner().invoke(cli, ["discover", "--simulate", str(path)])
    assert r.exit_code == 2 and f"{path}:3: row GPU1" in r.output and "fix:" in r.output


# -- outputs whose drivers pad the affinity values to tab stops (issue 18) -----------------------------
OUTPUTS = pathlib.Path(__file__).parent / "topo_outputs"


def _older_driver() -> str:
    return (OUTPUTS / "older-driver-4gpu-tab-aligned.txt").read_text()


@pytest.mark.parametrize("expand", [False, True], ids=["tabs", "as-the-terminal-showed-it"])
def test_an_older_driver_that_pads_cpu_affinity_to_a_tab_stop_reads_by_column(expand):
    text = _older_driver()
    topo = load_topo_matrix(text.expandtabs() if expand else text, "vm.txt")
    assert [d.numa for d in topo.gpus] == [0, 0, 1, 1]
    assert [d.attributes["cpu_affinity"] for d in topo.gpus] == ["0-11", "0-11", "12-23", "12-23"]
    assert topo.link("GPU0", "GPU1").label == "NV2" and topo.link("GPU1", "GPU2").label == "SYS"
    assert by_name(topo)["mlx5_0"].numa == 0


@pytest.mark.parametrize("expand", [False, True], ids=["tabs", "as-the-terminal-showed-it"])
def test_padding_after_both_affinities_and_before_gpu_numa_id(expand):
    text = (OUTPUTS / "padded-2gpu-gpu-numa-id.txt").read_text()
    topo = load_topo_matrix(text.expandtabs() if expand else text, "vm.txt")
    assert [d.numa for d in topo.gpus] == [0, 1]
    assert [d.attributes["cpu_affinity"] for d in topo.gpus] == ["0-3", "4-7"]
    assert all("gpu_numa_id" not in d.attributes for d in topo.gpus)


@pytest.mark.parametrize("expand", [False, True], ids=["tabs", "as-the-terminal-showed-it"])
def test_an_empty_cpu_affinity_in_a_padded_row_leaves_the_numa_node_in_its_column(expand):
    text = _older_driver().replace("GPU3\tSYS\tSYS\tNV2\t X \tSYS\t12-23\t\t1", "GPU3\tSYS\tSYS\tNV2\t X \tSYS\t\t\t1")
    topo = load_topo_matrix(text.expandtabs() if expand else text, "vm.txt")
    assert [d.numa for d in topo.gpus] == [0, 0, 1, 1]
    assert "cpu_affinity" not in by_name(topo)["GPU3"].attributes


def test_every_shared_topology_reads_the_same_after_the_terminal_expanded_its_tabs(shared_topologies):
    # What users paste is often what the terminal showed: tabs turned into spaces up to each stop.
    for path in shared_topologies:
        tabbed = load_topology(str(path))
        expanded = load_topo_matrix(path.read_text().expandtabs(), str(path))
        assert [(d.name, d.numa, d.attributes) for d in expanded.devices] == \
               [(d.name, d.numa, d.attributes) for d in tabbed.devices], path.name
        for a in tabbed.devices:
            for b in tabbed.devices:
                if a.name != b.name:
                    assert expanded.link(a.name, b.name) == tabbed.link(a.name, b.name), (path.name, a.name, b.name)


@pytest.mark.parametrize("expand", [False, True], ids=["tabs", "as-the-terminal-showed-it"])
@pytest.mark.parametrize("row, problem", [
    ("GPU1\tNV2\t X \tSYS\tSYS\tSYS\tPIX\t0-11\t\t0", "has 9 cells"),   # one link cell too many
    ("GPU1\tNV2\t X \tSYS\tPIX\t0-11\t\t0", "a link cell too few"),  # one link cell missing
    ("GPU1\tNV2\t X \tSYS\tSYS\tPIX\t0-11\t7\t0", "has 8 cells"),        # a value where the padding goes
    ("GPU1\tNV2\t X \tSYS\tSYS\tPIX\t0-11\t\t\t0", "has 9 cells"),      # more padding than one tab stop
])
def test_a_padded_output_still_refuses_a_row_with_a_cell_too_many_or_too_few(row, problem, expand):
    text = _older_driver().replace("GPU1\tNV2\t X \tSYS\tSYS\tPIX\t0-11\t\t0", row)
    assert row in text
    with pytest.raises(TopologyError) as e:
        load_topo_matrix(text.expandtabs() if expand else text, "vm.txt")
    msg = str(e.value)
    assert msg.startswith("vm.txt:11: row GPU1") and problem in msg
    assert "(fix: give every row one cell per header column" in msg
