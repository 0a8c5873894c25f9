// containerd v2 for the DRA e2e: the CRI plugin of containerd 2.x injects the CDI devices the
// kubelet names in the CRI request (Debian's containerd 1.6.20 has no CDI support).
//
// This is containerd's own daemon entry point (command.App with the built-in plugins), built
// from the pinned Go module by scripts/go_build_cached.sh and cached by this directory's
// hash; ../containerd-shim is its runc shim (a separate program: the shim must not register
// the daemon's plugins). v2.2.9 (go.mod): the first release line with the fix for containerd
// issue 13355 (2.2.6: a RunPodSandbox that an NRI plugin fails stops its pause container; 2.1.4,
// used before, left it running). It runs containerd/nri v0.11.0; the Go module proxy serves it.
package main

import (
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/cmd/containerd/command"

	// Every built-in plugin of the daemon (CRI with CDI, overlayfs, the runc v2 runtime...).
	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
)

func main() {
	if err := command.App().Run(os.Args); err != nil {
		fmt.Fprintf(os.Stderr, "containerd: %s\n", err)
		os.Exit(1)
	}
}
