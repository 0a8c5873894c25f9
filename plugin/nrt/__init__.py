"""The NodeResourceTopology publisher (`--nrt`, docs/scheduling.md).

Why: in device-plugin mode the scheduler binds a pod before the kubelet's
Topology Manager decides whether its devices align; a topology-aware scheduler
(scheduler-plugins' `NodeResourceTopologyMatch`, KAI's NUMA plugin) can only
avoid the `TopologyAffinityError` if it sees per-NUMA availability. We know it
first, so the daemon publishes its node's `topology.node.k8s.io/v1alpha2`
object itself: `build.py` (pure: the object from the topology, health and held
devices), `kubelet_config.py` (the Topology Manager policy and scope from the
kubelet's config file), `writer.py` (keeps it current, coalesced), `side.py`
(what the daemon starts: the factory and the pod-resources poll).
"""
