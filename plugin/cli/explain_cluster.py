"""`topo-device-plugin explain --cluster KUBECONFIG`: which nodes would admit a pod aligned.

Why a module of its own: `explain` models one node from its hardware; this reads
every node's published NodeResourceTopology (`serve --nrt`) through the API
server and runs the same Topology Manager model per node (`plugin.nrt.cluster`).
Imported only with `--cluster` (lightkube).
"""

from __future__ import annotations

import asyncio
from typing import Any

import click

from ..errors import InputError, RuntimeFailure
from ..inputs.yaml_input import YamlProblem, load, read_text
from ..kube.errors import KubeApiError, KubeApiUnreachable, KubeConfigError, KubeNotFound
from ..nrt.cluster import NodeVerdict, PodSpecError, cluster_verdicts, pod_from_spec
from .json_keys import dumps


def read_pod(path: str) -> Any:
    try:
        data, _ = load(read_text(path))
        return pod_from_spec(data if isinstance(data, dict) else {})
    except OSError as e:
        raise InputError(f"--pod {path}: cannot be read ({e.strerror or e}) (fix: name a pod spec file)") from None
    except YamlProblem as e:
        raise InputError(f"--pod {path}: {e.message}" + (f" (fix: {e.fix})" if e.fix else "")) from None
    except PodSpecError as e:
        raise InputError(f"--pod {path}: {e}") from None


async def _objects(kubeconfig: str) -> list[dict[str, Any]]:
    from ..kube.client import kubeconfig_api  # noqa: PLC0415 (lightkube only with --cluster)
    from ..nrt.api import LightkubeNrtApi  # noqa: PLC0415 (as above)

    try:
        api = LightkubeNrtApi(await kubeconfig_api(kubeconfig))
    except KubeConfigError as e:
        raise InputError(f"--cluster {kubeconfig}: {e} (fix: name a kubeconfig file kubectl can use)") from None
    try:
        return await api.list()
    except KubeNotFound as e:
        raise RuntimeFailure(f"cannot list NodeResourceTopology objects: {e} (fix: install the chart with "
                             "nrt.enabled (the CRD comes with it))") from None
    except KubeApiError as e:
        raise RuntimeFailure(f"cannot list NodeResourceTopology objects: {e} (fix: use a kubeconfig that may list "
                             "noderesourcetopologies)") from None
    except KubeApiUnreachable as e:
        raise RuntimeFailure(f"{e} (fix: check the kubeconfig's server address)") from None
    finally:
        await api.close()


def render(verdicts: list[NodeVerdict]) -> str:
    if not verdicts:
        return "no NodeResourceTopology objects published (fix: serve --nrt, chart nrt.enabled)"
    rows = [("NODE", "POLICY", "SCOPE", "ADMIT", "WHY")] + [
        (v.node, v.policy + ("*" if v.policy_assumed else ""), v.scope, "yes" if v.admit else "no", v.reason)
        for v in verdicts]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    if any(v.policy_assumed for v in verdicts):
        lines.append("* not published (the kubelet's config was unreadable): judged as none, as scheduler-plugins "
                     "does")
    admitted = sum(v.admit for v in verdicts)
    lines.append(f"{admitted} of {len(verdicts)} nodes admit the pod under their policy (devices only: CPUs and memory are "
                 "not published; docs/scheduling.md)")
    return "\n".join(lines)


def verdicts_json(verdicts: list[NodeVerdict]) -> str:
    """`--format json`: `{"nodes": [...]}`, camelCase like every command's JSON (json_keys)."""
    return dumps({"nodes": [v.to_dict() for v in verdicts]})


def explain_cluster(kubeconfig: str, pod: Any, fmt: str, fail_on_reject: bool) -> None:
    verdicts = cluster_verdicts(asyncio.run(_objects(kubeconfig)), pod)
    if fmt == "json":
        click.echo(verdicts_json(verdicts))
    else:
        click.echo(render(verdicts))
    if fail_on_reject and not any(v.admit for v in verdicts):
        raise SystemExit(1)
