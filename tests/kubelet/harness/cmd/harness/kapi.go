package main

// The harness drives two Kubernetes lines (tests/kubelet/k8s_versions.json). Their
// kubelet managers do the same things with different signatures: from 1.35 on almost
// every call takes a klog.Logger or a context (contextual logging), admission and
// allocation carry a lifecycle.Operation (add or resize), and cadvisor's machine types
// moved to github.com/google/cadvisor/lib/model. The rest of the harness talks to the
// two interfaces below; kapi_v137.go (default) and kapi_v134.go (build tag k8s134)
// adapt one release's signatures to them, and nothing else.

import (
	"encoding/json"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

// topologyMgr is the Topology Manager as the kubelet's pod admission uses it.
type topologyMgr interface {
	// admit runs the admit handler for a new pod ("add"), as canAdmitPod does.
	admit(pod *v1.Pod, others []*v1.Pod) lifecycle.PodAdmitResult
	affinity(podUID, container string) topologymanager.TopologyHint
	addContainer(pod *v1.Pod, c *v1.Container, containerID string)
	removeContainer(containerID string) error
	// merge is the policy's Merge over the given providers' hints.
	merge(providers []map[string][]topologymanager.TopologyHint) (topologymanager.TopologyHint, bool)
}

// deviceMgr is the device manager as the container manager and the node status use it.
type deviceMgr interface {
	stop() error
	capacity() (capacity, allocatable v1.ResourceList, inactive []string)
	devices(podUID, container string) devicemanager.ResourceDeviceInstances
	allocatable() devicemanager.ResourceDeviceInstances
	runOptions(pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error)
}

// startFunc starts the managers (CPU, memory, device, in the kubelet's order) with the
// containers the runtime reports as already there.
type startFunc func(initial containermap.ContainerMap, running sets.Set[string]) error

// decodeInto fills a release's *cadvisorapi.MachineInfo with the simulated machine:
// both releases' cadvisor types decode the same JSON.
func (m machine) decodeInto(info any) {
	if err := json.Unmarshal(m.cadvisorMachineJSON(), info); err != nil {
		panic(err) // our own encoding of plain structs
	}
}

// cadvisorMachineJSON is the simulated machine in cadvisor's JSON encoding
// (MachineInfo with its Topology).
func (m machine) cadvisorMachineJSON() []byte {
	type core struct {
		ID       int   `json:"core_id"`
		Threads  []int `json:"thread_ids"`
		SocketID int   `json:"socket_id"`
	}
	type node struct {
		ID        int      `json:"node_id"`
		Memory    uint64   `json:"memory"`
		Cores     []core   `json:"cores"`
		Distances []uint64 `json:"distances"`
	}
	cpus := m.CPUsPerNode
	if cpus <= 0 {
		cpus = 2
	}
	var nodes []node
	next := 0
	for _, id := range m.NUMANodes {
		n := node{ID: id, Memory: nodeMemory}
		for _, d := range m.Distances[strconv.Itoa(id)] {
			n.Distances = append(n.Distances, uint64(d))
		}
		for c := 0; c < cpus; c++ {
			n.Cores = append(n.Cores, core{ID: next, Threads: []int{next}, SocketID: id})
			next++
		}
		nodes = append(nodes, n)
	}
	b, err := json.Marshal(map[string]any{
		"num_cores": next, "num_physical_cores": next, "num_sockets": len(nodes),
		"memory_capacity": uint64(len(nodes)) * nodeMemory, "topology": nodes,
	})
	if err != nil {
		panic(err) // plain structs: cannot fail
	}
	return b
}

// nodeMemory is each simulated NUMA node's memory (only the memory manager reads it).
const nodeMemory = 64 << 30
