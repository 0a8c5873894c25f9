"""MIG profiles and their placements on the GPUs that can be partitioned dynamically (A100, H100, H200).

Why a table of our own: the DRA driver publishes every *possible* MIG placement of a
partitionable GPU (KEP-4815), and the scheduler must see the same placements the GPU will
accept at prepare. On real hardware NVML says which placements exist
(`nvmlDeviceGetGpuInstancePossiblePlacements_v2`); a simulated node and the test double of
NVML have no hardware to ask, so both answer from this table, and a test checks that the NVML
path and the table agree.

What a placement is (NVIDIA's MIG user guide, "Supported MIG Profiles"): an A100/H100 has 8
memory slices and 7 compute slices; a GPU instance occupies `memory_slices` consecutive
memory slices starting at one of its profile's `starts` (NVML's `nvmlGpuInstancePlacement_t`:
start and size), and `compute_slices` compute slices. Two instances conflict when their
memory slices overlap, or when the compute slices would run out. `multiprocessors` is the SM
count of the instance (what CUDA sees).

Only the profiles whose compute instance spans the whole GPU instance are here (one compute
instance per GPU instance, the MIG devices NVIDIA's plugins serve); media-extension profiles
(`+me`, one per GPU) are left out: a counter cannot say "at most one of these" next to the
slice counters without a counter per profile, and nobody asked for them yet.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Memory slices and compute slices of an A100/H100 (NVIDIA: "8 memory slices, 7 compute slices").
MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a GPU model."""

    name: str  # NVIDIA's profile name, `1g.10gb`
    gi_profile: int  # NVML_GPU_INSTANCE_PROFILE_* (a profile *index*, not the ID nvidia-smi prints)
    ci_profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_*
    compute_slices: int
    memory_slices: int
    multiprocessors: int
    starts: tuple[int, ...]  # memory slice where a placement may begin


@dataclass(frozen=True)
class Placement:
    """One possible MIG device of one GPU: a profile at a start slice."""

    profile: MigProfile
    start: int

    @property
    def size(self) -> int:
        return self.profile.memory_slices

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)

    def overlaps(self, other: Placement) -> bool:
        return bool(set(self.slices) & set(other.slices))


@dataclass(frozen=True)
class GpuMigTable:
    """The MIG profiles of one GPU model (80 GB A100 or H100, 141 GB H200)."""

    family: str
    multiprocessors: int  # of the whole GPU
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def by_gi_profile(self, gi_profile: int) -> MigProfile | None:
        return next((p for p in self.profiles if p.gi_profile == gi_profile), None)

    def placements(self) -> list[Placement]:
        """Every possible placement, smallest profiles first, then by start (the slice's device order)."""
        return [Placement(p, s) for p in self.profiles for s in p.starts]

    def memory_mib(self, profile: MigProfile, gpu_memory_mib: int) -> int:
        """The instance's memory: its share of the GPU's memory slices (NVML reports a little less)."""
        return gpu_memory_mib // MEMORY_SLICES * profile.memory_slices


def _profiles(sms: dict[str, int], gb: dict[str, int]) -> tuple[MigProfile, ...]:
    """The profile set of an 8-memory-slice, 7-compute-slice GPU (A100 80GB, H100 80GB, H200 141GB: the same
    slices and placements; the SMs and the memory in the names differ). `gb`: the memory word of each
    size of instance, in slices; `sms`: its multiprocessors."""
    return (
        MigProfile(f"1g.{gb['1']}gb", 0, 0, 1, 1, sms["1g"], (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{gb['2']}gb", 9, 0, 1, 2, sms["1g.2"], (0, 2, 4, 6)),
        MigProfile(f"2g.{gb['2']}gb", 1, 1, 2, 2, sms["2g"], (0, 2, 4)),
        MigProfile(f"3g.{gb['4']}gb", 2, 2, 3, 4, sms["3g"], (0, 4)),
        MigProfile(f"4g.{gb['4']}gb", 3, 3, 4, 4, sms["4g"], (0,)),
        MigProfile(f"7g.{gb['8']}gb", 4, 4, 7, 8, sms["7g"], (0,)),
    )


_80GB = {"1": 10, "2": 20, "4": 40, "8": 80}
A100_80GB = GpuMigTable("A100", 108, _profiles({"1g": 14, "1g.2": 14, "2g": 28, "3g": 42, "4g": 56, "7g": 98}, _80GB))
# 1g.20gb has 26 SMs on GH100 (nvidia-smi mig -lgip on a lent H200, the same chip: tests/nvml/recorded).
H100_80GB = GpuMigTable("H100", 132, _profiles({"1g": 16, "1g.2": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132}, _80GB))
H200_141GB = GpuMigTable("H200", 132, _profiles({"1g": 16, "1g.2": 26, "2g": 32, "3g": 60, "4g": 64, "7g": 132},
                                                {"1": 18, "2": 35, "4": 71, "8": 141}))
#: (table, the GPU memory in MiB NVML reports for it, within these bounds)
TABLES: tuple[tuple[GpuMigTable, int, int], ...] = (
    (A100_80GB, 76_000, 82_000),
    (H100_80GB, 76_000, 82_000),
    (H200_141GB, 139_000, 146_000),  # 143771 MiB on the lent H200
)


def table_for(model: str | None, memory_mib: int | None) -> GpuMigTable | None:
    """The table of a GPU by its NVML name and memory; None for a GPU we have no table for.

    By memory too: the profile names (`1g.10gb`, `1g.18gb`...) carry it, so a 40 GB A100 or a 94 GB
    H100 NVL, whose names differ, gets no table rather than wrong names.
    """
    if not model or not memory_mib:
        return None
    return next((t for t, low, high in TABLES if t.family in model and low <= memory_mib <= high), None)
