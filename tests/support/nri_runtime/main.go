// nri-runtime: the runtime side of NRI, from github.com/containerd/nri v0.8.0
// pkg/adaptation (the code containerd v2.1.4 runs), on a socket of the test's
// choosing, driven through JSON lines so tests/nri can exercise plugin/nri
// against the real protocol implementation instead of a hand-written double.
//
//	nri-runtime -socket PATH [-pods JSON]   (-pods: a list of pods as in add_pod, known from the start)
//
// stdin, one JSON object a line:
//
//	{"cmd": "add_pod", "pod": {"id", "uid", "namespace", "name", "netns", "pad"}}  a pod the runtime knows (Synchronize lists it)
//	{"cmd": "run_pod" | "stop_pod" | "remove_pod", "id": POD_ID}          relay that event to the plugins
//	{"cmd": "quit"}                                                        stop and exit (a runtime restart is: quit, start a new process)
//
// stdout, one JSON object a line: {"reply": CMD, "error": "...", "us": N} for every
// command, in order (us: microseconds the runtime spent on it, the plugins' round trips
// included); {"event": "registered", "plugin": "IDX-NAME"} when a plugin's
// RegisterPlugin call is accepted; {"event": "synchronized", "pods": [UID...], "error": "..."}
// each time a connected plugin has been configured and synchronized; {"event": "connected",
// "plugin": ...} once the runtime has added it to the plugins its events go to; {"event": "closed",
// "plugin": ...} when the runtime sees a plugin connection close. The runtime's own
// log goes to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	nrilog "github.com/containerd/nri/pkg/log"
)

type podSpec struct {
	ID        string `json:"id"`
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Netns     string `json:"netns"`
	// Pad: an annotation of this many bytes, to make Synchronize outgrow one ttrpc message.
	Pad int `json:"pad"`
}

type command struct {
	Cmd string  `json:"cmd"`
	ID  string  `json:"id"`
	Pod podSpec `json:"pod"`
}

type runtime struct {
	socket string
	dir    string
	out    *json.Encoder
	outMu  sync.Mutex
	podsMu sync.Mutex
	pods   []*api.PodSandbox
	nri    *adaptation.Adaptation
	// registered counts plugins that registered and were not yet synchronized: Start() also
	// synchronizes the (absent) pre-installed plugins, which is not a plugin connecting.
	registered int
}

// logger forwards NRI's log to stderr and turns the lines that mark a plugin's
// registration, admission and disconnection into events (their format is pinned with nri v0.8.0).
type logger struct{ r *runtime }

func (l logger) line(level, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nri-runtime %s: %s\n", level, fmt.Sprintf(format, args...))
}
func (l logger) Debugf(_ context.Context, format string, args ...any) {
	l.line("debug", format, args...)
}
func (l logger) Warnf(_ context.Context, format string, args ...any) { l.line("warn", format, args...) }
func (l logger) Errorf(_ context.Context, format string, args ...any) {
	l.line("error", format, args...)
}
func (l logger) Infof(_ context.Context, format string, args ...any) {
	l.line("info", format, args...)
	switch {
	case format == "plugin %q registered as %q" && len(args) == 2:
		l.r.podsMu.Lock()
		l.r.registered++
		l.r.podsMu.Unlock()
		l.r.emit(map[string]any{"event": "registered", "plugin": fmt.Sprint(args[1])})
	case format == "plugin %q connected and synchronized" && len(args) == 1:
		l.r.emit(map[string]any{"event": "connected", "plugin": fmt.Sprint(args[0])})
	case format == "connection to plugin %q closed" && len(args) == 1:
		l.r.emit(map[string]any{"event": "closed", "plugin": fmt.Sprint(args[0])})
	}
}

func (r *runtime) emit(v map[string]any) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	_ = r.out.Encode(v)
}

func (r *runtime) snapshot() []*api.PodSandbox {
	r.podsMu.Lock()
	defer r.podsMu.Unlock()
	return append([]*api.PodSandbox(nil), r.pods...)
}

func (r *runtime) find(id string) *api.PodSandbox {
	r.podsMu.Lock()
	defer r.podsMu.Unlock()
	for _, p := range r.pods {
		if p.Id == id {
			return p
		}
	}
	return nil
}

