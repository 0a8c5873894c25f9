// Command harness drives the real kubelet device manager and Topology Manager
// (k8s.io/kubernetes at the release pinned in go.mod) for topo-device-plugin's tests.
//
// Modes:
//
//	harness -mode script -workdir DIR -in script.json -out result.json
//	    Inside a private mount namespace (run under `unshare --mount --propagation
//	    private`; it refuses otherwise), bind-mounts DIR/var-lib-kubelet over
//	    /var/lib/kubelet, then runs the script's steps (start the kubelet's
//	    managers, start our daemon, admit pods, restart things) and writes one
//	    result per step.
//	harness -mode tm-merge -in cases.jsonl -out results.jsonl
//	    Evaluates Topology Manager merge cases with the real policies (no sandbox).
//	harness -mode tm-admission -workdir DIR -in cases.jsonl -out results.jsonl
//	    Admits one pod per case through the real Topology Manager + device manager,
//	    with in-process stub plugins (sandboxed like script mode).
//	harness -mode podresources [-socket PATH]
//	    Prints the kubelet's pod-resources List and GetAllocatableResources as JSON.
//	harness -mode version
//	    Prints the Kubernetes module versions this binary was built from, as JSON.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"k8s.io/klog/v2"
	kubeletmetrics "k8s.io/kubernetes/pkg/kubelet/metrics"
)

func main() {
	mode := flag.String("mode", "script", "script | tm-merge | tm-admission | podresources | version")
	workdir := flag.String("workdir", "", "scratch directory (script, tm-admission)")
	in := flag.String("in", "", "input file")
	out := flag.String("out", "", "output file (default stdout)")
	socket := flag.String("socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "pod-resources socket (mode podresources)")
	klog.InitFlags(nil)
	flag.Parse()
	kubeletmetrics.Register()

	if *mode == "version" {
		os.Stdout.Write(mustJSON(buildVersions()))
		return
	}
	if *mode == "podresources" {
		b, err := podResources(*socket)
		if err != nil {
			fatal(1, "%v", err)
		}
		os.Stdout.Write(append(b, '\n'))
		return
	}
	input, err := os.ReadFile(*in)
	if err != nil {
		fatal(2, "reading input: %v", err)
	}
	var output []byte
	switch *mode {
	case "script":
		output = mustJSON(runScriptMode(*workdir, input))
	case "tm-merge":
		quietKlog()
		output = runCases(input, evalMergeCase)
	case "tm-admission":
		quietKlog()
		if _, err := sandbox(*workdir); err != nil {
			fatal(3, "%v", err)
		}
		output = runCases(input, evalAdmissionCase)
	default:
		fatal(2, "unknown mode %q", *mode)
	}
	if *out == "" {
		os.Stdout.Write(output)
		return
	}
	if err := os.WriteFile(*out, output, 0o644); err != nil {
		fatal(1, "writing output: %v", err)
	}
}

// quietKlog drops the kubelet's info logs (thousands of cases would log megabytes);
// warnings and errors still reach stderr.
func quietKlog() {
	klog.LogToStderr(false)
	klog.SetOutputBySeverity("INFO", io.Discard)
	klog.SetOutputBySeverity("WARNING", os.Stderr)
	klog.SetOutputBySeverity("ERROR", os.Stderr)
	klog.SetOutputBySeverity("FATAL", os.Stderr)
}

// buildVersions reports the k8s.io/kubernetes module and the staging version (that of
// k8s.io/kubelet, after its replace) linked into this binary, and its build tags.
func buildVersions() map[string]string {
	out := map[string]string{"go": runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return out
	}
	for _, d := range info.Deps {
		v := d.Version
		if d.Replace != nil {
			v = d.Replace.Version
		}
		switch d.Path {
		case "k8s.io/kubernetes":
			out["kubernetes"] = v
		case "k8s.io/kubelet":
			out["staging"] = v
		}
	}
	for _, s := range info.Settings {
		if s.Key == "-tags" {
			out["build_tags"] = s.Value
		}
	}
	return out
}

func fatal(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "harness: "+format+"\n", args...)
	os.Exit(code)
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		fatal(1, "encoding output: %v", err)
	}
	return append(b, '\n')
}

func sandbox(workdir string) (string, error) {
	if workdir == "" {
		return "", fmt.Errorf("-workdir is required")
	}
	return enterSandbox(workdir)
}

func runScriptMode(workdir string, input []byte) map[string]any {
	root, err := sandbox(workdir)
	if err != nil {
		fatal(3, "%v", err)
	}
	var sc script
	if err := json.Unmarshal(input, &sc); err != nil {
		fatal(2, "bad script: %v", err)
	}
	w := &world{workdir: workdir, root: root, machine: sc.Machine, sources: &readySources{ready: true}, t0: time.Now(), plugins: map[string]*pluginProc{}}
	defer w.shutdown()
	steps := runScript(w, sc)
	return map[string]any{"root": root, "steps": steps, "rpcs": w.rpcLog()}
}

// runCases evaluates one JSON case per input line and writes one JSON result per line.
func runCases(input []byte, eval func(json.RawMessage) any) []byte {
	var outLines []byte
	sc := bufio.NewScanner(bytesReader(input))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		b, err := json.Marshal(eval(append(json.RawMessage{}, line...)))
		if err != nil {
			fatal(1, "encoding result: %v", err)
		}
		outLines = append(append(outLines, b...), '\n')
	}
	if err := sc.Err(); err != nil {
		fatal(2, "reading cases: %v", err)
	}
	return outLines
}
