package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// A script is a list of steps run in order inside the sandbox; each step's result
// (with "ok" and "error") goes to the output. pytest writes the scripts and asserts
// on the results; the harness only drives the real kubelet code and reports.
type script struct {
	Machine machine           `json:"machine"`
	Steps   []json.RawMessage `json:"steps"`
}

type world struct {
	workdir string
	root    string
	machine machine
	sources *readySources
	t0      time.Time

	mu           sync.Mutex
	pods         []*v1.Pod
	hints        map[string]map[string][]topologymanager.TopologyHint
	curPod       string
	curContainer string
	rpcs         []rpcRecord

	kubelet *kubeletCM
	plugins map[string]*pluginProc
	tap     *tap
	nextLog int
}

type pluginProc struct {
	ID       string
	Argv     []string
	cmd      *exec.Cmd
	done     chan struct{}
	exitCode int
	exitMsg  string
	log      string
	started  time.Time
}

func (p *pluginProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

type stepHeader struct {
	Op string `json:"op"`
}

func runScript(w *world, sc script) []map[string]any {
	var results []map[string]any
	for i, raw := range sc.Steps {
		var h stepHeader
		_ = json.Unmarshal(raw, &h)
		start := time.Now()
		res, err := w.step(h.Op, raw)
		if res == nil {
			res = map[string]any{}
		}
		res["i"] = i
		res["op"] = h.Op
		res["t"] = time.Since(w.t0).Seconds()
		res["elapsed_s"] = time.Since(start).Seconds()
		res["ok"] = err == nil
		if err != nil {
			res["error"] = err.Error()
		}
		results = append(results, res)
		if err != nil {
			fmt.Fprintf(os.Stderr, "harness: step %d (%s) failed: %v\n", i, h.Op, err)
		}
	}
	return results
}

// startKubelet wires and starts a fresh kubelet container manager (Topology Manager,
// device manager and the other hint providers) over the shared directory.
func (w *world) startKubelet(policy, scope string, options map[string]string) (map[string]any, error) {
	k, err := newKubeletCM(w, policy, scope, options)
	if err != nil {
		return nil, err
	}
	if err := k.run(w); err != nil {
		return nil, err
	}
	w.kubelet = k
	return map[string]any{"policy": policy, "scope": scope}, nil
}

func (w *world) step(op string, raw json.RawMessage) (map[string]any, error) {
	switch op {
	case "start_kubelet":
		var a struct {
			Policy       string            `json:"policy"`
			Scope        string            `json:"scope"`
			Options      map[string]string `json:"options"`
			SourcesReady *bool             `json:"sources_ready"`
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		if a.Policy == "" {
			a.Policy = "none"
		}
		if a.Scope == "" {
			a.Scope = "container"
		}
		if a.SourcesReady != nil {
			w.sources.set(*a.SourcesReady)
		}
		if w.kubelet != nil {
			return nil, fmt.Errorf("a kubelet is already running")
		}
		return w.startKubelet(a.Policy, a.Scope, a.Options)

	case "stop_kubelet", "restart_kubelet":
		var a struct {
			StaleSocket  bool              `json:"stale_socket"`
			Policy       string            `json:"policy"`
			Scope        string            `json:"scope"`
			Options      map[string]string `json:"options"`
			SourcesReady *bool             `json:"sources_ready"`
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		old := w.kubelet
		if old == nil {
			return nil, fmt.Errorf("no kubelet running")
		}
		// Stop ends the registration server and closes every plugin connection: what
		// a plugin sees when the kubelet process goes away.
		if err := old.dm.stop(); err != nil {
			return nil, err
		}
		w.kubelet = nil
		if a.StaleSocket {
			// A killed kubelet leaves its socket file behind; Start cleans it up.
			if err := leaveStaleSocket(pluginapi.KubeletSocket); err != nil {
				return nil, err
			}
		}
		if op == "stop_kubelet" {
			return nil, nil
		}
		if a.Policy == "" {
			a.Policy, a.Scope, a.Options = old.Policy, old.Scope, old.Options
		}
		if a.SourcesReady != nil {
			w.sources.set(*a.SourcesReady)
		}
		return w.startKubelet(a.Policy, a.Scope, a.Options)

	case "set_sources_ready":
		var a struct {
			Ready bool `json:"ready"`
		}
		_ = json.Unmarshal(raw, &a)
		w.sources.set(a.Ready)
		return nil, nil

	case "start_tap":
		var a struct {
			Dir string `json:"dir"`
		}
		_ = json.Unmarshal(raw, &a)
		if a.Dir == "" {
			a.Dir = filepath.Join(kubeletDir, "tap")
		}
		t, err := startTap(w, a.Dir)
		if err != nil {
			return nil, err
		}
		w.tap = t
		return map[string]any{"dir": a.Dir}, nil

	case "start_plugin":
		var a struct {
			ID   string            `json:"id"`
			Argv []string          `json:"argv"`
			Env  map[string]string `json:"env"`
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		if a.ID == "" {
			a.ID = "plugin"
		}
		if p, ok := w.plugins[a.ID]; ok && p.running() {
			return nil, fmt.Errorf("plugin %q is still running", a.ID)
		}
		w.nextLog++
		logPath := filepath.Join(w.workdir, fmt.Sprintf("plugin-%s-%d.log", a.ID, w.nextLog))
		lf, err := os.Create(logPath)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(a.Argv[0], a.Argv[1:]...)
		cmd.Stdout, cmd.Stderr = lf, lf
		cmd.Env = os.Environ()
		for k, v := range a.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			lf.Close()
			return nil, err
		}
		p := &pluginProc{ID: a.ID, Argv: a.Argv, cmd: cmd, done: make(chan struct{}), log: logPath, started: time.Now()}
		go func() {
			err := cmd.Wait()
			lf.Close()
			p.exitCode = cmd.ProcessState.ExitCode()
			if err != nil {
				p.exitMsg = err.Error()
			}
			close(p.done)
		}()
		w.plugins[a.ID] = p
		return map[string]any{"id": a.ID, "pid": cmd.Process.Pid, "log": logPath}, nil

	case "signal_plugin":
		var a struct {
			ID     string  `json:"id"`
			Signal string  `json:"signal"`
			WaitS  float64 `json:"wait_s"`
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		if a.ID == "" {
			a.ID = "plugin"
		}
		p, ok := w.plugins[a.ID]
		if !ok {
			return nil, fmt.Errorf("no plugin %q", a.ID)
		}
		sig := map[string]syscall.Signal{"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP}[a.Signal]
		if sig == 0 {
			return nil, fmt.Errorf("unknown signal %q", a.Signal)
		}
		t0 := time.Now()
		_ = p.cmd.Process.Signal(sig)
		if a.WaitS <= 0 {
			a.WaitS = 10
		}
		select {
		case <-p.done:
			return map[string]any{"exited": true, "exit_code": p.exitCode, "exit": p.exitMsg, "exit_s": time.Since(t0).Seconds()}, nil
		case <-time.After(time.Duration(a.WaitS * float64(time.Second))):
			return map[string]any{"exited": false}, nil
		}

	case "plugin_status":
		var a struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(raw, &a)
		if a.ID == "" {
			a.ID = "plugin"
		}
		p, ok := w.plugins[a.ID]
		if !ok {
			return nil, fmt.Errorf("no plugin %q", a.ID)
		}
		out := map[string]any{"running": p.running(), "log": p.log}
		if !p.running() {
			out["exit_code"] = p.exitCode
		}
		return out, nil

	case "wait_resource":
		return w.waitResource(raw)

	case "wait_registrations":
		return w.waitRegistrations(raw)

	case "wait_checkpoint":
		return w.waitCheckpoint(raw)

	case "snapshot":
		return w.snapshot()

	case "admit":
		var a struct {
			Pod podSpec `json:"pod"`
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		r, err := w.admit(a.Pod)
		if err != nil {
			return nil, err
		}
		b, _ := json.Marshal(r)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return m, nil

	case "delete_pod":
		var a struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(raw, &a)
		p := w.removePod(a.Name)
		if p == nil {
			return nil, fmt.Errorf("no active pod %q", a.Name)
		}
		if w.kubelet != nil {
			for _, c := range allContainers(p) {
				_ = w.kubelet.tm.removeContainer(fakeContainerID(p, c.Name))
			}
		}
		return nil, nil

	case "run_options":
		// GetDeviceRunContainerOptions again for an active pod (a container restart).
		var a struct {
			Pod       string `json:"pod"`
			Container string `json:"container"`
		}
		_ = json.Unmarshal(raw, &a)
		for _, p := range w.activePods() {
			if p.Name != a.Pod {
				continue
			}
			for _, c := range allContainers(p) {
				if c.Name == a.Container {
					c := c
					opts, err := w.kubelet.dm.runOptions(p, &c)
					b, _ := json.Marshal(runOptionsOut(opts))
					var m any
					_ = json.Unmarshal(b, &m)
					return map[string]any{"run_options": m, "devices": devicesOut(w.kubelet.dm.devices(string(p.UID), c.Name))}, err
				}
			}
		}
		return nil, fmt.Errorf("no active container %s/%s", a.Pod, a.Container)

	case "write_file":
		var a struct {
			Path    string `json:"path"`
			Content string `json:"content"`
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		// Write then rename, as an editor or a config-map update does.
		tmp := a.Path + ".harness-tmp"
		if err := os.WriteFile(tmp, []byte(a.Content), 0o644); err != nil {
			return nil, err
		}
		return nil, os.Rename(tmp, a.Path)

	case "remove_file":
		var a struct {
			Path string `json:"path"`
		}
		_ = json.Unmarshal(raw, &a)
		return nil, os.Remove(a.Path)

	case "sleep":
		var a struct {
			Seconds float64 `json:"seconds"`
		}
		_ = json.Unmarshal(raw, &a)
		time.Sleep(time.Duration(a.Seconds * float64(time.Second)))
		return nil, nil

	case "call_preferred":
		var a struct {
			Socket      string   `json:"socket"`
			Available   []string `json:"available"`
			MustInclude []string `json:"must_include"`
			Size        int32    `json:"size"`
		}
		if err := json.Unmarshal(raw, &a); err != nil {
			return nil, err
		}
		conn, err := dialUnix(a.Socket)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := pluginapi.NewDevicePluginClient(conn).GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: a.Available, MustIncludeDeviceIDs: a.MustInclude, AllocationSize: a.Size}},
		})
		if err != nil {
			return nil, err
		}
		var out [][]string
		for _, c := range resp.ContainerResponses {
			out = append(out, c.DeviceIDs)
		}
		return map[string]any{"response": out}, nil

	default:
		return nil, fmt.Errorf("unknown op %q", op)
	}
}

func leaveStaleSocket(path string) error {
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln.Close()
}

func quantities(rl v1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for k, v := range rl {
		out[string(k)] = v.Value()
	}
	return out
}

func (w *world) capacity() (map[string]int64, map[string]int64, []string) {
	if w.kubelet == nil {
		return map[string]int64{}, map[string]int64{}, []string{}
	}
	c, a, inactive := w.kubelet.dm.capacity()
	sort.Strings(inactive)
	if inactive == nil {
		inactive = []string{}
	}
	return quantities(c), quantities(a), inactive
}

func (w *world) waitResource(raw json.RawMessage) (map[string]any, error) {
	var a struct {
		Resource    string  `json:"resource"`
		Capacity    *int64  `json:"capacity"`
		Allocatable *int64  `json:"allocatable"`
		Inactive    *bool   `json:"inactive"`
		Timeout     float64 `json:"timeout"`
		HoldS       float64 `json:"hold_s"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	if a.Timeout <= 0 {
		a.Timeout = 15
	}
	check := func() (bool, map[string]any) {
		c, al, inactive := w.capacity()
		isInactive := false
		for _, r := range inactive {
			if r == a.Resource {
				isInactive = true
			}
		}
		cv, cok := c[a.Resource]
		av, aok := al[a.Resource]
		ok := true
		if a.Capacity != nil && (!cok || cv != *a.Capacity) {
			ok = false
		}
		if a.Allocatable != nil && (!aok || av != *a.Allocatable) {
			ok = false
		}
		if a.Inactive != nil && isInactive != *a.Inactive {
			ok = false
		}
		state := map[string]any{"capacity": nilIfMissing(cv, cok), "allocatable": nilIfMissing(av, aok), "inactive": isInactive}
		return ok, state
	}
	t0 := time.Now()
	deadline := t0.Add(time.Duration(a.Timeout * float64(time.Second)))
	for {
		ok, state := check()
		if ok {
			state["reached_s"] = time.Since(t0).Seconds()
			if a.HoldS > 0 {
				holdEnd := time.Now().Add(time.Duration(a.HoldS * float64(time.Second)))
				for time.Now().Before(holdEnd) {
					time.Sleep(50 * time.Millisecond)
					if ok2, st2 := check(); !ok2 {
						state["held"] = false
						state["broke_after_s"] = time.Since(t0).Seconds()
						state["broken_state"] = st2
						return state, fmt.Errorf("%s left the expected state after %.2fs: %v", a.Resource, time.Since(t0).Seconds(), st2)
					}
				}
				state["held"] = true
			}
			return state, nil
		}
		if time.Now().After(deadline) {
			state["timed_out"] = true
			return state, fmt.Errorf("timed out after %.1fs waiting for %s (last: %v)", a.Timeout, a.Resource, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pollState calls check until it reports done or timeoutS passes (30 s if unset), and
// returns check's last state with reached_s or timed_out added.
func pollState(timeoutS float64, what string, check func() (bool, map[string]any)) (map[string]any, error) {
	if timeoutS <= 0 {
		timeoutS = 30
	}
	t0 := time.Now()
	for {
		done, state := check()
		if done {
			state["reached_s"] = time.Since(t0).Seconds()
			return state, nil
		}
		if time.Since(t0) > time.Duration(timeoutS*float64(time.Second)) {
			state["timed_out"] = true
			return state, fmt.Errorf("timed out after %.1fs waiting for %s (last: %v)", timeoutS, what, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRegistrations polls the kubelet's own registration counter for a resource until
// it reaches at_least: proof that a Register call arrived, whatever the timing.
func (w *world) waitRegistrations(raw json.RawMessage) (map[string]any, error) {
	var a struct {
		Resource string  `json:"resource"`
		AtLeast  float64 `json:"at_least"`
		Timeout  float64 `json:"timeout"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	return pollState(a.Timeout, fmt.Sprintf("%v registrations of %s", a.AtLeast, a.Resource), func() (bool, map[string]any) {
		n := registrationCounts()[a.Resource]
		return n >= a.AtLeast, map[string]any{"count": n}
	})
}

// waitCheckpoint polls the device manager's checkpoint file until it records `registered`
// healthy devices for a resource (the kubelet writes it after updating its device maps).
func (w *world) waitCheckpoint(raw json.RawMessage) (map[string]any, error) {
	var a struct {
		Resource   string  `json:"resource"`
		Registered int     `json:"registered"`
		Timeout    float64 `json:"timeout"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	return pollState(a.Timeout, fmt.Sprintf("%d registered %s devices in the checkpoint", a.Registered, a.Resource), func() (bool, map[string]any) {
		have := -1
		if cp, err := readCheckpoint(); err == nil {
			have = len(cp["registered_devices"].(map[string][]string)[a.Resource])
		}
		return have == a.Registered, map[string]any{"registered": have}
	})
}

func nilIfMissing(v int64, ok bool) any {
	if !ok {
		return nil
	}
	return v
}

func registrationCounts() map[string]float64 {
	out := map[string]float64{}
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubelet_device_plugin_registration_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "resource_name" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func (w *world) snapshot() (map[string]any, error) {
	c, a, inactive := w.capacity()
	out := map[string]any{"capacity": c, "allocatable": a, "inactive": inactive, "registrations": registrationCounts()}
	if w.kubelet != nil {
		out["allocatable_devices"] = devicesOut(w.kubelet.dm.allocatable())
	}
	entries, _ := os.ReadDir(pluginapi.DevicePluginPath)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	out["device_plugin_dir"] = names
	if cp, err := readCheckpoint(); err == nil {
		out["checkpoint"] = cp
	} else {
		out["checkpoint_error"] = err.Error()
	}
	var pods []string
	for _, p := range w.activePods() {
		pods = append(pods, p.Name)
	}
	out["active_pods"] = pods
	if w.tap != nil {
		out["tap_registrations"] = w.tap.registrations()
	}
	plugins := map[string]any{}
	for id, p := range w.plugins {
		plugins[id] = map[string]any{"running": p.running(), "log": p.log}
	}
	out["plugins"] = plugins
	return out, nil
}

// readCheckpoint decodes the device manager checkpoint, with each AllocResp (a
// protobuf ContainerAllocateResponse) expanded.
func readCheckpoint() (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join(pluginapi.DevicePluginPath, "kubelet_internal_checkpoint"))
	if err != nil {
		return nil, err
	}
	var cp struct {
		Data struct {
			PodDeviceEntries []struct {
				PodUID        string
				ContainerName string
				ResourceName  string
				DeviceIDs     map[string][]string
				AllocResp     string
			}
			RegisteredDevices map[string][]string
		}
		Checksum uint64
	}
	if err := json.Unmarshal(b, &cp); err != nil {
		return nil, err
	}
	var entries []map[string]any
	for _, e := range cp.Data.PodDeviceEntries {
		ent := map[string]any{"pod_uid": e.PodUID, "container": e.ContainerName, "resource": e.ResourceName, "device_ids": e.DeviceIDs}
		if raw, err := base64.StdEncoding.DecodeString(e.AllocResp); err == nil {
			var r pluginapi.ContainerAllocateResponse
			if err := proto.Unmarshal(raw, &r); err == nil {
				ent["envs"] = r.Envs
				var cdi []string
				for _, d := range r.CdiDevices {
					cdi = append(cdi, d.Name)
				}
				ent["cdi_devices"] = cdi
			}
		}
		entries = append(entries, ent)
	}
	for _, ids := range cp.Data.RegisteredDevices {
		sort.Strings(ids)
	}
	return map[string]any{"entries": entries, "registered_devices": cp.Data.RegisteredDevices}, nil
}

func (w *world) shutdown() {
	for _, p := range w.plugins {
		if p.running() {
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
		}
	}
	if w.tap != nil {
		w.tap.stop()
	}
	if w.kubelet != nil {
		_ = w.kubelet.dm.stop()
	}
}
