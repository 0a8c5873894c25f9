"""The topology source every command reads: a simulated node or the real hardware, with clique labels.

Why here: `serve`, `discover`, `allocate` and the demo all need the same
source from the same settings; building it in one place keeps "which source,
which wrapper" one decision (the composition root's), not one per command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...sources.base import TopologySource
from .settings import SourceSettings

if TYPE_CHECKING:
    from ..node_labels import NodeLabeller


def node_labeller(s: SourceSettings) -> NodeLabeller | None:
    """With --fabric-labels-node: the labeller of this node (its name checked by `plugin.cli.typed`)."""
    if s.label_node is None:
        return None
    from ..node_labels import NodeLabeller  # noqa: PLC0415 (lightkube only with --fabric-labels-node)

    return NodeLabeller(s.label_node)


def build_source(s: SourceSettings) -> TopologySource:
    """The simulated node when --simulate is given, else real hardware (NVML + sysfs)."""
    labeller = node_labeller(s)
    if s.simulate:
        from ...health.options import GpuHealthOptions  # noqa: PLC0415 (only the mode in use loads its source)
        from ...sources.simulated.source import SimulatedSource  # noqa: PLC0415 (as above)

        # The config's `gpus.health` (catalog overrides, quiet period) applies to the simulated driver facts too.
        simulated = SimulatedSource(s.simulate, health=GpuHealthOptions.from_config(s.gpu_health))
        if not (s.fabric_labels_file or labeller):
            return simulated
        from ...sources.fabric_labels import FabricLabelFile  # noqa: PLC0415 (only with fabric labels)
        from ..fabric_labelled import FabricLabelledSource  # noqa: PLC0415 (only with fabric labels)

        file = FabricLabelFile(s.fabric_labels_file) if s.fabric_labels_file else None
        return FabricLabelledSource(simulated, file=file, node=labeller)
    from ...sources.hardware import hardware_source_from_options  # noqa: PLC0415 (real hardware only: NVML, sysfs, udev)

    hardware = hardware_source_from_options(
        sysfs_root=s.sysfs_root, dev_root=s.dev_root, proc_root=s.proc_root,
        fail_on_init_error=s.fail_on_init_error, gpu_health=s.gpu_health,
        nic_link_health=s.nic_link_health, fabric_labels_file=s.fabric_labels_file,
        fabric_recheck_s=s.fabric_recheck_s,
    )
    if labeller is None:
        return hardware
    from ..fabric_labelled import FabricLabelledSource  # noqa: PLC0415 (only with --fabric-labels-node)

    return FabricLabelledSource(hardware, node=labeller)  # the hardware source keeps the file itself
