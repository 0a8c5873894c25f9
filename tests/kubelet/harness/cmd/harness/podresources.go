package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// podResources queries the kubelet's pod-resources API (List and
// GetAllocatableResources) on socket and returns them as JSON-able data:
// devices per resource with their NUMA nodes.
func podResources(socket string) ([]byte, error) {
	conn, err := dialUnix(socket)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	cli := podresourcesapi.NewPodResourcesListerClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := cli.List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("List: %w", err)
	}
	alloc, err := cli.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetAllocatableResources: %w", err)
	}
	devs := func(in []*podresourcesapi.ContainerDevices) map[string]map[string][]int {
		out := map[string]map[string][]int{}
		for _, d := range in {
			if out[d.ResourceName] == nil {
				out[d.ResourceName] = map[string][]int{}
			}
			var numa []int
			if d.Topology != nil {
				for _, n := range d.Topology.Nodes {
					numa = append(numa, int(n.ID))
				}
			}
			for _, id := range d.DeviceIds {
				out[d.ResourceName][id] = append(out[d.ResourceName][id], numa...)
				sort.Ints(out[d.ResourceName][id])
			}
		}
		return out
	}
	var pods []map[string]any
	for _, p := range list.PodResources {
		var cs []map[string]any
		for _, c := range p.Containers {
			cs = append(cs, map[string]any{"name": c.Name, "devices": devs(c.Devices)})
		}
		pods = append(pods, map[string]any{"name": p.Name, "namespace": p.Namespace, "containers": cs})
	}
	return json.MarshalIndent(map[string]any{"pods": pods, "allocatable": devs(alloc.Devices)}, "", " ")
}
