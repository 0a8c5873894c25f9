// Command gpuallocator-real runs NVIDIA's go-gpuallocator (the best-effort policy that NVIDIA's
// device plugin calls for GetPreferredAllocation) on simulated nodes, so that our benchmark
// compares against NVIDIA's own code rather than our description of it.
//
// Why through an NVML mock: go-gpuallocator learns a node's links only through NVML (go-nvml,
// go-nvlib), so each node is served by go-nvml's generated mock (pkg/nvml/mock) answering as a
// driver does: PCI bus IDs, the PCIe common ancestor of every pair, and per GPU the remote PCI
// address of every active NVLink (a peer GPU's, or an NVSwitch's). gpuallocator.NewDevices then
// runs NVIDIA's link discovery unchanged, and its best-effort policy answers each request.
//
// A node may instead give `p2p`, the link types per pair as go-gpuallocator's discovery would
// record them (for synthetic topologies no driver could report, such as a GPU with more NVLinks
// than NVML_NVLINK_MAX_LINKS): the policy then runs on Devices built from that table.
//
// Input (stdin, JSON):
//
//	{"repeats": 3,
//	 "nodes": [{"name": "dgx-h100",
//	            "gpus": [{"bus_id": "00000000:18:00.0", "nvlinks": ["00000000:05:00.0", ...]}, ...],
//	            "ancestor": [[0, 40, ...], ...]}],          // NVML_TOPOLOGY_* per pair
//	 "requests": [{"node": 0, "available": [0, 1, 2], "required": [1], "size": 2}]}
//
// Output (stdout, JSON): per node the link types NVIDIA's discovery recorded for each pair
// (go-gpuallocator's P2PLinkType numbers), and per request the GPUs chosen (-1 stands for the
// padding entry the policy can return) and the fastest of `repeats` timed calls in nanoseconds.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"time"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

type gpuSpec struct {
	BusID   string   `json:"bus_id"`
	NvLinks []string `json:"nvlinks"`
}

type nodeSpec struct {
	Name     string     `json:"name"`
	GPUs     []gpuSpec  `json:"gpus"`
	Ancestor [][]int    `json:"ancestor"`
	P2P      [][][]uint `json:"p2p"`
}

type request struct {
	Node      int   `json:"node"`
	Available []int `json:"available"`
	Required  []int `json:"required"`
	Size      int   `json:"size"`
}

type input struct {
	Repeats  int        `json:"repeats"`
	Nodes    []nodeSpec `json:"nodes"`
	Requests []request  `json:"requests"`
}

type nodeOut struct {
	Name string `json:"name"`
	// Links[i][j]: the P2PLinkType values go-gpuallocator holds for the pair (PCIe level, NVLink count).
	Links [][][]uint `json:"links"`
}

type answer struct {
	Chosen []int `json:"chosen"`
	Ns     int64 `json:"ns"`
}

type output struct {
	Nodes   []nodeOut `json:"nodes"`
	Answers []answer  `json:"answers"`
}

// hardwareLinks is how many NVLinks every simulated GPU has in hardware (H100: 18); links past
// the active ones read FEATURE_DISABLED, past this INVALID_ARGUMENT, as on a real driver.
const hardwareLinks = 18

func pciInfo(busID string) nvml.PciInfo {
	var p nvml.PciInfo
	for i := 0; i < len(busID) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(busID[i])
	}
	return p
}

// mockNode builds the NVML a driver would show for one node.
func mockNode(spec nodeSpec) (*mock.Interface, error) {
	n := len(spec.GPUs)
	if len(spec.Ancestor) != n {
		return nil, fmt.Errorf("node %q: ancestor has %d rows for %d GPUs", spec.Name, len(spec.Ancestor), n)
	}
	devices := make([]*mock.Device, n)
	for i := range spec.GPUs {
		i, gpu := i, spec.GPUs[i]
		d := &mock.Device{}
		d.GetIndexFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
		d.GetNameFunc = func() (string, nvml.Return) { return "NVIDIA Simulated GPU", nvml.SUCCESS }
		d.GetUUIDFunc = func() (string, nvml.Return) { return fmt.Sprintf("GPU-%s-%d", spec.Name, i), nvml.SUCCESS }
		d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return pciInfo(gpu.BusID), nvml.SUCCESS }
		d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
			j, ret := other.GetIndex()
			if ret != nvml.SUCCESS || j < 0 || j >= n {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.GpuTopologyLevel(spec.Ancestor[i][j]), nvml.SUCCESS
		}
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			switch {
			case len(gpu.NvLinks) == 0:
				return 0, nvml.ERROR_NOT_SUPPORTED
			case link < len(gpu.NvLinks):
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			case link < hardwareLinks:
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			if link < 0 || link >= len(gpu.NvLinks) {
				return nvml.PciInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return pciInfo(gpu.NvLinks[link]), nvml.SUCCESS
		}
		devices[i] = d
	}
	lib := &mock.Interface{}
	lib.InitFunc = func() nvml.Return { return nvml.SUCCESS }
	lib.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { return n, nvml.SUCCESS }
	lib.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= n {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return devices[i], nvml.SUCCESS
	}
	return lib, nil
}

