package main

// Differential cases for allocator/topologymanager (our Python model of the kubelet's
// Topology Manager). The JSON shapes are those of the model's
// evaluate_merge_case / evaluate_admission_case (allocator/topologymanager/harness.py).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager/bitmask"
)

type hintIn struct {
	Affinity  *[]int `json:"affinity"`
	Preferred bool   `json:"preferred"`
}

type caseCommon struct {
	ID           any               `json:"id"`
	NUMANodes    []int             `json:"numa_nodes"`
	Policy       string            `json:"policy"`
	Scope        string            `json:"scope"`
	Options      map[string]string `json:"options"`
	Distances    map[string][]int  `json:"distances"`
	FeatureGates *struct {
		Alpha *bool `json:"alpha"`
		Beta  *bool `json:"beta"`
	} `json:"feature_gates"`
}

func (c caseCommon) machine() machine {
	return machine{NUMANodes: c.NUMANodes, Distances: c.Distances}
}

func (c caseCommon) scope() string {
	if c.Scope == "" {
		return "container"
	}
	return c.Scope
}

// setGates sets the policy-option gates for this case (defaults: alpha off, beta on).
func (c caseCommon) setGates() error {
	alpha, beta := false, true
	if c.FeatureGates != nil {
		if c.FeatureGates.Alpha != nil {
			alpha = *c.FeatureGates.Alpha
		}
		if c.FeatureGates.Beta != nil {
			beta = *c.FeatureGates.Beta
		}
	}
	return utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{
		"TopologyManagerPolicyAlphaOptions": alpha,
		"TopologyManagerPolicyBetaOptions":  beta,
	})
}

func toHint(h hintIn) (topologymanager.TopologyHint, error) {
	out := topologymanager.TopologyHint{Preferred: h.Preferred}
	if h.Affinity != nil {
		m, err := bitmask.NewBitMask(*h.Affinity...)
		if err != nil {
			return out, err
		}
		out.NUMANodeAffinity = m
	}
	return out, nil
}

func maskValue(m bitmask.BitMask) any {
	if m == nil {
		return nil
	}
	var v uint64
	for _, b := range m.GetBits() {
		v |= 1 << uint(b)
	}
	return v
}

type mergeCase struct {
	caseCommon
	Providers []map[string]*[]hintIn `json:"providers"`
}

func evalMergeCase(raw json.RawMessage) any {
	var c mergeCase
	if err := json.Unmarshal(raw, &c); err != nil {
		return map[string]any{"harness_error": err.Error()}
	}
	out := map[string]any{"id": c.ID}
	if err := c.setGates(); err != nil {
		out["harness_error"] = err.Error()
		return out
	}
	mgr, err := newTopologyManager(c.machine(), c.Policy, c.scope(), c.Options)
	if err != nil {
		out["admit"], out["affinity"], out["affinity_mask"], out["preferred"], out["error"] = false, nil, nil, false, err.Error()
		return out
	}
	var providers []map[string][]topologymanager.TopologyHint
	for _, p := range c.Providers {
		if p == nil {
			providers = append(providers, nil)
			continue
		}
		m := map[string][]topologymanager.TopologyHint{}
		for res, hs := range p {
			if hs == nil {
				m[res] = nil
				continue
			}
			l := []topologymanager.TopologyHint{}
			for _, h := range *hs {
				th, err := toHint(h)
				if err != nil {
					out["harness_error"] = err.Error()
					return out
				}
				l = append(l, th)
			}
			m[res] = l
		}
		providers = append(providers, m)
	}
	best, admit := mgr.merge(providers)
	h := hintOut(best)
	out["admit"], out["affinity"], out["affinity_mask"], out["preferred"], out["error"] = admit, h.Affinity, maskValue(best.NUMANodeAffinity), best.Preferred, nil
	return out
}

// ---- admission cases: the real device manager with in-process stub plugins ----

type stubDeviceIn struct {
	ID        string `json:"id"`
	NUMANodes *[]int `json:"numa_nodes"`
	Healthy   *bool  `json:"healthy"`
}

type stubResourceIn struct {
	Devices   []stubDeviceIn  `json:"devices"`
	Preferred json.RawMessage `json:"preferred"`
}

type admissionCase struct {
	caseCommon
	Resources map[string]stubResourceIn `json:"resources"`
	InUse     map[string][]string       `json:"in_use"`
	Pod       struct {
		UID            string `json:"uid"`
		Name           string `json:"name"`
		InitContainers []struct {
			Name        string           `json:"name"`
			Limits      map[string]int64 `json:"limits"`
			Restartable bool             `json:"restartable"`
		} `json:"init_containers"`
		Containers []struct {
			Name   string           `json:"name"`
			Limits map[string]int64 `json:"limits"`
		} `json:"containers"`
	} `json:"pod"`
}

