//go:build !k8s134

package main

// The kubelet managers' signatures from Kubernetes 1.35 on (the "current" line).

import (
	"context"
	"fmt"
	"time"

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/cpumanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/memorymanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/utils/cpuset"
)

// The managers log through klog's global logger, as a kubelet without a contextual one does.
var logger = klog.Background()

func kubeletContext() context.Context { return klog.NewContext(context.Background(), logger) }

func cadvisorMachine(m machine) ([]cadvisorapi.Node, *cadvisorapi.MachineInfo) {
	info := &cadvisorapi.MachineInfo{}
	m.decodeInto(info)
	return info.Topology, info
}

type topologyV137 struct{ m topologymanager.Manager }

func newTopologyManager(m machine, policy, scope string, options map[string]string) (topologyMgr, error) {
	nodes, _ := cadvisorMachine(m)
	tm, err := topologymanager.NewManager(logger, nodes, policy, scope, options)
	if err != nil {
		return nil, err
	}
	return topologyV137{tm}, nil
}

func (t topologyV137) admit(pod *v1.Pod, others []*v1.Pod) lifecycle.PodAdmitResult {
	return t.m.Admit(kubeletContext(), &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: others, Operation: lifecycle.AddOperation})
}

func (t topologyV137) affinity(podUID, container string) topologymanager.TopologyHint {
	return t.m.GetAffinity(logger, podUID, container)
}

func (t topologyV137) addContainer(pod *v1.Pod, c *v1.Container, id string) {
	t.m.AddContainer(logger, pod, c, id)
}

func (t topologyV137) removeContainer(id string) error { return t.m.RemoveContainer(logger, id) }

func (t topologyV137) merge(providers []map[string][]topologymanager.TopologyHint) (topologymanager.TopologyHint, bool) {
	return t.m.GetPolicy().Merge(logger, providers)
}

type deviceV137 struct{ m *devicemanager.ManagerImpl }

func (d deviceV137) stop() error { return d.m.Stop(logger) }
func (d deviceV137) capacity() (v1.ResourceList, v1.ResourceList, []string) {
	return d.m.GetCapacity(logger)
}
func (d deviceV137) devices(podUID, container string) devicemanager.ResourceDeviceInstances {
	return d.m.GetDevices(podUID, container)
}
func (d deviceV137) allocatable() devicemanager.ResourceDeviceInstances {
	return d.m.GetAllocatableDevices(logger)
}
func (d deviceV137) runOptions(pod *v1.Pod, c *v1.Container) (*devicemanager.DeviceRunContainerOptions, error) {
	return d.m.GetDeviceRunContainerOptions(kubeletContext(), pod, c)
}

// newManagers wires the managers as NewContainerManager does in this release: the
// Topology Manager, the device manager as its first hint provider (through a
// recording pass-through), then the CPU and memory managers with policy none.
func newManagers(w *world, policy, scope string, options map[string]string) (topologyMgr, deviceMgr, startFunc, error) {
	nodes, info := cadvisorMachine(w.machine)
	tm, err := topologymanager.NewManager(logger, nodes, policy, scope, options)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("topologymanager.NewManager: %w", err)
	}
	dm, err := devicemanager.NewManagerImpl(logger, nodes, tm)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("devicemanager.NewManagerImpl: %w", err)
	}
	tm.AddHintProvider(logger, &recorderV137{inner: dm, w: w})
	cpu, err := cpumanager.NewManager(logger, "none", nil, 10*time.Second, info, cpuset.New(), v1.ResourceList{}, kubeletDir, tm)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cpumanager.NewManager: %w", err)
	}
	tm.AddHintProvider(logger, cpu)
	mem, err := memorymanager.NewManager(logger, "None", info, v1.ResourceList{}, nil, kubeletDir, tm)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("memorymanager.NewManager: %w", err)
	}
	tm.AddHintProvider(logger, mem)
	start := func(initial containermap.ContainerMap, running sets.Set[string]) error {
		ctx := kubeletContext()
		if err := cpu.Start(ctx, cpumanager.ActivePodsFunc(w.activePods), w.sources, nil, nil, initial.Clone()); err != nil {
			return fmt.Errorf("cpu manager start: %w", err)
		}
		if err := mem.Start(ctx, memorymanager.ActivePodsFunc(w.activePods), w.sources, nil, nil, initial.Clone()); err != nil {
			return fmt.Errorf("memory manager start: %w", err)
		}
		return dm.Start(logger, devicemanager.ActivePodsFunc(w.activePods), w.sources, initial.Clone(), running)
	}
	return topologyV137{tm}, deviceV137{dm}, start, nil
}

// recorderV137 passes every call through to the device manager unchanged.
type recorderV137 struct {
	inner *devicemanager.ManagerImpl
	w     *world
}

func (r *recorderV137) GetTopologyHints(l klog.Logger, pod *v1.Pod, c *v1.Container, op lifecycle.Operation) map[string][]topologymanager.TopologyHint {
	h := r.inner.GetTopologyHints(l, pod, c, op)
	r.w.noteHints(string(pod.UID), c.Name, h)
	return h
}

func (r *recorderV137) GetPodTopologyHints(l klog.Logger, pod *v1.Pod, op lifecycle.Operation) map[string][]topologymanager.TopologyHint {
	h := r.inner.GetPodTopologyHints(l, pod, op)
	r.w.noteHints(string(pod.UID), "", h)
	return h
}

func (r *recorderV137) AllocatePod(l klog.Logger, pod *v1.Pod, op lifecycle.Operation) error {
	return r.inner.AllocatePod(l, pod, op)
}

func (r *recorderV137) Allocate(ctx context.Context, pod *v1.Pod, c *v1.Container, op lifecycle.Operation) error {
	r.w.setCurrent(pod.Name, c.Name)
	defer r.w.setCurrent("", "")
	return r.inner.Allocate(ctx, pod, c, op)
}
