"""A ResourceClaim as the driver reads it: parsed once into typed objects (`claim.py`), its opaque configs by
driver and kind (`opaque.py`), GpuConfig (time-slicing) and its application (`gpu_config.py`, `sharing.py`), and
the `status.devices` entries we write back (`status.py`); what a prepared claim leaves for the kubelet side and
the pod network, which both stand on this package (`prepared.py`)."""
