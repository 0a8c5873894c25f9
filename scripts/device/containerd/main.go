// containerd v2.1.4 and its client ctr in one binary, for scripts/device/real_gpu_check.sh: the GPU
// machine has no containerd, and the device tool's transfer is limited to 64 MiB, where the daemon
// and ctr built apart take about 35 MiB compressed and together about 24. Called as `ctr` (a link
// bundle.py makes) it is ctr (to import the pod images), otherwise the daemon with its built-in
// plugins (CRI with CDI), as tests/e2e/dra/containerd builds it. The runc shim stays a program of
// its own (tests/e2e/dra/containerd-shim): it must not register the daemon's plugins.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/cmd/containerd/command"
	"github.com/containerd/containerd/v2/cmd/ctr/app"

	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
)

func main() {
	if filepath.Base(os.Args[0]) == "ctr" {
		if err := app.New().Run(os.Args); err != nil {
			fmt.Fprintf(os.Stderr, "ctr: %s\n", err)
			os.Exit(1)
		}
		return
	}
	if err := command.App().Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "containerd: %s\n", err)
		os.Exit(1)
	}
}
