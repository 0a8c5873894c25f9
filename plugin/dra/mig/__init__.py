"""MIG through DRA: static MIG devices and partitionable GPUs with shared counters in the slices (`devices.py`),
the instances made at prepare and destroyed at unprepare (`prepare.py`), and the backends that create and destroy
them, through NVML or simulated (`instances.py`, moved from `plugin/sources/`: it changes the GPU, it does not
discover it)."""
