package main

import (
	"fmt"
	"sort"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// machine is the simulated node: NUMA node IDs, cadvisor distance rows and a few CPUs
// per node (only so the CPU manager can be built as the kubelet builds it).
type machine struct {
	NUMANodes   []int            `json:"numa_nodes"`
	Distances   map[string][]int `json:"distances"`
	CPUsPerNode int              `json:"cpus_per_node"`
}

// readySources is config.SourcesReady with a switch (the kubelet's is true once every
// pod source has been seen).
type readySources struct {
	mu    sync.Mutex
	ready bool
}

func (s *readySources) AddSource(string) {}
func (s *readySources) AllReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}
func (s *readySources) set(v bool) { s.mu.Lock(); s.ready = v; s.mu.Unlock() }

// kubeletCM is the part of the kubelet's container manager that matters here, wired
// as pkg/kubelet/cm/container_manager_linux.go (NewContainerManager and Start) does in
// the release this binary is built from (newManagers, kapi_v*.go).
type kubeletCM struct {
	Policy  string
	Scope   string
	Options map[string]string

	tm    topologyMgr
	dm    deviceMgr
	start startFunc
}

func newKubeletCM(w *world, policy, scope string, options map[string]string) (*kubeletCM, error) {
	tm, dm, start, err := newManagers(w, policy, scope, options)
	if err != nil {
		return nil, err
	}
	return &kubeletCM{Policy: policy, Scope: scope, Options: options, tm: tm, dm: dm, start: start}, nil
}

// run starts the managers with the world's active pods' containers as the ones the
// runtime already runs (what a restarted kubelet finds).
func (k *kubeletCM) run(w *world) error {
	initial := containermap.NewContainerMap()
	running := sets.New[string]()
	for _, p := range w.activePods() {
		for _, c := range allContainers(p) {
			id := fakeContainerID(p, c.Name)
			initial.Add(string(p.UID), c.Name, id)
			running.Insert(id)
		}
	}
	return k.start(initial, running)
}

func allContainers(p *v1.Pod) []v1.Container {
	return append(append([]v1.Container{}, p.Spec.InitContainers...), p.Spec.Containers...)
}

func fakeContainerID(p *v1.Pod, name string) string {
	return "containerd://" + string(p.UID) + "-" + name
}

// ---- pods ----

type containerSpec struct {
	Name        string           `json:"name"`
	Limits      map[string]int64 `json:"limits"`
	Restartable bool             `json:"restartable"`
}

type podSpec struct {
	Name           string          `json:"name"`
	UID            string          `json:"uid"`
	InitContainers []containerSpec `json:"init_containers"`
	Containers     []containerSpec `json:"containers"`
}

