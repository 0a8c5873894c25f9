package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The tap observes what the real kubelet asks our plugin. The daemon is pointed at
// --device-plugin-path=<tap dir>, where the tap serves a Registration service. When
// the daemon registers, the tap serves a pass-through DevicePlugin on
// /var/lib/kubelet/device-plugins/tap-<endpoint> and registers that with the real
// kubelet.sock. Every RPC is forwarded unchanged and logged with the pod and
// container being admitted. Only the admission scenarios use it; the life-cycle
// scenarios (registration, restarts, re-registration) run the daemon against
// kubelet.sock directly.

type rpcRecord struct {
	T         float64 `json:"t"`
	Method    string  `json:"method"`
	Resource  string  `json:"resource"`
	Pod       string  `json:"pod"`
	Container string  `json:"container"`
	Request   any     `json:"request"`
	Response  any     `json:"response"`
	Error     string  `json:"error,omitempty"`
}

type prefReqJSON struct {
	Available   []string `json:"available"`
	MustInclude []string `json:"must_include"`
	Size        int32    `json:"size"`
}

func sortedCopy(s []string) []string {
	out := append([]string{}, s...)
	sort.Strings(out)
	if out == nil {
		out = []string{}
	}
	return out
}

func (w *world) logRPC(r rpcRecord) {
	r.Pod, r.Container = w.current()
	r.T = time.Since(w.t0).Seconds()
	w.mu.Lock()
	w.rpcs = append(w.rpcs, r)
	w.mu.Unlock()
}

func (w *world) rpcLog() []rpcRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]rpcRecord{}, w.rpcs...)
}

type tapRegistration struct {
	T        float64                        `json:"t"`
	Resource string                         `json:"resource"`
	Endpoint string                         `json:"endpoint"`
	Version  string                         `json:"version"`
	Options  *pluginapi.DevicePluginOptions `json:"options"`
	Error    string                         `json:"error,omitempty"`
}

type tap struct {
	pluginapi.UnimplementedRegistrationServer
	w       *world
	dir     string
	srv     *grpc.Server
	mu      sync.Mutex
	regs    []tapRegistration
	proxies []*grpc.Server
}

func startTap(w *world, dir string) (*tap, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "kubelet.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	t := &tap{w: w, dir: dir, srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(t.srv, t)
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

func (t *tap) stop() {
	t.srv.Stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.proxies {
		p.Stop()
	}
}

func (t *tap) registrations() []tapRegistration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]tapRegistration{}, t.regs...)
}

func dialUnix(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func (t *tap) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	rec := tapRegistration{T: time.Since(t.w.t0).Seconds(), Resource: req.ResourceName, Endpoint: req.Endpoint, Version: req.Version, Options: req.Options}
	err := t.register(ctx, req)
	if err != nil {
		rec.Error = err.Error()
	}
	t.mu.Lock()
	t.regs = append(t.regs, rec)
	t.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &pluginapi.Empty{}, nil
}

func (t *tap) register(ctx context.Context, req *pluginapi.RegisterRequest) error {
	up, err := dialUnix(filepath.Join(t.dir, req.Endpoint))
	if err != nil {
		return err
	}
	name := "tap-" + filepath.Base(req.Endpoint)
	path := filepath.Join(pluginapi.DevicePluginPath, name)
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	ps := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(ps, &proxy{res: req.ResourceName, up: pluginapi.NewDevicePluginClient(up), w: t.w})
	go func() { _ = ps.Serve(ln) }()
	t.mu.Lock()
	t.proxies = append(t.proxies, ps)
	t.mu.Unlock()
	kc, err := dialUnix(pluginapi.KubeletSocket)
	if err != nil {
		return err
	}
	defer kc.Close()
	_, err = pluginapi.NewRegistrationClient(kc).Register(ctx, &pluginapi.RegisterRequest{
		Version: req.Version, Endpoint: name, ResourceName: req.ResourceName, Options: req.Options,
	})
	if err != nil {
		return fmt.Errorf("registering tap with the kubelet: %w", err)
	}
	return nil
}

type proxy struct {
	pluginapi.UnimplementedDevicePluginServer
	res string
	up  pluginapi.DevicePluginClient
	w   *world
}

func (p *proxy) GetDevicePluginOptions(ctx context.Context, e *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.up.GetDevicePluginOptions(ctx, e)
}

func (p *proxy) ListAndWatch(e *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	st, err := p.up.ListAndWatch(s.Context(), e)
	if err != nil {
		return err
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		if err := s.Send(m); err != nil {
			return err
		}
	}
}

func (p *proxy) GetPreferredAllocation(ctx context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp, err := p.up.GetPreferredAllocation(ctx, r)
	rec := rpcRecord{Method: "GetPreferredAllocation", Resource: p.res}
	var reqs []prefReqJSON
	for _, c := range r.ContainerRequests {
		reqs = append(reqs, prefReqJSON{Available: sortedCopy(c.AvailableDeviceIDs), MustInclude: sortedCopy(c.MustIncludeDeviceIDs), Size: c.AllocationSize})
	}
	rec.Request = reqs
	if err != nil {
		rec.Error = err.Error()
	} else {
		var outs [][]string
		for _, c := range resp.ContainerResponses {
			outs = append(outs, append([]string{}, c.DeviceIDs...))
		}
		rec.Response = outs
	}
	p.w.logRPC(rec)
	return resp, err
}

func (p *proxy) Allocate(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp, err := p.up.Allocate(ctx, r)
	rec := rpcRecord{Method: "Allocate", Resource: p.res}
	var reqs [][]string
	for _, c := range r.ContainerRequests {
		reqs = append(reqs, sortedCopy(c.DevicesIds))
	}
	rec.Request = reqs
	if err != nil {
		rec.Error = err.Error()
	} else {
		rec.Response = resp
	}
	p.w.logRPC(rec)
	return resp, err
}

func (p *proxy) PreStartContainer(ctx context.Context, r *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	resp, err := p.up.PreStartContainer(ctx, r)
	rec := rpcRecord{Method: "PreStartContainer", Resource: p.res, Request: sortedCopy(r.DevicesIds)}
	if err != nil {
		rec.Error = err.Error()
	}
	p.w.logRPC(rec)
	return resp, err
}
