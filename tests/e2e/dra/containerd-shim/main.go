// containerd-shim-runc-v2 of the same containerd release as ../containerd (v2.2.9): Debian's
// 1.6 shim speaks an older task API and outlives its pods under a 2.x daemon. containerd's
// own shim entry point (shim.Run with the runc task service), built by
// scripts/go_build_cached.sh and cached by this directory's hash.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	"github.com/containerd/containerd/v2/pkg/shim"

	// The runc shim's task service.
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task/plugin"
)

func main() {
	shim.Run(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
}
