// The topology-aware scheduler of the e2e harness and of benchmarks/nrt_scale_bench.py:
// kube-scheduler with kubernetes-sigs/scheduler-plugins' NodeResourceTopologyMatch plugin.
//
// Only that plugin is registered (the upstream cmd/scheduler also links coscheduling, trimaran,
// sysched and others, whose dependencies we do not need): the scheduler is the same
// kube-scheduler command, and the plugin is upstream's, at the version go.mod pins.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	// Registers the plugin's args types (NodeResourceTopologyMatchArgs) with the config decoder.
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme"
	"sigs.k8s.io/scheduler-plugins/pkg/noderesourcetopology"
)

func main() {
	cmd := app.NewSchedulerCommand(app.WithPlugin(noderesourcetopology.Name, noderesourcetopology.New))
	os.Exit(cli.Run(cmd))
}
