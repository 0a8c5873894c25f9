package main

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// kubeletDir is the kubelet's hard-coded directory (the device manager always uses
// /var/lib/kubelet/device-plugins, whatever --root-dir says: kubernetes #68567).
const kubeletDir = "/var/lib/kubelet"

// enterSandbox refuses to run unless this process is in a private mount namespace
// (not the one of PID 1), makes every mount private so nothing propagates back to
// the host, and bind-mounts workdir/var-lib-kubelet over /var/lib/kubelet. The real
// node's directory is never written: it is only hidden, inside this namespace.
func enterSandbox(workdir string) (string, error) {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return "", fmt.Errorf("cannot read /proc/self/ns/mnt: %w", err)
	}
	// The namespace we must not be in: the parent's (the harness is always started
	// directly by `unshare`, so its parent is still in the original namespace) and
	// PID 1's where that is readable (it is not inside some VMs/containers).
	others := map[string]string{fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()): "the parent process's", "/proc/1/ns/mnt": "PID 1's"}
	checked := 0
	for path, what := range others {
		ns, err := os.Readlink(path)
		if err != nil {
			continue
		}
		checked++
		if ns == self {
			return "", fmt.Errorf("refusing to run in %s mount namespace (%s): start me directly with `unshare --mount --propagation private`", what, self)
		}
	}
	if checked == 0 {
		return "", fmt.Errorf("cannot tell whether this is a private mount namespace (neither the parent's nor PID 1's namespace is readable)")
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return "", fmt.Errorf("making / private: %w", err)
	}
	root := filepath.Join(workdir, "var-lib-kubelet")
	if err := os.MkdirAll(root, 0o750); err != nil {
		return "", err
	}
	// The mount point itself: created empty if the host has no kubelet directory.
	if err := os.MkdirAll(kubeletDir, 0o750); err != nil {
		return "", err
	}
	if err := syscall.Mount(root, kubeletDir, "", syscall.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("bind-mounting %s over %s: %w", root, kubeletDir, err)
	}
	// Prove the mount took: a marker written through /var/lib/kubelet must appear in root.
	marker := filepath.Join(kubeletDir, ".topo-harness-sandbox")
	if err := os.WriteFile(marker, []byte(workdir), 0o644); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, ".topo-harness-sandbox")); err != nil {
		return "", fmt.Errorf("bind mount over %s did not take: %w", kubeletDir, err)
	}
	return root, nil
}
