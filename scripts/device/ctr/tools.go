//go:build tools

// ctr, containerd v2.1.4's client, for scripts/device/real_gpu_check.sh: it imports the pod images
// into the containerd the script brings (the GPU machine has no containerd of its own). Built by
// scripts/go_build_cached.sh with PACKAGE github.com/containerd/containerd/v2/cmd/ctr; this file
// only makes `go mod tidy` record its dependencies in go.sum.
package tools

import _ "github.com/containerd/containerd/v2/cmd/ctr"
