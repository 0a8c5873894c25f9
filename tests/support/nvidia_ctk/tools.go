//go:build tools

// NVIDIA's container toolkit for the tests (tests/toolkit, the DRA and device-plugin cluster
// e2e, scripts/device): `nvidia-ctk` (cdi generate) and `nvidia-cdi-hook` (the hooks its CDI
// specs name), built from the pinned module by build.sh through scripts/go_build_cached.sh.
// This file only makes `go mod tidy` record both programs' dependencies in go.sum. The module
// proxy serves v1.20.0-v1.20.2 of the toolkit (v1.20.3 and later are refused).
package tools

import (
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk"
)
