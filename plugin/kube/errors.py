"""What can go wrong talking to the Kubernetes API server, as one hierarchy of exception types.

Why types and not status codes: every caller (the slice publisher, the claim
preparer, the claim status writer, the node labeller, the NodeResourceTopology
publisher) asks the same few questions of a failure: try again later? is the
object gone? did someone else change it first? is our RBAC missing? is what we
sent wrong? Each answer is a type here, chosen once at the client's edge
(`api_error`), so no caller parses HTTP codes or Status reasons again, and each
keeps the API server's own message (`str()` is "<code> <reason>: <message>").

    KubeError
    ├── KubeConfigError        no usable configuration (not in a pod, bad kubeconfig): fix and restart
    ├── KubeApiUnreachable     no answer at all (refused, reset, TLS, timeout): retryable
    └── KubeApiError           an error answer; `status`, `reason`, `message` as the server sent them
        ├── KubeForbidden      401/403: the credentials or RBAC; not retryable until someone fixes them
        ├── KubeNotFound       404: the object (or its namespace) does not exist
        ├── KubeConflict       409: a concurrent change or an existing name; retryable after a re-read
        └── KubeInvalid        400/422: the server refused what we sent; a bug or a bad input, not retryable

A plain `KubeApiError` is any other answer: 429 and 5xx are `retryable`, the rest not.
"""

from __future__ import annotations

__all__ = ["KubeApiError", "KubeApiUnreachable", "KubeConfigError", "KubeConflict", "KubeError", "KubeForbidden",
           "KubeInvalid", "KubeNotFound", "api_error"]


class KubeError(Exception):
    """Any failure of the Kubernetes client; `retryable` says whether the same call may succeed later."""

    @property
    def retryable(self) -> bool:
        return False


class KubeConfigError(KubeError):
    """No usable API server configuration (not in a pod, unreadable kubeconfig...); the message says which."""


class KubeApiUnreachable(KubeError):
    """No answer from the API server (connection refused or reset, TLS failure, timeout); the message says
    which server and what happened."""

    @property
    def retryable(self) -> bool:
        return True


class KubeApiError(KubeError):
    """The API server answered with an error: `status` is the HTTP code, `reason` the Status reason,
    `message` the Status message (what the server says is wrong, empty when it said nothing)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.status == 429 or self.status >= 500


class KubeForbidden(KubeApiError):
    """401 or 403: the service account's token or its RBAC; the chart's ClusterRole lists what we need."""

    @property
    def retryable(self) -> bool:
        return False


class KubeNotFound(KubeApiError):
    """404: the object is not there (deleted, never created, or a namespace that does not exist)."""

    @property
    def retryable(self) -> bool:
        return False


class KubeConflict(KubeApiError):
    """409: the object changed since it was read (Conflict) or its name is taken (AlreadyExists)."""

    @property
    def retryable(self) -> bool:
        return True


class KubeInvalid(KubeApiError):
    """400 or 422: the server refused the object or request as malformed; sending it again will not help."""

    @property
    def retryable(self) -> bool:
        return False


_BY_STATUS: dict[int, type[KubeApiError]] = {400: KubeInvalid, 401: KubeForbidden, 403: KubeForbidden,
                                             404: KubeNotFound, 409: KubeConflict, 422: KubeInvalid}


def api_error(status: int, reason: str, message: str) -> KubeApiError:
    """The error for one answer of the API server, of the type its HTTP code means."""
    return _BY_STATUS.get(status, KubeApiError)(status, reason, message)