// preferredRule: nil (no GetPreferredAllocation), "lowest", or a fixed list.
type preferredRule struct {
	lowest bool
	fixed  []string
}

func parseRule(raw json.RawMessage) (*preferredRule, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return nil, nil
	}
	var name string
	if json.Unmarshal(raw, &name) == nil {
		if name == "lowest" {
			return &preferredRule{lowest: true}, nil
		}
		return nil, fmt.Errorf("unknown preferred rule %q", name)
	}
	var ids []string
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, err
	}
	return &preferredRule{fixed: ids}, nil
}

var digits = regexp.MustCompile(`(\d+)`)

// naturalLess orders "GPU2" before "GPU10", like the model's natural_key.
func naturalLess(a, b string) bool {
	pa, pb := splitNatural(a), splitNatural(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, y := pa[i], pb[i]
		xn, xerr := strconv.Atoi(x)
		yn, yerr := strconv.Atoi(y)
		switch {
		case xerr == nil && yerr == nil:
			if xn != yn {
				return xn < yn
			}
		case xerr == nil:
			return false // the model compares int with str: both sides are split alike, so mixed positions mean different prefixes
		case yerr == nil:
			return true
		default:
			if x != y {
				return x < y
			}
		}
	}
	return len(pa) < len(pb)
}

func splitNatural(s string) []string {
	var parts []string
	last := 0
	for _, loc := range digits.FindAllStringIndex(s, -1) {
		parts = append(parts, s[last:loc[0]], s[loc[0]:loc[1]])
		last = loc[1]
	}
	return append(parts, s[last:])
}

type prefCall struct {
	Container   string   `json:"container"`
	Resource    string   `json:"resource"`
	Available   []string `json:"available"`
	MustInclude []string `json:"must_include"`
	Size        int32    `json:"size"`
	Answer      []string `json:"answer"`
}

type allocCall struct {
	Container string   `json:"container"`
	Resource  string   `json:"resource"`
	Devices   []string `json:"devices"`
}

type stubPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	res     string
	devices []*pluginapi.Device
	rule    *preferredRule
	w       *world
	srv     *grpc.Server
	mu      sync.Mutex
	prefs   []prefCall
	allocs  []allocCall
	stop    chan struct{}
}

func (s *stubPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: s.rule != nil}, nil
}

func (s *stubPlugin) ListAndWatch(_ *pluginapi.Empty, st pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := st.Send(&pluginapi.ListAndWatchResponse{Devices: s.devices}); err != nil {
		return err
	}
	select {
	case <-st.Context().Done():
	case <-s.stop:
	}
	return nil
}

func (s *stubPlugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	_, cont := s.w.current()
	for _, c := range r.ContainerRequests {
		var answer []string
		if s.rule.lowest {
			must := map[string]bool{}
			answer = append(answer, c.MustIncludeDeviceIDs...)
			for _, d := range c.MustIncludeDeviceIDs {
				must[d] = true
			}
			rest := []string{}
			for _, d := range c.AvailableDeviceIDs {
				if !must[d] {
					rest = append(rest, d)
				}
			}
			sort.Slice(rest, func(i, j int) bool { return naturalLess(rest[i], rest[j]) })
			n := int(c.AllocationSize) - len(answer)
			if n > len(rest) {
				n = len(rest)
			}
			if n > 0 {
				answer = append(answer, rest[:n]...)
			}
		} else {
			answer = append([]string{}, s.rule.fixed...)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: answer})
		s.mu.Lock()
		s.prefs = append(s.prefs, prefCall{Container: cont, Resource: s.res, Available: sortedCopy(c.AvailableDeviceIDs),
			MustInclude: sortedCopy(c.MustIncludeDeviceIDs), Size: c.AllocationSize, Answer: answer})
		s.mu.Unlock()
	}
	return resp, nil
}

func (s *stubPlugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	_, cont := s.w.current()
	for _, c := range r.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"STUB_" + strings.ToUpper(strings.NewReplacer("/", "_", ".", "_", "-", "_").Replace(s.res)): strings.Join(c.DevicesIds, ",")},
		})
		s.mu.Lock()
		s.allocs = append(s.allocs, allocCall{Container: cont, Resource: s.res, Devices: sortedCopy(c.DevicesIds)})
		s.mu.Unlock()
	}
	return resp, nil
}

func (s *stubPlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func startStub(w *world, idx int, res string, devices []*pluginapi.Device, rule *preferredRule) (*stubPlugin, error) {
	s := &stubPlugin{res: res, devices: devices, rule: rule, w: w, stop: make(chan struct{})}
	name := fmt.Sprintf("stub-%d.sock", idx)
	path := filepath.Join(pluginapi.DevicePluginPath, name)
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	s.srv = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s.srv, s)
	go func() { _ = s.srv.Serve(ln) }()
	conn, err := dialUnix(pluginapi.KubeletSocket)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: name, ResourceName: res})
	if err != nil {
		s.close()
		return nil, fmt.Errorf("registering stub for %s: %w", res, err)
	}
	return s, nil
}