func (s podSpec) build() *v1.Pod {
	uid := s.UID
	if uid == "" {
		uid = "uid-" + s.Name
	}
	mk := func(c containerSpec, init bool) v1.Container {
		rl := v1.ResourceList{}
		for k, v := range c.Limits {
			rl[v1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
		}
		out := v1.Container{Name: c.Name, Image: "busybox", Resources: v1.ResourceRequirements{Limits: rl, Requests: rl.DeepCopy()}}
		if init && c.Restartable {
			always := v1.ContainerRestartPolicyAlways
			out.RestartPolicy = &always
		}
		return out
	}
	p := &v1.Pod{}
	p.Name = s.Name
	p.Namespace = "default"
	p.UID = types.UID(uid)
	for _, c := range s.InitContainers {
		p.Spec.InitContainers = append(p.Spec.InitContainers, mk(c, true))
	}
	for _, c := range s.Containers {
		p.Spec.Containers = append(p.Spec.Containers, mk(c, false))
	}
	p.Status.Phase = v1.PodPending
	return p
}

type hintJSON struct {
	Affinity  []int `json:"affinity"`
	Preferred bool  `json:"preferred"`
}

func hintOut(h topologymanager.TopologyHint) hintJSON {
	var bits []int
	if h.NUMANodeAffinity != nil {
		bits = h.NUMANodeAffinity.GetBits()
		sort.Ints(bits)
		if bits == nil {
			bits = []int{}
		}
	}
	return hintJSON{Affinity: bits, Preferred: h.Preferred}
}

func hintsOut(m map[string][]topologymanager.TopologyHint) map[string]*[]hintJSON {
	if m == nil {
		return nil
	}
	out := map[string]*[]hintJSON{}
	for res, hs := range m {
		if hs == nil {
			out[res] = nil
			continue
		}
		l := make([]hintJSON, 0, len(hs))
		for _, h := range hs {
			l = append(l, hintOut(h))
		}
		out[res] = &l
	}
	return out
}

type deviceJSON struct {
	Health string `json:"health,omitempty"`
	NUMA   []int  `json:"numa"`
}

func devicesOut(rdi devicemanager.ResourceDeviceInstances) map[string]map[string]deviceJSON {
	out := map[string]map[string]deviceJSON{}
	for res, devs := range rdi {
		m := map[string]deviceJSON{}
		for id, d := range devs {
			m[id] = deviceOut(d)
		}
		out[res] = m
	}
	return out
}

func deviceOut(d *pluginapi.Device) deviceJSON {
	var numa []int
	if d.Topology != nil {
		for _, n := range d.Topology.Nodes {
			numa = append(numa, int(n.ID))
		}
	}
	return deviceJSON{Health: d.Health, NUMA: numa}
}

type runOptionsJSON struct {
	Envs        map[string]string   `json:"envs"`
	Devices     []map[string]string `json:"devices"`
	Mounts      []map[string]any    `json:"mounts"`
	Annotations map[string]string   `json:"annotations"`
	CDIDevices  []string            `json:"cdi_devices"`
}

func runOptionsOut(o *devicemanager.DeviceRunContainerOptions) *runOptionsJSON {
	if o == nil {
		return nil
	}
	out := &runOptionsJSON{Envs: map[string]string{}, Annotations: map[string]string{}, Devices: []map[string]string{}, Mounts: []map[string]any{}, CDIDevices: []string{}}
	for _, e := range o.Envs {
		out.Envs[e.Name] = e.Value
	}
	for _, d := range o.Devices {
		out.Devices = append(out.Devices, map[string]string{"host_path": d.PathOnHost, "container_path": d.PathInContainer, "permissions": d.Permissions})
	}
	for _, m := range o.Mounts {
		out.Mounts = append(out.Mounts, map[string]any{"host_path": m.HostPath, "container_path": m.ContainerPath, "read_only": m.ReadOnly})
	}
	for _, a := range o.Annotations {
		out.Annotations[a.Name] = a.Value
	}
	for _, c := range o.CDIDevices {
		out.CDIDevices = append(out.CDIDevices, c.Name)
	}
	return out
}

type containerResult struct {
	Name       string                           `json:"name"`
	Init       bool                             `json:"init"`
	Limits     map[string]int64                 `json:"limits"`
	Affinity   *hintJSON                        `json:"affinity"`
	Devices    map[string]map[string]deviceJSON `json:"devices"`
	RunOptions *runOptionsJSON                  `json:"run_options"`
	RunError   string                           `json:"run_error,omitempty"`
	Hints      map[string]*[]hintJSON           `json:"hints,omitempty"`
}

type admitResult struct {
	Pod        string                 `json:"pod"`
	UID        string                 `json:"uid"`
	Admit      bool                   `json:"admit"`
	Reason     string                 `json:"reason"`
	Message    string                 `json:"message"`
	Containers []containerResult      `json:"containers"`
	PodHints   map[string]*[]hintJSON `json:"pod_hints,omitempty"`
	RPCs       []rpcRecord            `json:"rpcs"`
}

func (w *world) admit(spec podSpec) (*admitResult, error) {
	k := w.kubelet
	if k == nil {
		return nil, fmt.Errorf("no kubelet running")
	}
	pod := spec.build()
	rpcStart := len(w.rpcLog())
	w.mu.Lock()
	for _, p := range w.pods {
		if p.UID == pod.UID {
			w.mu.Unlock()
			return nil, fmt.Errorf("pod uid %s already active", pod.UID)
		}
	}
	others := append([]*v1.Pod{}, w.pods...)
	// As the kubelet's HandlePodAdditions: the pod is in the pod manager (so in
	// activePods) before canAdmitPod runs the admit handlers.
	w.pods = append(w.pods, pod)
	w.hints = map[string]map[string][]topologymanager.TopologyHint{}
	w.mu.Unlock()

	res := k.tm.admit(pod, others)

	out := &admitResult{Pod: pod.Name, UID: string(pod.UID), Admit: res.Admit, Reason: res.Reason, Message: res.Message}
	if !res.Admit {
		// A rejected pod is failed, so no longer active.
		w.removePod(pod.Name)
	} else {
		pod.Status.Phase = v1.PodRunning
		for _, c := range allContainers(pod) {
			c := c
			k.tm.addContainer(pod, &c, fakeContainerID(pod, c.Name))
		}
	}
	w.mu.Lock()
	hints := w.hints
	w.mu.Unlock()
	if h, ok := hints[""]; ok {
		out.PodHints = hintsOut(h)
	}
	for i, c := range allContainers(pod) {
		c := c
		cr := containerResult{Name: c.Name, Init: i < len(pod.Spec.InitContainers), Limits: map[string]int64{}}
		for r, q := range c.Resources.Limits {
			cr.Limits[string(r)] = q.Value()
		}
		if h, ok := hints[c.Name]; ok {
			cr.Hints = hintsOut(h)
		}
		aff := k.tm.affinity(string(pod.UID), c.Name)
		if aff.NUMANodeAffinity != nil || aff.Preferred {
			h := hintOut(aff)
			cr.Affinity = &h
		}
		cr.Devices = devicesOut(k.dm.devices(string(pod.UID), c.Name))
		if res.Admit {
			// What the kubelet passes to the runtime at container start (GetResources).
			opts, err := k.dm.runOptions(pod, &c)
			if err != nil {
				cr.RunError = err.Error()
			}
			cr.RunOptions = runOptionsOut(opts)
		}
		out.Containers = append(out.Containers, cr)
	}
	out.RPCs = w.rpcLog()[rpcStart:]
	if out.RPCs == nil {
		out.RPCs = []rpcRecord{}
	}
	return out, nil
}

func (w *world) removePod(name string) *v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, p := range w.pods {
		if p.Name == name {
			w.pods = append(w.pods[:i], w.pods[i+1:]...)
			return p
		}
	}
	return nil
}

func (w *world) activePods() []*v1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*v1.Pod{}, w.pods...)
}

func (w *world) noteHints(podUID, container string, h map[string][]topologymanager.TopologyHint) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hints != nil {
		w.hints[container] = h
	}
}

func (w *world) setCurrent(pod, container string) {
	w.mu.Lock()
	w.curPod, w.curContainer = pod, container
	w.mu.Unlock()
}

func (w *world) current() (string, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.curPod, w.curContainer
}