// synchronize is what containerd does when a plugin connects: hand it every pod it knows.
func (r *runtime) synchronize(ctx context.Context, cb adaptation.SyncCB) error {
	pods := r.snapshot()
	_, err := cb(ctx, pods, nil)
	r.podsMu.Lock()
	connecting := r.registered > 0
	if connecting {
		r.registered--
	}
	r.podsMu.Unlock()
	if !connecting {
		return err
	}
	uids := []string{}
	for _, p := range pods {
		uids = append(uids, p.Uid)
	}
	r.emit(map[string]any{"event": "synchronized", "pods": uids, "error": errText(err)})
	return err
}

func (r *runtime) start() error {
	update := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
	nri, err := adaptation.New("nri-runtime", "v0.8.0", r.synchronize, update,
		adaptation.WithSocketPath(r.socket),
		// Pre-installed plugins: none (an empty directory of our own).
		adaptation.WithPluginPath(filepath.Join(r.dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(r.dir, "conf.d")))
	if err != nil {
		return err
	}
	if err := nri.Start(); err != nil {
		return err
	}
	r.nri = nri
	return nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// add makes a pod known to the runtime (Synchronize lists it); netns is its network namespace path.
func (r *runtime) add(s podSpec) {
	p := &api.PodSandbox{Id: s.ID, Uid: s.UID, Namespace: s.Namespace, Name: s.Name,
		Linux: &api.LinuxPodSandbox{Namespaces: []*api.LinuxNamespace{{Type: "ipc", Path: "/proc/1/ns/ipc"}}}}
	if s.Pad > 0 {
		p.Annotations = map[string]string{"pad": strings.Repeat("x", s.Pad)}
	}
	if s.Netns != "" {
		p.Linux.Namespaces = append(p.Linux.Namespaces, &api.LinuxNamespace{Type: "network", Path: s.Netns})
	}
	r.podsMu.Lock()
	r.pods = append(r.pods, p)
	r.podsMu.Unlock()
}

func (r *runtime) handle(ctx context.Context, c command) error {
	switch c.Cmd {
	case "add_pod":
		r.add(c.Pod)
		return nil
	case "run_pod", "stop_pod", "remove_pod":
		pod := r.find(c.ID)
		if pod == nil {
			return fmt.Errorf("no pod %q (add_pod first)", c.ID)
		}
		evt := &api.StateChangeEvent{Pod: pod}
		switch c.Cmd {
		case "run_pod":
			return r.nri.RunPodSandbox(ctx, evt)
		case "stop_pod":
			return r.nri.StopPodSandbox(ctx, evt)
		}
		err := r.nri.RemovePodSandbox(ctx, evt)
		r.podsMu.Lock()
		for i, p := range r.pods {
			if p == pod {
				r.pods = append(r.pods[:i], r.pods[i+1:]...)
				break
			}
		}
		r.podsMu.Unlock()
		return err
	}
	return fmt.Errorf("unknown command %q", c.Cmd)
}

func main() {
	socket := flag.String("socket", "", "path of the NRI socket to listen on")
	pods := flag.String("pods", "[]", "JSON list of pods the runtime knows from the start")
	flag.Parse()
	if *socket == "" {
		fmt.Fprintln(os.Stderr, "nri-runtime: -socket PATH is required")
		os.Exit(2)
	}
	r := &runtime{socket: *socket, dir: filepath.Dir(*socket), out: json.NewEncoder(os.Stdout)}
	nrilog.Set(logger{r})
	var initial []podSpec
	if err := json.Unmarshal([]byte(*pods), &initial); err != nil {
		fmt.Fprintf(os.Stderr, "nri-runtime: -pods: %v\n", err)
		os.Exit(2)
	}
	for _, s := range initial {
		r.add(s)
	}
	if err := r.start(); err != nil {
		fmt.Fprintf(os.Stderr, "nri-runtime: %v\n", err)
		os.Exit(1)
	}
	r.emit(map[string]any{"event": "listening", "socket": *socket})
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var c command
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			r.emit(map[string]any{"reply": "", "error": fmt.Sprintf("bad command line: %v", err)})
			continue
		}
		if c.Cmd == "quit" {
			break
		}
		start := time.Now()
		err := r.handle(ctx, c)
		us := time.Since(start).Microseconds()
		r.emit(map[string]any{"reply": c.Cmd, "id": c.ID, "error": errText(err), "us": us})
	}
	r.nri.Stop()
}
