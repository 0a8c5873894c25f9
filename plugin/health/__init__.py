"""GPU health: NVIDIA's XID catalog as policy, recovery only on the driver's evidence (docs/gpu-discovery.md "Health").

One module per job: `catalog` (the XID → bucket table, data in `xid_catalog.tsv`),
`policy` (pure: an event or the driver's evidence → the required action and the
health the kubelet sees), `evidence` (what NVML says of a GPU: recovery action,
pending repairs, resets, NVLink states; every call optional), `store` (faults
kept across daemon restarts with the node's boot ID, and the operator's clears),
`options` (the config file's `gpus.health`) and `monitor` (the NVML event thread).
"""
