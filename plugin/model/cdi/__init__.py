"""CDI specs written by us, as data: the spec model and the builders per resource.

No gRPC, no daemon state and no file writing here: `builders.spec_for_resource` turns a served
`Resource` into a `spec.CdiSpec` and `builders.names_for` gives Allocate its CDI names; the files
are written by `plugin.cdi_files` (the atomic writer and the daemon's sync).
"""

from .builders import CdiOptions, claim_spec, gpu_spec, mig_spec, names_for, nic_spec, spec_for, spec_for_resource
from .spec import CDI_VERSION, DEFAULT_SPEC_DIR, CdiDevice, CdiError, CdiSpec, DeviceNode, Edits, kind_for_resource

__all__ = [
    "CDI_VERSION",
    "DEFAULT_SPEC_DIR",
    "CdiDevice",
    "CdiError",
    "CdiOptions",
    "CdiSpec",
    "DeviceNode",
    "Edits",
    "claim_spec",
    "gpu_spec",
    "kind_for_resource",
    "mig_spec",
    "names_for",
    "nic_spec",
    "spec_for",
    "spec_for_resource",
]
