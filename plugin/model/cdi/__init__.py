"""CDI specs written by us: the spec model, builders per resource, and an atomic writer.

No gRPC and no daemon state here: `builders.spec_for_resource` turns a served
`Resource` into a `spec.CdiSpec`, `writer.CdiSpecWriter` keeps the spec
directory in step, and `builders.names_for` gives Allocate its CDI names.
"""

from .builders import CdiOptions, claim_spec, gpu_spec, mig_spec, names_for, nic_spec, spec_for, spec_for_resource
from .spec import CDI_VERSION, DEFAULT_SPEC_DIR, CdiDevice, CdiError, CdiSpec, DeviceNode, Edits, kind_for_resource
from .writer import CdiSpecWriter, CdiWriteError, SyncResult

__all__ = [
    "CDI_VERSION",
    "DEFAULT_SPEC_DIR",
    "CdiDevice",
    "CdiError",
    "CdiOptions",
    "CdiSpec",
    "CdiSpecWriter",
    "CdiWriteError",
    "DeviceNode",
    "Edits",
    "SyncResult",
    "claim_spec",
    "gpu_spec",
    "kind_for_resource",
    "mig_spec",
    "names_for",
    "nic_spec",
    "spec_for",
    "spec_for_resource",
]
