"""Moved to `plugin.kube.client` (the one Kubernetes client, issue 31); this name stays for code written
against it (the NodeResourceTopology publisher in progress). New code imports `plugin.kube.client`."""

from ..kube.client import KEEPALIVE_S, KubeApi, KubeApiError, KubeApiUnreachable, KubeConfigError, in_cluster_api, \
    kubeconfig_api

__all__ = ["KEEPALIVE_S", "KubeApi", "KubeApiError", "KubeApiUnreachable", "KubeConfigError", "in_cluster_api",
           "kubeconfig_api"]
