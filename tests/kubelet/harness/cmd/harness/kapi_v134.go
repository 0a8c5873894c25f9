//go:build k8s134

package main

// The kubelet managers' signatures up to Kubernetes 1.34 (the "race" line, built with
// -tags k8s134): global klog logging, no admission operation, cadvisor's info/v1 types.

import (
	"context"
	"fmt"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/memorymanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/utils/cpuset"
)

func cadvisorMachine(m machine) ([]cadvisorapi.Node, *cadvisorapi.MachineInfo) {
	info := &cadvisorapi.MachineInfo{}
	m.decodeInto(info)
	return info.Topology, info
}

type topologyV134 struct{ m topologymanager.Manager }

func newTopologyManager(m machine, policy, scope string, options map[string]string) (topologyMgr, error) {
	nodes, _ := cadvisorMachine(m)
	tm, err := topologymanager.NewManager(nodes, policy, scope, options)
	if err != nil {
		return nil, err
	}
	return topologyV134{tm}, nil
}

func (t topologyV134) admit(pod *v1.Pod, others []*v1.Pod) lifecycle.PodAdmitResult {
	return t.m.Admit(&lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: others})
}

func (t topologyV134) affinity(podUID, container string) topologymanager.TopologyHint {
	return t.m.GetAffinity(podUID, container)
}

func (t topologyV134) addContainer(pod *v1.Pod, c *v1.Container, id string) {
	t.m.AddContainer(pod, c, id)
}

func (t topologyV134) removeContainer(id string) error { return t.m.RemoveContainer(id) }

func (t topologyV134) merge(providers []map[string][]topologymanager.TopologyHint) (topologymanager.TopologyHint, bool) {
	return t.m.GetPolicy().Merge(providers)
}

type deviceV134 struct{ m *devicemanager.ManagerImpl }

func (d deviceV134) stop() error                                            { return d.m.Stop() }
func (d deviceV134) capacity() (v1.ResourceList, v1.ResourceList, []string) { return d.m.GetCapacity() }
func (d deviceV134) devices(podUID, container string) devicemanager.ResourceDeviceInstances {
	return d.m.GetDevices(podUID, container)
}
func (d deviceV134) allocatable() devicemanager.ResourceDeviceInstances {
	return d.m.GetAllocatableDevices()
}
func (d deviceV134) runOptions(pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return d.m.GetDeviceRunContainerOptions(pod, c)
}

// newManagers wires the managers as NewContainerManager does in this release (see
// kapi_v137.go for the order).
func newManagers(w *world, policy, scope string, options map[string]string) (topologyMgr, deviceMgr, startFunc, error) {
	nodes, info := cadvisorMachine(w.machine)
	tm, err := topologymanager.NewManager(nodes, policy, scope, options)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("topologymanager.NewManager: %w", err)
	}
	dm, err := devicemanager.NewManagerImpl(nodes, tm)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("devicemanager.NewManagerImpl: %w", err)
	}
	tm.AddHintProvider(&recorderV134{inner: dm, w: w})
	cpu, err := cpumanager.NewManager("none", nil, 10*time.Second, info, cpuset.New(), v1.ResourceList{}, kubeletDir, tm)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cpumanager.NewManager: %w", err)
	}
	tm.AddHintProvider(cpu)
	mem, err := memorymanager.NewManager(context.Background(), "None", info, v1.ResourceList{}, nil, kubeletDir, tm)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("memorymanager.NewManager: %w", err)
	}
	tm.AddHintProvider(mem)
	start := func(initial containermap.ContainerMap, running sets.Set[string]) error {
		if err := cpu.Start(cpumanager.ActivePodsFunc(w.activePods), w.sources, nil, nil, initial.Clone()); err != nil {
			return fmt.Errorf("cpu manager start: %w", err)
		}
		if err := mem.Start(context.Background(), memorymanager.ActivePodsFunc(w.activePods), w.sources, nil, nil, initial.Clone()); err != nil {
			return fmt.Errorf("memory manager start: %w", err)
		}
		return dm.Start(devicemanager.ActivePodsFunc(w.activePods), w.sources, initial.Clone(), running)
	}
	return topologyV134{tm}, deviceV134{dm}, start, nil
}

// recorderV134 passes every call through to the device manager unchanged.
type recorderV134 struct {
	inner *devicemanager.ManagerImpl
	w     *world
}

func (r *recorderV134) GetTopologyHints(pod *v1.Pod, c *v1.Container) map[string][]topologymanager.TopologyHint {
	h := r.inner.GetTopologyHints(pod, c)
	r.w.noteHints(string(pod.UID), c.Name, h)
	return h
}

func (r *recorderV134) GetPodTopologyHints(pod *v1.Pod) map[string][]topologymanager.TopologyHint {
	h := r.inner.GetPodTopologyHints(pod)
	r.w.noteHints(string(pod.UID), "", h)
	return h
}

func (r *recorderV134) Allocate(pod *v1.Pod, c *v1.Container) error {
	r.w.setCurrent(pod.Name, c.Name)
	defer r.w.setCurrent("", "")
	return r.inner.Allocate(pod, c)
}
