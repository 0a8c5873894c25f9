"""The one Kubernetes API client of the program (lightkube underneath) and its one error model.

Why one package: the DRA driver (slices, claims, claim status), the node
labeller and the NodeResourceTopology publisher all talk to the same API server
with the same credentials; one client module keeps the connection pool, the
retry of lost reads and the mapping of failures to `plugin.kube.errors` in one
place, so every caller handles "unreachable", "forbidden", "not found",
"conflict" and "invalid" the same way. Importing this package does not import
lightkube: `plugin.kube.client` does, and only the modes that talk to the API
server import it (the errors are plain Python).
"""

from .errors import (KubeApiError, KubeApiUnreachable, KubeConfigError, KubeConflict, KubeError, KubeForbidden,
                     KubeInvalid, KubeNotFound, api_error)

__all__ = ["KubeApiError", "KubeApiUnreachable", "KubeConfigError", "KubeConflict", "KubeError", "KubeForbidden",
           "KubeInvalid", "KubeNotFound", "api_error"]