// tableDevices builds the Devices go-gpuallocator's discovery would have built for `p2p`. The link
// type is a type of go-gpuallocator's internal package, which no other module can name, so it is
// set through reflection.
func tableDevices(spec nodeSpec) (gpuallocator.DeviceList, error) {
	n := len(spec.P2P)
	devices := make(gpuallocator.DeviceList, n)
	for i := range devices {
		d := &gpuallocator.Device{Index: i, Links: map[int][]gpuallocator.P2PLink{}}
		d.UUID = fmt.Sprintf("GPU-%s-%d", spec.Name, i)
		devices[i] = d
	}
	for i, row := range spec.P2P {
		if len(row) != n {
			return nil, fmt.Errorf("node %q: p2p row %d has %d entries for %d GPUs", spec.Name, i, len(row), n)
		}
		for j, types := range row {
			for _, t := range types {
				link := gpuallocator.P2PLink{GPU: devices[j]}
				reflect.ValueOf(&link.Type).Elem().SetUint(uint64(t))
				devices[i].Links[j] = append(devices[i].Links[j], link)
			}
		}
	}
	return devices, nil
}

// discover answers a node's devices: NVIDIA's discovery over the NVML mock, or the p2p table.
func discover(spec nodeSpec) (gpuallocator.DeviceList, error) {
	if spec.P2P != nil {
		return tableDevices(spec)
	}
	lib, err := mockNode(spec)
	if err != nil {
		return nil, err
	}
	devices, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(lib))
	if err != nil {
		return nil, fmt.Errorf("node %q: go-gpuallocator's discovery failed: %v", spec.Name, err)
	}
	return devices, nil
}

func pick(devices gpuallocator.DeviceList, idx []int) ([]*gpuallocator.Device, error) {
	out := make([]*gpuallocator.Device, 0, len(idx))
	for _, i := range idx {
		if i < 0 || i >= len(devices) {
			return nil, fmt.Errorf("GPU %d is not on the node (%d GPUs)", i, len(devices))
		}
		out = append(out, devices[i])
	}
	return out, nil
}

func run(in input) (output, error) {
	repeats := max(in.Repeats, 1)
	out := output{Nodes: []nodeOut{}, Answers: []answer{}}
	nodes := make([]gpuallocator.DeviceList, len(in.Nodes))
	for k, spec := range in.Nodes {
		devices, err := discover(spec)
		if err != nil {
			return out, err
		}
		nodes[k] = devices
		links := make([][][]uint, len(devices))
		for i, d := range devices {
			links[i] = make([][]uint, len(devices))
			for j := range devices {
				links[i][j] = []uint{}
				for _, l := range d.Links[j] {
					links[i][j] = append(links[i][j], uint(l.Type))
				}
			}
		}
		out.Nodes = append(out.Nodes, nodeOut{Name: spec.Name, Links: links})
	}
	policy := gpuallocator.NewBestEffortPolicy()
	for r, req := range in.Requests {
		if req.Node < 0 || req.Node >= len(nodes) {
			return out, fmt.Errorf("request %d: no node %d", r, req.Node)
		}
		available, err := pick(nodes[req.Node], req.Available)
		if err != nil {
			return out, fmt.Errorf("request %d: available: %v", r, err)
		}
		required, err := pick(nodes[req.Node], req.Required)
		if err != nil {
			return out, fmt.Errorf("request %d: required: %v", r, err)
		}
		var chosen []*gpuallocator.Device
		best := int64(-1)
		for t := 0; t < repeats; t++ {
			start := time.Now()
			chosen = policy.Allocate(available, required, req.Size)
			if ns := time.Since(start).Nanoseconds(); best < 0 || ns < best {
				best = ns
			}
		}
		a := answer{Chosen: []int{}, Ns: best}
		for _, d := range chosen {
			if d == nil {
				a.Chosen = append(a.Chosen, -1)
			} else {
				a.Chosen = append(a.Chosen, d.Index)
			}
		}
		out.Answers = append(out.Answers, a)
	}
	return out, nil
}

func main() {
	var in input
	dec := json.NewDecoder(os.Stdin)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "gpuallocator-real: bad input on stdin: %v\n", err)
		os.Exit(2)
	}
	out, err := run(in)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuallocator-real: %v\n", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "gpuallocator-real: %v\n", err)
		os.Exit(1)
	}
}
