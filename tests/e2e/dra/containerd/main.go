// containerd v2 for the DRA e2e: the CRI plugin of containerd 2.x injects the CDI devices the
// kubelet names in the CRI request (Debian's containerd 1.6.20 has no CDI support).
//
// This is containerd's own daemon entry point (command.App with the built-in plugins), built
// from the pinned Go module by scripts/go_build_cached.sh and cached by this directory's
// hash; ../containerd-shim is its runc shim (a separate program: the shim must not register
// the daemon's plugins). The Go module proxy serves v2.1.4; see go.mod.
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
