"""`python -m plugin.nrt.cleanup`: delete every NodeResourceTopology object we published (the chart's uninstall).

Why a separate step: a daemon deletes its object when it stops, but on `helm uninstall` its RBAC, its
service account and the admission policy go in the same moment as the DaemonSet, so the stopping
daemon's delete is refused and the objects would stay, still claiming devices, until their Node goes.
The chart runs this as a post-delete hook Job with its own short-lived account: by then no daemon can
write any more (its account is gone), so nothing recreates what this deletes. Only objects carrying
our `managed-by` label are touched (NFD's are left alone).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from ..kube.errors import KubeNotFound
from .writer import manager_of

if TYPE_CHECKING:
    from .api import NrtApi

log = logging.getLogger(__name__)


async def delete_ours(api: NrtApi) -> list[str]:
    """Delete our objects; the names deleted. A missing CRD (404) is nothing to delete."""
    try:
        objects = await api.list()
    except KubeNotFound:
        return []
    names = sorted(str(o["metadata"]["name"]) for o in objects if manager_of(o) is None)
    for name in names:
        await api.delete(name)
    return names


async def _main() -> int:
    from .api import connect_nrt_api  # noqa: PLC0415 (lightkube only when run)

    api = await connect_nrt_api()
    try:
        names = await delete_ours(api)
    finally:
        await api.close()
    print(f"deleted {len(names)} NodeResourceTopology objects: {', '.join(names) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main()))
