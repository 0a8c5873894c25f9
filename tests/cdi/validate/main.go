// cdi-validate checks CDI spec files with the CDI project's own Go code, the way a
// container runtime reads them.
//
// For every *.json / *.yaml file in DIR it reports:
//   - the current library (tags.cncf.io/container-device-interface, what containerd 2.x
//     vendors): strict parse + spec/device/edit validation (cdi.ReadSpec) and the minimum
//     cdiVersion the content needs (cdi.MinimumRequiredVersion);
//   - the v0.5.4 library (github.com/container-orchestrated-devices/container-device-interface,
//     what containerd 1.7.0-1.7.13 vendor): the same ReadSpec, and its JSON schema;
//
// then loads DIR as a runtime does (a CDI Cache: conflicts, errors, the qualified device
// names) and, for every -inject list, injects those devices into an empty OCI spec and
// reports the device nodes, cgroup rules and env the container would get.
//
// Output: one JSON document on stdout. Exit 0 when everything validated and every
// injection resolved, 1 otherwise, 2 on a usage error.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	oldcdi "github.com/container-orchestrated-devices/container-device-interface/pkg/cdi"
	oldschema "github.com/container-orchestrated-devices/container-device-interface/schema"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type fileReport struct {
	Path        string   `json:"path"`
	Kind        string   `json:"kind,omitempty"`
	Version     string   `json:"version,omitempty"`
	MinVersion  string   `json:"minVersion,omitempty"`
	Devices     []string `json:"devices,omitempty"`
	Error       *string  `json:"error"`
	LegacyError *string  `json:"legacyError"`
	SchemaError *string  `json:"schemaError"`
}

type node struct {
	Path  string `json:"path"`
	Type  string `json:"type"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

type injection struct {
	Devices    []string `json:"devices"`
	Unresolved []string `json:"unresolved"`
	Error      *string  `json:"error"`
	Nodes      []node   `json:"deviceNodes"`
	Cgroup     []string `json:"cgroupDevices"`
	Env        []string `json:"env"`
}

type report struct {
	Files       []fileReport        `json:"files"`
	CacheErrors map[string][]string `json:"cacheErrors"`
	Devices     []string            `json:"devices"`
	Injections  []injection         `json:"injections"`
	SchemaCheck *string             `json:"schemaSelfCheck"`
	Panicked    bool                `json:"panicked"`
}

type injectList []string

func (l *injectList) String() string     { return strings.Join(*l, ";") }
func (l *injectList) Set(v string) error { *l = append(*l, v); return nil }

func errText(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}

func main() {
	var injects injectList
	flag.Var(&injects, "inject", "comma-separated qualified CDI device names for one container (repeatable)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: cdi-validate [-inject vendor/class=name,...]... DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	ok := true
	rep := report{CacheErrors: map[string][]string{}, Devices: []string{}, Files: []fileReport{}, Injections: []injection{}}

	// The old library's builtin JSON schema silently becomes a no-op if it cannot load:
	// prove it is live by rejecting a document without cdiVersion/kind/devices.
	schema := oldschema.BuiltinSchema()
	if err := schema.ValidateData([]byte(`{"containerEdits": {}}`)); err == nil {
		msg := "the v0.5.4 builtin JSON schema accepted an empty spec: it did not load"
		rep.SchemaCheck = &msg
		ok = false
	}

	entries, err := os.ReadDir(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".json" && ext != ".yaml") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		fr := fileReport{Path: path}
		spec, err := guarded(func() (*cdi.Spec, error) { return cdi.ReadSpec(path, 0) })
		fr.Error = errText(err)
		if err == nil {
			fr.Kind = spec.Kind
			fr.Version = spec.Version
			fr.MinVersion, _ = cdi.MinimumRequiredVersion(spec.Spec)
			for _, d := range spec.Devices {
				fr.Devices = append(fr.Devices, d.Name)
			}
		}
		_, err = guarded(func() (*oldcdi.Spec, error) { return oldcdi.ReadSpec(path, 0) })
		fr.LegacyError = errText(err)
		fr.SchemaError = errText(schema.ValidateFile(path))
		if fr.Error != nil && strings.HasPrefix(*fr.Error, "panic:") {
			// A spec that crashes the library would crash a runtime's cache refresh too:
			// report it and leave the directory-level checks out.
			ok = false
			rep.Files = append(rep.Files, fr)
			rep.Panicked = true
			continue
		}
		if fr.Error != nil || fr.LegacyError != nil || fr.SchemaError != nil {
			ok = false
		}
		rep.Files = append(rep.Files, fr)
	}

	if rep.Panicked {
		emit(rep, false)
	}
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err := cache.Refresh(); err != nil {
		ok = false
	}
	for path, errs := range cache.GetErrors() {
		for _, e := range errs {
			rep.CacheErrors[path] = append(rep.CacheErrors[path], e.Error())
		}
		ok = false
	}
	rep.Devices = append(rep.Devices, cache.ListDevices()...)
	sort.Strings(rep.Devices)

	for _, list := range injects {
		names := strings.Split(list, ",")
		spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		unresolved, err := cache.InjectDevices(spec, names...)
		inj := injection{Devices: names, Unresolved: unresolved, Error: errText(err), Nodes: []node{}, Cgroup: []string{}, Env: spec.Process.Env}
		if err != nil {
			ok = false
		}
		for _, d := range spec.Linux.Devices {
			inj.Nodes = append(inj.Nodes, node{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor})
		}
		if spec.Linux.Resources != nil {
			for _, r := range spec.Linux.Resources.Devices {
				inj.Cgroup = append(inj.Cgroup, fmt.Sprintf("%v %s %d:%d %s", r.Allow, r.Type, deref(r.Major), deref(r.Minor), r.Access))
			}
		}
		if inj.Env == nil {
			inj.Env = []string{}
		}
		rep.Injections = append(rep.Injections, inj)
	}

	emit(rep, ok)
}

func emit(rep report, ok bool) {
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(rep); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
	os.Exit(0)
}

// guarded runs a library call and turns a panic into an error ("panic: ...").
func guarded[T any](f func() (T, error)) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return f()
}

func deref(p *int64) int64 {
	if p == nil {
		return -1
	}
	return *p
}