func (s *stubPlugin) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.srv.Stop()
}

func resetKubeletDir() error {
	entries, err := os.ReadDir(kubeletDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == ".topo-harness-sandbox" {
			continue
		}
		// Late checkpoint writes of the previous case's goroutines can race the removal.
		var err error
		for try := 0; try < 50; try++ {
			if err = os.RemoveAll(filepath.Join(kubeletDir, e.Name())); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func waitCapacity(w *world, want map[string][2]int64) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, a, _ := w.capacity()
		ok := true
		for res, ca := range want {
			if c[res] != ca[0] || a[res] != ca[1] {
				ok = false
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stub plugins did not register: capacity %v allocatable %v, want %v", c, a, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func evalAdmissionCase(raw json.RawMessage) any {
	var c admissionCase
	if err := json.Unmarshal(raw, &c); err != nil {
		return map[string]any{"harness_error": err.Error()}
	}
	out, err := runAdmissionCase(c)
	if err != nil {
		return map[string]any{"id": c.ID, "harness_error": err.Error()}
	}
	out["id"] = c.ID
	return out
}

// errStaleCheckpoint: the case's kubelet started from a checkpoint that lacks the filler's
// devices. A goroutine of the previous kubelet (an endpoint's late ListAndWatch or
// disconnect handling, after Stop returned) wrote its own checkpoint over the one phase 1
// left, so the second kubelet would see the in-use devices as free: the comparison would
// test our model against a node that is not the case's.
var errStaleCheckpoint = errors.New("the case's kubelet restarted without the filler's devices")

// runAdmissionCase runs one case on a fresh kubelet directory, again (up to 5 times) when
// the restarted kubelet did not find the filler's devices in its checkpoint; the tries
// are reported ("harness_tries") so a run shows how often that happened.
func runAdmissionCase(c admissionCase) (map[string]any, error) {
	var err error
	for try := 1; try <= 5; try++ {
		var out map[string]any
		out, err = runAdmissionCaseOnce(c)
		if err == nil {
			if try > 1 {
				out["harness_tries"] = try
			}
			return out, nil
		}
		if !errors.Is(err, errStaleCheckpoint) {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond) // let the previous kubelets' goroutines finish before the next reset
	}
	return nil, err
}

func runAdmissionCaseOnce(c admissionCase) (map[string]any, error) {
	if err := c.setGates(); err != nil {
		return nil, err
	}
	if err := resetKubeletDir(); err != nil {
		return nil, err
	}
	w := &world{machine: c.machine(), sources: &readySources{ready: true}, t0: time.Now(), plugins: map[string]*pluginProc{}}
	// Probe the configuration first: a kubelet that cannot build its Topology Manager
	// never starts (the model reports that error).
	if _, err := newTopologyManager(w.machine, c.Policy, c.scope(), c.Options); err != nil {
		return map[string]any{"admit": false, "error": err.Error()}, nil
	}
	var names []string
	for res := range c.Resources {
		names = append(names, res)
	}
	sort.Strings(names)
	mkDevices := func(res string, allHealthy bool) []*pluginapi.Device {
		var out []*pluginapi.Device
		for _, d := range c.Resources[res].Devices {
			dev := &pluginapi.Device{ID: d.ID, Health: pluginapi.Healthy}
			if !allHealthy && d.Healthy != nil && !*d.Healthy {
				dev.Health = pluginapi.Unhealthy
			}
			if d.NUMANodes != nil {
				dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{}}
				for _, n := range *d.NUMANodes {
					dev.Topology.Nodes = append(dev.Topology.Nodes, &pluginapi.NUMANode{ID: int64(n)})
				}
			}
			out = append(out, dev)
		}
		return out
	}
	startAll := func(allHealthy bool, rules map[string]*preferredRule) ([]*stubPlugin, error) {
		var stubs []*stubPlugin
		want := map[string][2]int64{}
		for i, res := range names {
			devs := mkDevices(res, allHealthy)
			s, err := startStub(w, i, res, devs, rules[res])
			if err != nil {
				for _, s := range stubs {
					s.close()
				}
				return nil, err
			}
			stubs = append(stubs, s)
			healthy := int64(0)
			for _, d := range devs {
				if d.Health == pluginapi.Healthy {
					healthy++
				}
			}
			want[res] = [2]int64{int64(len(devs)), healthy}
		}
		return stubs, waitCapacity(w, want)
	}
	closeAll := func(stubs []*stubPlugin) {
		for _, s := range stubs {
			s.close()
		}
	}

	// Phase 1 (only with in_use): a filler pod takes exactly the in-use devices under
	// policy none (the kubelet asks the plugin for all of them), then the kubelet
	// "restarts" with the case's policy over the same checkpoint, the filler still active.
	filler := podSpec{Name: "filler", UID: fmt.Sprintf("filler-%v", c.ID)}
	fillerLimits := map[string]int64{}
	fillRules := map[string]*preferredRule{}
	for res, ids := range c.InUse {
		if len(ids) > 0 {
			fillerLimits[res] = int64(len(ids))
			fillRules[res] = &preferredRule{fixed: ids}
		}
	}
	if len(fillerLimits) > 0 {
		filler.Containers = []containerSpec{{Name: "hold", Limits: fillerLimits}}
		k, err := newKubeletCM(w, "none", "container", nil)
		if err != nil {
			return nil, err
		}
		if err := k.run(w); err != nil {
			return nil, err
		}
		w.kubelet = k
		stubs, err := startAll(true, fillRules)
		if err != nil {
			k.dm.stop()
			return nil, err
		}
		r, err := w.admit(filler)
		closeAll(stubs)
		k.dm.stop()
		w.kubelet = nil
		if err != nil {
			return nil, err
		}
		if !r.Admit {
			return nil, fmt.Errorf("filler pod for in_use rejected: %s %s", r.Reason, r.Message)
		}
		for res, ids := range c.InUse {
			got := r.Containers[0].Devices[res]
			if len(got) != len(ids) {
				return nil, fmt.Errorf("filler got %v for %s, wanted %v", got, res, ids)
			}
			for _, id := range ids {
				if _, ok := got[id]; !ok {
					return nil, fmt.Errorf("filler got %v for %s, wanted %v", got, res, ids)
				}
			}
		}
	}

	// Phase 2: the case's kubelet, the stubs with real health and the case's rule.
	rules := map[string]*preferredRule{}
	for _, res := range names {
		r, err := parseRule(c.Resources[res].Preferred)
		if err != nil {
			return nil, err
		}
		rules[res] = r
	}
	k, err := newKubeletCM(w, c.Policy, c.scope(), c.Options)
	if err != nil {
		return nil, err
	}
	if err := k.run(w); err != nil {
		return nil, err
	}
	w.kubelet = k
	defer func() { k.dm.stop(); w.kubelet = nil }()
	if len(fillerLimits) > 0 {
		held := k.dm.devices(filler.UID, "hold")
		for res, ids := range c.InUse {
			for _, id := range ids {
				if _, ok := held[res][id]; !ok {
					return nil, fmt.Errorf("%w: %s %s missing (held: %v)", errStaleCheckpoint, res, id, held)
				}
			}
		}
	}
	stubs, err := startAll(false, rules)
	if err != nil {
		return nil, err
	}
	defer closeAll(stubs)

	spec := podSpec{Name: c.Pod.Name, UID: c.Pod.UID}
	if spec.UID == "" {
		spec.UID = "pod"
	}
	if spec.Name == "" {
		spec.Name = spec.UID
	}
	for _, ic := range c.Pod.InitContainers {
		spec.InitContainers = append(spec.InitContainers, containerSpec{Name: ic.Name, Limits: ic.Limits, Restartable: ic.Restartable})
	}
	for _, ac := range c.Pod.Containers {
		spec.Containers = append(spec.Containers, containerSpec{Name: ac.Name, Limits: ac.Limits})
	}
	r, err := w.admit(spec)
	if err != nil {
		return nil, err
	}
	affinities := map[string]any{}
	var allocations []allocCall
	for _, cr := range r.Containers {
		h := k.tm.affinity(r.UID, cr.Name)
		affinities[cr.Name] = hintOut(h)
		for _, res := range names {
			if devs, ok := cr.Devices[res]; ok && len(devs) > 0 {
				var ids []string
				for id := range devs {
					ids = append(ids, id)
				}
				allocations = append(allocations, allocCall{Container: cr.Name, Resource: res, Devices: sortedCopy(ids)})
			}
		}
	}
	var prefs []prefCall
	var allocs []allocCall
	for _, s := range stubs {
		s.mu.Lock()
		prefs = append(prefs, s.prefs...)
		allocs = append(allocs, s.allocs...)
		s.mu.Unlock()
	}
	hints := map[string]any{}
	for k, v := range w.hints {
		hints[k] = hintsOut(v)
	}
	return map[string]any{
		"admit": r.Admit, "reason": r.Reason, "message": r.Message, "error": nil,
		"affinities": affinities, "allocations": allocations, "preferred_calls": prefs,
		"allocate_calls": allocs, "hints": hints,
	}, nil
}
